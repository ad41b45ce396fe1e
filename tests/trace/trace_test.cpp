// Trace records and digests (docs/trace.md): the fields of a record, digest-v1
// against an independent transcription of its definition, digests that do not depend
// on thread count, strides or batch position, whole records from concurrent calls and
// forked processes, write errors that are reported and leave no part of a record, and
// paths that are refused.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kernel_align/contract/version.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/fingerprints.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/registry.hpp"
#include "kernel_align/trace.hpp"
#include "kernel_align/version.hpp"
#include "support/op_cases.hpp"
#include "support/runtime_guard.hpp"
#include "support/tensors.hpp"
#include "trace/digest.hpp"

namespace kernel_align {
namespace {

using test::HostTensor;

// digest-v1 exactly as docs/trace.md writes it, over a byte string.
std::uint64_t documented_digest(const std::vector<unsigned char>& bytes) {
  std::uint64_t h = 0x9E3779B97F4A7C15ull ^ bytes.size();
  for (std::size_t i = 0; i < bytes.size(); i += 8) {
    std::uint64_t w = 0;
    for (std::size_t j = 0; j < 8 && i + j < bytes.size(); ++j) {
      w |= static_cast<std::uint64_t>(bytes[i + j]) << (8 * j);
    }
    h = std::rotl(h ^ (w * 0xBF58476D1CE4E5B9ull), 27) * 0x94D049BB133111EBull;
  }
  h ^= h >> 31;
  h *= 0xD6E8FEDA2F3F19D5ull;
  h ^= h >> 29;
  return h;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The JSON text of `key` in a flat record ("\"key\":" up to the next top-level comma).
std::string value_of(const std::string& record, const std::string& key) {
  const std::string tag = "\"" + key + "\":";
  const std::size_t at = record.find(tag);
  if (at == std::string::npos) return "<missing>";
  std::size_t end = at + tag.size();
  int depth = 0;
  bool in_string = false;
  for (; end < record.size(); ++end) {
    const char c = record[end];
    if (in_string) {
      if (c == '\\') ++end;
      if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      ++depth;
    } else if (c == ']' || c == '}') {
      if (depth-- == 0) break;
    } else if (c == ',' && depth == 0) {
      break;
    }
  }
  return record.substr(at + tag.size(), end - at - tag.size());
}

class TraceFile : public ::testing::Test {
 protected:
  // One file per test: ctest runs the tests of this binary in parallel processes.
  std::string path = testing::TempDir() + "trace_test_" +
                     ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".jsonl";
  test::RuntimeGuard runtime;
  void SetUp() override {
    std::remove(path.c_str());  // traces are appended to: start each test afresh
    set_trace_path(path);
  }
  void TearDown() override { set_trace_path(""); }
  std::vector<std::string> records() {
    set_trace_path("");  // closes the file: every record is on disk
    return read_lines(path);
  }
};

TEST(Digest, IsTheDocumentedFunction) {
  for (const std::size_t n : {0u, 1u, 7u, 8u, 9u, 64u, 1001u}) {
    std::vector<unsigned char> bytes(n);
    for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<unsigned char>(i * 37 + 11);
    trace::Digest piecewise(n);
    // Fed in uneven pieces: the result must not depend on them.
    std::size_t done = 0;
    for (std::size_t piece = 1; done < n; piece = piece * 2 + 1) {
      const std::size_t take = std::min(piece, n - done);
      piecewise.update(bytes.data() + done, take);
      done += take;
    }
    EXPECT_EQ(piecewise.finish(), documented_digest(bytes)) << n << " bytes";
  }
}

TEST(Digest, FollowsLogicalOrderNotMemoryOrder) {
  test::Rng rng(1);
  const HostTensor t = test::random_tensor(DType::BF16, {3, 4, 2, 8}, rng);
  // The same values through a transposed buffer: [3, 2, 4, 8] memory viewed as [3, 4, 2, 8].
  HostTensor transposed(DType::BF16, {3, 2, 4, 8});
  const TensorView as_logical =
      test::strided(transposed.view(), {3, 4, 2, 8}, {2 * 4 * 8, 8, 4 * 8, 1});
  test::copy_into(t.cview(), as_logical);
  EXPECT_EQ(trace::batch_digests(as_logical), trace::batch_digests(t.cview()));
  // One changed element changes exactly its batch element's digest.
  HostTensor changed = t;
  changed.set(64 + 5, changed.get(64 + 5) + 1.0);  // an element of batch element 1
  const std::vector<std::uint64_t> a = trace::batch_digests(t.cview());
  const std::vector<std::uint64_t> b = trace::batch_digests(changed.cview());
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_NE(a[1], b[1]);
  EXPECT_EQ(a[2], b[2]);
}

// digests_along (any rank, any element size, any batch dim) against the documented
// function over the bytes of each slice, gathered here in row-major order.
TEST(Digest, AlongAnyDimOfAnyRank) {
  // A 5-D array of 2-byte elements, viewed with its dims 1 and 3 swapped.
  const std::vector<std::int64_t> memory_shape{2, 3, 4, 5, 6};
  std::vector<std::uint16_t> data(2 * 3 * 4 * 5 * 6);
  for (std::size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<std::uint16_t>(i * 2654435761u);
  const std::vector<std::int64_t> memory_strides{360, 120, 30, 6, 1};
  const std::vector<std::int64_t> shape{2, 5, 4, 3, 6};  // logical view
  const std::vector<std::int64_t> strides{360, 6, 30, 120, 1};
  const StridedBytes array{data.data(), 2, shape, strides};
  for (std::size_t dim = 0; dim < shape.size(); ++dim) {
    std::vector<std::vector<unsigned char>> slices(static_cast<std::size_t>(shape[dim]));
    std::int64_t index[5] = {};
    for (std::size_t n = 0; n < data.size(); ++n) {
      std::int64_t offset = 0;
      for (int d = 0; d < 5; ++d) offset += index[d] * strides[d];
      const std::uint16_t v = data[static_cast<std::size_t>(offset)];
      auto& slice = slices[static_cast<std::size_t>(index[dim])];
      slice.push_back(static_cast<unsigned char>(v & 0xff));
      slice.push_back(static_cast<unsigned char>(v >> 8));
      for (int d = 4; d >= 0 && ++index[d] == shape[d]; --d) index[d] = 0;
    }
    std::vector<std::uint64_t> expected;
    for (const auto& slice : slices) expected.push_back(documented_digest(slice));
    EXPECT_EQ(digests_along(array, dim), expected) << "batch_dim " << dim;
  }
  // The whole array; and the contiguous memory it views holds other bytes in that order.
  const StridedBytes memory{data.data(), 2, memory_shape, memory_strides};
  std::vector<unsigned char> bytes(data.size() * 2);
  std::memcpy(bytes.data(), data.data(), bytes.size());
  EXPECT_EQ(digests_along(memory, std::nullopt), std::vector{documented_digest(bytes)});
  EXPECT_NE(digests_along(memory, std::nullopt), digests_along(array, std::nullopt));
  // A 4-D view digested along dim 0 is what the library's own records hold.
  test::Rng rng(5);
  const HostTensor t = test::random_tensor(DType::BF16, {3, 4, 2, 8}, rng);
  const ConstTensorView v = t.cview();
  const StridedBytes same{v.data, 2, std::span(v.shape.data(), 4), std::span(v.strides.data(), 4)};
  EXPECT_EQ(digests_along(same, 0), trace::batch_digests(v));
}

TEST(Digest, AlongRejectsBadArguments) {
  const std::vector<std::int64_t> shape{2, 3};
  const std::vector<std::int64_t> strides{3, 1};
  const float data[6] = {};
  try {
    digests_along({data, 4, shape, strides}, 2);
    ADD_FAILURE() << "batch_dim 2 of a 2-D array was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "batch_dim");
    EXPECT_EQ(e.expected(), "a dim below the rank 2");
    EXPECT_EQ(e.found(), "2");
  }
  const std::vector<std::int64_t> one_stride{1};
  EXPECT_THROW(digests_along({data, 4, shape, one_stride}, 0), Error);
}

TEST_F(TraceFile, AppendedRecordsShareTheLibrarysSequence) {
  test::Rng rng(3);
  const HostTensor x = test::random_tensor(DType::F32, {1, 6, 2, 16}, rng);
  HostTensor y(DType::F32, {1, 6, 2, 16});
  EXPECT_TRUE(append_trace_record(R"(,"kind":"module","op":"a")"));
  qk_rmsnorm_forward(x.cview(), std::nullopt, y.view());
  EXPECT_TRUE(append_trace_record(R"(,"kind":"module","op":"b")"));
  for (const std::string bad : {R"("kind":"module")", ",\"op\":\"a\"\n,\"op\":\"b\""}) {
    try {
      append_trace_record(bad);
      ADD_FAILURE() << "appended " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "members");
    }
  }
  const std::vector<std::string> lines = records();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(value_of(lines[0], "seq"), "0");
  EXPECT_EQ(value_of(lines[0], "op"), "\"a\"");
  EXPECT_EQ(value_of(lines[1], "seq"), "1");
  EXPECT_EQ(value_of(lines[1], "op"), "\"qk_rmsnorm\"");
  EXPECT_EQ(value_of(lines[2], "seq"), "2");
  EXPECT_EQ(lines[2].substr(lines[2].find(",\"kind\"")), R"(,"kind":"module","op":"b"})");
  EXPECT_EQ(value_of(lines[0], "session"), value_of(lines[2], "session"));
  // No trace open: nothing written.
  EXPECT_FALSE(append_trace_record(R"(,"op":"c")"));
}

TEST_F(TraceFile, RecordHasTheDocumentedFields) {
  set_backend("simd");
  set_num_threads(2);
  test::Rng rng(2);
  constexpr std::int64_t kB = 2, kS = 40, kH = 4, kD = 64, kText = 8;
  const HostTensor q = test::random_tensor(DType::BF16, {kB, kS, kH, kD}, rng);
  const HostTensor k = test::random_tensor(DType::BF16, {kB, kS, kH, kD}, rng);
  const HostTensor w = test::random_weight(DType::BF16, kD, rng);
  const test::TablePair t = test::random_tables(kS, kD, rng);
  HostTensor q_out(DType::BF16, {kB, kS, kH, kD});
  HostTensor k_out(DType::BF16, {kB, kS, kH, kD});
  QkNormRopeOptions options;
  options.text_len = kText;
  qk_norm_rope_forward(q.cview(), k.cview(), {w.cview(), w.cview(), w.cview(), w.cview()},
                       t.cos.cview(), t.sin.cview(), q_out.view(), k_out.view(), options);
  const std::vector<std::string> lines = records();
  ASSERT_EQ(lines.size(), 1u);
  const std::string& r = lines[0];
  EXPECT_EQ(r.rfind("{\"seq\":0,", 0), 0u) << r;
  EXPECT_EQ(value_of(r, "contract"), std::string("\"") + contract::kVersionString + "\"");
  EXPECT_EQ(value_of(r, "library"), "\"" KERNEL_ALIGN_VERSION_STRING "\"");
  EXPECT_EQ(value_of(r, "op"), "\"qk_norm_rope\"");
  EXPECT_EQ(value_of(r, "direction"), "\"forward\"");
  EXPECT_EQ(value_of(r, "platform"), "\"cpu\"");
  EXPECT_EQ(value_of(r, "requested_backend"), "\"simd\"");
  EXPECT_EQ(value_of(r, "backend"), "\"simd\"");
  EXPECT_EQ(value_of(r, "isa"), std::string("\"") + isa_name(isa()) + "\"");
  EXPECT_EQ(value_of(r, "fallback"), "null");
  EXPECT_EQ(value_of(r, "fingerprint"), std::string("\"") + fingerprints::kSimd + "\"");
  EXPECT_NE(value_of(r, "tensors")
                .find("{\"name\":\"q\",\"dtype\":\"bf16\",\"shape\":[2,40,4,64],\"strides\":["
                      "10240,256,64,1]}"),
            std::string::npos)
      << r;
  EXPECT_EQ(value_of(r, "layout"), "\"bshd\"");
  EXPECT_EQ(value_of(r, "pairing"), "\"interleaved\"");
  EXPECT_EQ(value_of(r, "mode"), "\"diffusers\"");
  EXPECT_EQ(value_of(r, "eps"), "9.99999997e-07");
  EXPECT_EQ(value_of(r, "text_len"), "8");
  EXPECT_EQ(value_of(r, "accumulator"), "\"fp32\"");
  EXPECT_EQ(value_of(r, "output_dtype"), "\"bf16\"");
  EXPECT_EQ(value_of(r, "reduction_tree"), "\"tree16-v1\"");
  // The forward computes no weight gradient: no dw blocks.
  EXPECT_EQ(value_of(r, "dw_block_rows"), "<missing>");
  EXPECT_EQ(value_of(r, "fma_contraction"), "false");
  EXPECT_EQ(value_of(r, "ftz"), "false");
  EXPECT_EQ(value_of(r, "daz"), "false");
  // Four passes (q text, q image, k text, k image) of b * s * h rows each; too few
  // elements for a second thread (cpu_backend.cpp, kMinElementsPerThread), so one thread
  // ran the call although two were allowed, and the record says so.
  EXPECT_EQ(value_of(r, "partition"), "[[[0,64]],[[0,256]],[[0,64]],[[0,256]]]");
  EXPECT_EQ(value_of(r, "threads"), "1");
  // One digest per batch element of each output, equal to the digest of its bytes.
  const std::vector<std::uint64_t> q_digests = trace::batch_digests(q_out.cview());
  char expected[64];
  std::snprintf(expected, sizeof expected, "[\"%016llx\",\"%016llx\"]",
                static_cast<unsigned long long>(q_digests[0]),
                static_cast<unsigned long long>(q_digests[1]));
  EXPECT_NE(value_of(r, "digests").find(std::string("\"q_out\":") + expected), std::string::npos)
      << r;
  EXPECT_NE(value_of(r, "digests").find("\"k_out\":["), std::string::npos) << r;
}

TEST_F(TraceFile, BackwardRecordsDwAndItsBlocks) {
  test::Rng rng(4);
  const HostTensor x = test::random_tensor(DType::F32, {600, 32}, rng);
  const HostTensor dy = test::random_tensor(DType::F32, {600, 32}, rng);
  const HostTensor w = test::random_weight(DType::F32, 32, rng);
  HostTensor dx(DType::F32, {600, 32});
  HostTensor dw(DType::F32, {32});
  qk_rmsnorm_backward(x.cview(), dy.cview(), w.cview(), dx.view(), dw.view());
  const std::vector<std::string> lines = records();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(value_of(lines[0], "dw_block_rows"), "256");
  // The dw blocks of 256 rows, the last one shorter, whatever the thread count.
  EXPECT_EQ(value_of(lines[0], "partition"), "[[[0,256],[256,512],[512,600]]]");
  EXPECT_EQ(value_of(lines[0], "mode"), "\"single\"");
  // Only the op's own options: qk_rmsnorm has no layout.
  EXPECT_EQ(value_of(lines[0], "layout"), "<missing>");
  const std::string digests = value_of(lines[0], "digests");
  EXPECT_NE(digests.find("\"dx\":[\""), std::string::npos) << digests;
  EXPECT_NE(digests.find("\"dw\":[\""), std::string::npos) << digests;
}

// The same call on 1 and 2 threads: the partitions differ, the digests do not.
TEST_F(TraceFile, DigestsDoNotDependOnThreadCount) {
  test::Rng rng(6);
  const HostTensor x = test::random_tensor(DType::BF16, {2, 300, 8, 128}, rng);
  const test::TablePair t = test::random_tables(300, 128, rng);
  for (const int threads : {1, 2}) {
    set_num_threads(threads);
    HostTensor y(DType::BF16, {2, 300, 8, 128});
    multi_axis_rope_forward(x.cview(), t.cos.cview(), t.sin.cview(), y.view(), {});
  }
  const std::vector<std::string> lines = records();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(value_of(lines[0], "digests"), value_of(lines[1], "digests"));
  EXPECT_EQ(value_of(lines[0], "threads"), "1");
  EXPECT_EQ(value_of(lines[1], "threads"), "2");
  EXPECT_NE(value_of(lines[0], "partition"), value_of(lines[1], "partition"));
}

// A sample alone and as element 1 of a batch of 3: the same per-element digest.
TEST_F(TraceFile, SampleDigestIsTheSameAloneAndInABatch) {
  test::Rng rng(8);
  constexpr std::int64_t kS = 20, kH = 3, kD = 32;
  const HostTensor batch = test::random_tensor(DType::F16, {3, kS, kH, kD}, rng);
  HostTensor alone(DType::F16, {1, kS, kH, kD});
  test::copy_into(narrow(batch.cview(), 0, 1, 2), alone.view());
  HostTensor y_alone(DType::F16, {1, kS, kH, kD});
  HostTensor y_batch(DType::F16, {3, kS, kH, kD});
  qk_rmsnorm_forward(alone.cview(), std::nullopt, y_alone.view());
  qk_rmsnorm_forward(batch.cview(), std::nullopt, y_batch.view());
  const std::vector<std::uint64_t> one = trace::batch_digests(y_alone.cview());
  const std::vector<std::uint64_t> three = trace::batch_digests(y_batch.cview());
  ASSERT_EQ(one.size(), 1u);
  ASSERT_EQ(three.size(), 3u);
  EXPECT_EQ(one[0], three[1]);
  EXPECT_NE(one[0], three[0]);
  EXPECT_EQ(records().size(), 2u);
}

// 8 threads x 25 calls: 200 whole records, seq 0..199 each once.
TEST_F(TraceFile, ConcurrentCallsWriteWholeRecords) {
  constexpr int kThreads = 8, kCalls = 25;
  std::vector<std::thread> workers;
  for (int t = 0; t < kThreads; ++t) {
    workers.emplace_back([t] {
      test::Rng rng(100 + static_cast<std::uint64_t>(t));
      const HostTensor x = test::random_tensor(DType::F32, {1, 6, 2, 16}, rng);
      HostTensor y(DType::F32, {1, 6, 2, 16});
      for (int c = 0; c < kCalls; ++c) qk_rmsnorm_forward(x.cview(), std::nullopt, y.view());
    });
  }
  for (std::thread& w : workers) w.join();
  const std::vector<std::string> lines = records();
  ASSERT_EQ(lines.size(), static_cast<std::size_t>(kThreads * kCalls));
  std::set<std::string> seqs;
  for (const std::string& line : lines) {
    EXPECT_EQ(line.front(), '{');
    EXPECT_EQ(line.back(), '}');
    EXPECT_EQ(value_of(line, "op"), "\"qk_rmsnorm\"") << line;
    EXPECT_NE(value_of(line, "digests"), "<missing>") << line;
    seqs.insert(value_of(line, "seq"));
  }
  EXPECT_EQ(seqs.size(), lines.size());
  EXPECT_TRUE(seqs.contains("0") && seqs.contains("199"));
}

// A forked child (a DataLoader worker, say) numbers its records in a session of its own,
// from 0: sharing its parent's session and seq counter, each child wrote the parent's
// next seq, and trace diff refused the file.
TEST_F(TraceFile, ForkedChildrenWriteSessionsOfTheirOwn) {
  test::Rng rng(12);
  const HostTensor x = test::random_tensor(DType::F32, {1, 6, 2, 16}, rng);
  HostTensor y(DType::F32, {1, 6, 2, 16});
  qk_rmsnorm_forward(x.cview(), std::nullopt, y.view());
  std::vector<pid_t> children;
  for (int c = 0; c < 2; ++c) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      try {
        qk_rmsnorm_forward(x.cview(), std::nullopt, y.view());
      } catch (...) {
        std::_Exit(1);
      }
      std::_Exit(0);
    }
    children.push_back(pid);
  }
  for (const pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  qk_rmsnorm_forward(x.cview(), std::nullopt, y.view());
  const std::vector<std::string> lines = records();
  ASSERT_EQ(lines.size(), 4u);
  const std::string parent = std::to_string(::getpid());
  std::vector<std::string> parent_seqs;
  std::set<std::string> parent_sessions;
  std::set<std::string> child_sessions;
  std::set<std::string> child_pids;
  for (const std::string& line : lines) {
    if (value_of(line, "pid") == parent) {
      parent_seqs.push_back(value_of(line, "seq"));
      parent_sessions.insert(value_of(line, "session"));
    } else {
      EXPECT_EQ(value_of(line, "seq"), "0") << line;
      child_sessions.insert(value_of(line, "session"));
      child_pids.insert(value_of(line, "pid"));
    }
  }
  EXPECT_EQ(parent_seqs, (std::vector<std::string>{"0", "1"}));
  EXPECT_EQ(parent_sessions.size(), 1u);
  EXPECT_EQ(child_pids.size(), 2u);
  EXPECT_EQ(child_sessions.size(), 2u);
  EXPECT_FALSE(child_sessions.contains(*parent_sessions.begin()));
}

// fork() while another thread is in the middle of a record (here blocked on a full FIFO)
// waits for that record: a child that inherited the trace's lock held would wait forever
// at its first record, as no thread of its own holds it.
TEST(TraceFork, AForkDuringARecordLeavesTheChildAbleToTrace) {
  const std::string fifo = testing::TempDir() + "trace_test_fork.fifo";
  std::remove(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  set_trace_path(fifo);
  // 1 MiB: more than the pipe holds, so the writer blocks inside its write, under the lock.
  std::thread writer([] { append_trace_record(",\"op\":\"" + std::string(1 << 20, 'a') + "\""); });
  pollfd ready{reader, POLLIN, 0};
  ASSERT_EQ(::poll(&ready, 1, 10000), 1);  // the writer's write has begun
  std::thread drainer([reader] {
    // Long enough for fork() to be called while the write is blocked.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    char buffer[65536];
    for (;;) {
      pollfd more{reader, POLLIN, 0};
      if (::poll(&more, 1, 2000) <= 0) return;  // the child's record too has been read
      if (::read(reader, buffer, sizeof buffer) <= 0) return;
    }
  });
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    try {
      std::_Exit(append_trace_record(R"(,"op":"child")") ? 0 : 1);
    } catch (...) {
      std::_Exit(2);
    }
  }
  int status = 0;
  pid_t waited = 0;
  for (int tries = 0; tries < 100 && waited == 0; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    waited = ::waitpid(pid, &status, WNOHANG);
  }
  if (waited == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  writer.join();
  drainer.join();
  set_trace_path("");
  ::close(reader);
  std::remove(fifo.c_str());
  ASSERT_EQ(waited, pid) << "the child did not finish its record within 10 s";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// A write that fails part-way (a full disk; here the file size limit) leaves no part of
// its record: the file is cut back to its size before the record, so the next record
// starts a line of its own and the trace stays readable.
TEST_F(TraceFile, ARecordCutShortIsTakenBack) {
  ASSERT_TRUE(append_trace_record(R"(,"op":"first")"));
  const std::uintmax_t before = std::filesystem::file_size(path);
  // At the limit the kernel sends SIGXFSZ, which would end the process: ignored, the
  // write fails with EFBIG instead.
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit old_limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  rlimit limit = old_limit;
  limit.rlim_cur = static_cast<rlim_t>(before + 20);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  std::string error;
  try {
    append_trace_record(R"(,"op":")" + std::string(200, 'x') + "\"");
  } catch (const Error& e) {
    error = e.argument() + ": " + e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(error.starts_with("trace: ")) << error;
  EXPECT_NE(error.find("write failed"), std::string::npos) << error;
  EXPECT_EQ(std::filesystem::file_size(path), before);
  ASSERT_TRUE(append_trace_record(R"(,"op":"third")"));
  const std::vector<std::string> lines = records();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(value_of(lines[0], "op"), "\"first\"");
  // The record that failed took no seq: the session's records stay numbered 0, 1, ...
  EXPECT_EQ(value_of(lines[1], "seq"), "1") << lines[1];
  EXPECT_EQ(value_of(lines[1], "op"), "\"third\"") << lines[1];
}

// A trace removed while open (to start afresh, as docs/trace.md advises) is created
// again by the next record, in a new session: the records do not go on into the
// unlinked file, where nothing could read them.
TEST_F(TraceFile, ARemovedTraceIsCreatedAgain) {
  ASSERT_TRUE(append_trace_record(R"(,"op":"a")"));
  const std::string first_session = value_of(read_lines(path).at(0), "session");
  ASSERT_EQ(std::remove(path.c_str()), 0);
  ASSERT_TRUE(append_trace_record(R"(,"op":"b")"));
  ASSERT_TRUE(append_trace_record(R"(,"op":"c")"));
  EXPECT_EQ(trace_path(), path);
  const std::vector<std::string> lines = records();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(value_of(lines[0], "seq"), "0");
  EXPECT_EQ(value_of(lines[0], "op"), "\"b\"");
  EXPECT_EQ(value_of(lines[1], "seq"), "1");
  EXPECT_EQ(value_of(lines[0], "session"), value_of(lines[1], "session"));
  EXPECT_NE(value_of(lines[0], "session"), first_session);
}

// A NUL ends the path the kernel sees: "/tmp/a\0/etc/x" would trace to /tmp/a while
// trace_path() said otherwise. Refused, and the trace open before stays open.
TEST_F(TraceFile, APathWithANulIsRefused) {
  const std::string cut = testing::TempDir() + "trace_test_nul";
  std::remove(cut.c_str());
  try {
    set_trace_path(cut + std::string(1, '\0') + "/evil.jsonl");
    ADD_FAILURE() << "a path with a NUL was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "path");
    EXPECT_NE(e.found().find("NUL"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(cut));
  EXPECT_EQ(trace_path(), path);
  EXPECT_TRUE(append_trace_record(R"(,"op":"a")"));
  EXPECT_EQ(records().size(), 1u);
}

TEST(TraceErrors, UnwritablePathIsAnError) {
  try {
    set_trace_path("/nonexistent-dir/trace.jsonl");
    ADD_FAILURE() << "opened a file in a missing directory";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "trace");
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/trace.jsonl"), std::string::npos);
  }
  EXPECT_EQ(trace_path(), "");
}

TEST(TraceErrors, FailedWriteIsReportedNotIgnored) {
  set_trace_path("/dev/full");  // opens; every write fails with ENOSPC
  test::Rng rng(10);
  const HostTensor x = test::random_tensor(DType::F32, {4, 16}, rng);
  HostTensor y(DType::F32, {4, 16});
  try {
    qk_rmsnorm_forward(x.cview(), std::nullopt, y.view());
    ADD_FAILURE() << "a failed trace write was ignored";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "trace");
    EXPECT_NE(std::string(e.what()).find("write failed"), std::string::npos) << e.what();
  }
  set_trace_path("");
}

}  // namespace
}  // namespace kernel_align
