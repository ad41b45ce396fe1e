#include "copy_baseline.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iterator>
#include <new>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#define KA_BENCH_HAVE_SSE2_STREAM 1
#endif

namespace kernel_align::bench {

namespace {
constexpr std::size_t kAlign = 64;
constexpr std::size_t kChunkAlign = 4096;

std::size_t round_up(std::size_t n, std::size_t a) {
  return (n + a - 1) / a * a;
}

// [begin, end) of part t of n of `bytes`, boundaries on kChunkAlign.
std::pair<std::size_t, std::size_t> part(std::size_t bytes, int t, int n) {
  const std::size_t pages = round_up(bytes, kChunkAlign) / kChunkAlign;
  const auto tt = static_cast<std::size_t>(t);
  const auto nn = static_cast<std::size_t>(n);
  const std::size_t b = std::min(bytes, pages * tt / nn * kChunkAlign);
  const std::size_t e = std::min(bytes, pages * (tt + 1) / nn * kChunkAlign);
  return {b, e};
}

void copy_nt(std::byte* dst, const std::byte* src, std::size_t n) {
#ifdef KA_BENCH_HAVE_SSE2_STREAM
  // dst and src are 64-byte aligned here (buffer starts, page-aligned part boundaries).
  const std::size_t body = n / 64 * 64;
  for (std::size_t i = 0; i < body; i += 64) {
    const auto* s = reinterpret_cast<const __m128i*>(src + i);
    auto* d = reinterpret_cast<__m128i*>(dst + i);
    const __m128i a = _mm_load_si128(s);
    const __m128i b = _mm_load_si128(s + 1);
    const __m128i c = _mm_load_si128(s + 2);
    const __m128i e = _mm_load_si128(s + 3);
    _mm_stream_si128(d, a);
    _mm_stream_si128(d + 1, b);
    _mm_stream_si128(d + 2, c);
    _mm_stream_si128(d + 3, e);
  }
  _mm_sfence();
  std::memcpy(dst + body, src + body, n - body);
#else
  std::memcpy(dst, src, n);
#endif
}
}  // namespace

void Buffer::Free::operator()(std::byte* p) const {
  ::operator delete[](p, std::align_val_t{kAlign});
}

Buffer::Buffer(std::size_t bytes)
    : data_(static_cast<std::byte*>(::operator new[](
          round_up(std::max<std::size_t>(bytes, 1), kAlign), std::align_val_t{kAlign}))),
      size_(bytes) {
  std::memset(data_.get(), 0, round_up(std::max<std::size_t>(bytes, 1), kAlign));
}

CopyPool::CopyPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
}

CopyPool::~CopyPool() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  start_.notify_all();
  for (auto& w : workers_) w.join();
}

void CopyPool::run(const std::function<void(int, int)>& task) {
  const int n = threads();
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    task_ = &task;
    pending_ = n - 1;
    ++generation_;
  }
  start_.notify_all();
  task(0, n);
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [this] { return pending_ == 0; });
  task_ = nullptr;
}

void CopyPool::worker(int index) {
  std::uint64_t seen = 0;
  for (;;) {
    const std::function<void(int, int)>* task = nullptr;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      task = task_;
    }
    (*task)(index, threads());
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

const char* copy_kind_name(CopyKind k) {
  return k == CopyKind::Memcpy ? "memcpy" : "nt_copy";
}

CopyJob::CopyJob(std::size_t traffic_bytes)
    : src(round_up(traffic_bytes / 2, kAlign)), dst(round_up(traffic_bytes / 2, kAlign)) {
  // Distinct source bytes, so that no layer can short-cut a copy of zeros.
  auto* p = src.data();
  for (std::size_t i = 0; i < src.size(); i += 64) p[i] = static_cast<std::byte>(i >> 6);
}

void CopyJob::run(CopyPool& pool, CopyKind kind) {
  const std::size_t n = src.size();
  std::byte* d = dst.data();
  const std::byte* s = src.data();
  pool.run([&](int t, int threads) {
    const auto [b, e] = part(n, t, threads);
    if (e <= b) return;
    if (kind == CopyKind::Memcpy) {
      std::memcpy(d + b, s + b, e - b);
    } else {
      copy_nt(d + b, s + b, e - b);
    }
  });
}

CopyPool& copy_pool(int threads) {
  static std::map<int, std::unique_ptr<CopyPool>> pools;
  auto& p = pools[threads];
  if (!p) p = std::make_unique<CopyPool>(threads);
  return *p;
}

namespace {
double median_rate(CopyJob& job, CopyPool& pool, CopyKind kind) {
  using Clock = std::chrono::steady_clock;
  job.run(pool, kind);  // warm-up
  double seconds[kCopyRuns];
  for (double& s : seconds) {
    const auto t0 = Clock::now();
    job.run(pool, kind);
    s = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  std::sort(std::begin(seconds), std::end(seconds));
  // The traffic actually moved: both halves, after rounding.
  return static_cast<double>(job.src.size() + job.dst.size()) / seconds[kCopyRuns / 2];
}
}  // namespace

CopyRate copy_rate_now(std::size_t traffic_bytes, int threads) {
  static std::unique_ptr<CopyJob> job;
  static std::size_t job_traffic = 0;
  if (!job || job_traffic != traffic_bytes) {
    job.reset();  // the old buffers go before the new ones are faulted in
    job = std::make_unique<CopyJob>(traffic_bytes);
    job_traffic = traffic_bytes;
  }
  CopyPool& pool = copy_pool(threads);
  return {median_rate(*job, pool, CopyKind::Memcpy),
          median_rate(*job, pool, CopyKind::NonTemporal)};
}

}  // namespace kernel_align::bench
