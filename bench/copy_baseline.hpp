// The memory-copy baseline of the benchmarks: how fast this process, on this machine and
// with this many threads, moves a given number of bytes with memcpy (and with
// non-temporal stores). An op's `ratio_to_copy` is its speed over this baseline at the
// same byte count and thread count, measured right after the op's timed loop.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace kernel_align::bench {

// A 64-byte-aligned, zero-filled (and so already faulted-in) byte buffer.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(std::size_t bytes);
  std::byte* data() const { return data_.get(); }
  std::size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, Free> data_;
  std::size_t size_ = 0;
};

// A fixed set of threads that run one task together: thread t of n calls task(t, n).
// The calling thread is thread 0.
class CopyPool {
 public:
  explicit CopyPool(int threads);
  ~CopyPool();
  CopyPool(const CopyPool&) = delete;
  CopyPool& operator=(const CopyPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  void run(const std::function<void(int, int)>& task);

 private:
  void worker(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_;
  std::condition_variable done_;
  const std::function<void(int, int)>* task_ = nullptr;
  std::uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

enum class CopyKind : unsigned char { Memcpy, NonTemporal };
const char* copy_kind_name(CopyKind k);

// src and dst are each `bytes / 2` (rounded to 64): the copy reads and writes `bytes`
// in all, the same traffic as an op that reads and writes `bytes`.
struct CopyJob {
  Buffer src, dst;
  explicit CopyJob(std::size_t traffic_bytes);
  void run(CopyPool& pool, CopyKind kind);
};

struct CopyRate {
  double memcpy_bytes_per_second = 0;
  double nt_bytes_per_second = 0;
};

// The copy rates at (traffic bytes, threads) measured now: the median of kCopyRuns
// runs of each kind after a warm-up. A case calls it right after its own timed loop,
// so that its ratio compares two measurements taken within a second of each other: on
// shared machines the memcpy rate of one byte count moved by up to 2.4x between the
// start of a run and a case minutes later (docs/performance.md, 2026-12-04), which a
// baseline measured once per process turned into a ratio off by as much. The buffers
// of the last traffic size asked for are kept, so the cases of one op, dtype and shape
// (every path and thread count, run one after the other) allocate them once.
constexpr int kCopyRuns = 5;
CopyRate copy_rate_now(std::size_t traffic_bytes, int threads);

// The pool for `threads` threads, kept for the whole process.
CopyPool& copy_pool(int threads);

}  // namespace kernel_align::bench
