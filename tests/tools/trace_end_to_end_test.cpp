// Traces written by the real library and compared by `kernel-align trace diff` (the
// issue's acceptance): the main job on different backends and thread counts is
// "identical"; a sample alone and inside a batch has the same per-element digests;
// a run whose input differs in one element diverges at the call that reads it.
#include <cstdlib>
#include <string>
#include <vector>

#include "cli_harness.hpp"

namespace kernel_align::cli::test {
namespace {

// A small main job: 16 text + 16 x 16 image tokens, 4 heads.
const std::vector<std::string> kSmallRun = {
    "run", "--image", "256x256", "--text-len", "16", "--heads", "4", "--batch", "3", "--trace"};

std::vector<std::string> with(std::vector<std::string> args,
                              std::initializer_list<std::string> more) {
  args.insert(args.end(), more);
  return args;
}

class TraceEndToEnd : public CliTest {
 protected:
  // Runs the binary with KERNEL_ALIGN_TRACE=trace (inherited through fork).
  CliResult run_traced(const std::string& trace, const std::vector<std::string>& args) const {
    ::setenv("KERNEL_ALIGN_TRACE", (work() / trace).c_str(), 1);
    CliResult r = run(args);
    ::unsetenv("KERNEL_ALIGN_TRACE");
    return r;
  }

  // [batch, 8, 3, 32] fp32 values; element `changed` (if >= 0) is altered.
  NpyArray input(std::int64_t batch, std::int64_t changed = -1) const {
    NpyArray a = make_npy_array(NpyType::F32, {batch, 8, 3, 32});
    auto* values = reinterpret_cast<float*>(a.data.data());
    for (std::int64_t i = 0; i < a.numel(); ++i) {
      values[i] = static_cast<float>((i * 7919) % 1000) / 250.0f - 2.0f;
    }
    if (changed >= 0) values[changed] += 0.5f;
    return a;
  }
};

TEST_F(TraceEndToEnd, MainJobIsIdenticalAcrossBackendsAndThreadCounts) {
  const CliResult simd = run(with(kSmallRun, {"simd.jsonl", "--threads", "2"}));
  ASSERT_EQ(simd.status, 0) << simd.out << simd.err;
  EXPECT_NE(simd.out.find("ran on simd"), std::string::npos) << simd.out;
  const CliResult reference =
      run(with(kSmallRun, {"reference.jsonl", "--backend", "reference", "--threads", "1"}));
  ASSERT_EQ(reference.status, 0) << reference.out << reference.err;
  EXPECT_NE(reference.out.find("ran on reference"), std::string::npos) << reference.out;

  const CliResult diff = run({"trace", "diff", "simd.jsonl", "reference.jsonl"});
  EXPECT_EQ(diff.status, 0) << diff.out << diff.err;
  // 6 unfused calls (rmsnorm text and image, rope; for q and k), the fused call alone
  // and the fused call on the batch.
  EXPECT_EQ(diff.out.rfind("identical: 8 calls", 0), 0u) << diff.out;
}

TEST_F(TraceEndToEnd, SampleAloneAndInABatchHaveTheSameDigests) {
  write("alone.npy", input(1));
  NpyArray batch = input(3);
  // Element 1 of the batch is the lone sample; 0 and 2 are other data.
  const std::size_t sample_bytes = batch.data.size() / 3;
  for (std::size_t i = 0; i < sample_bytes; ++i) {
    batch.data[sample_bytes + i] = input(1).data[i];
    batch.data[i] = std::byte{0x3f};
  }
  write("batch.npy", batch);
  ASSERT_EQ(
      run_traced("a.jsonl", {"apply", "qk-rmsnorm", "--x", "alone.npy", "--out", "ya.npy"}).status,
      0);
  ASSERT_EQ(run_traced("b.jsonl", {"apply", "qk-rmsnorm", "--x", "batch.npy", "--out", "yb.npy",
                                   "--threads", "1"})
                .status,
            0);
  const CliResult same = run({"trace", "diff", "a.jsonl", "b.jsonl", "--sample", "0:1"});
  EXPECT_EQ(same.status, 0) << same.out << same.err;
  EXPECT_EQ(same.out.rfind("identical: 1 calls", 0), 0u) << same.out;
  const CliResult other = run({"trace", "diff", "a.jsonl", "b.jsonl", "--sample", "0:0"});
  EXPECT_EQ(other.status, 1) << other.out << other.err;
  EXPECT_NE(other.out.find("element 0 vs 0"), std::string::npos) << other.out;
}

TEST_F(TraceEndToEnd, OneChangedInputElementIsTheFirstDivergence) {
  write("x.npy", input(2));
  write("x_changed.npy", input(2, 5));  // an element of batch element 0
  ASSERT_EQ(run_traced("a.jsonl", {"apply", "qk-rmsnorm", "--x", "x.npy", "--out", "ya.npy",
                                   "--backend", "reference"})
                .status,
            0);
  ASSERT_EQ(
      run_traced("b.jsonl", {"apply", "qk-rmsnorm", "--x", "x_changed.npy", "--out", "yb.npy"})
          .status,
      0);
  const CliResult diff = run({"trace", "diff", "a.jsonl", "b.jsonl"});
  EXPECT_EQ(diff.status, 1) << diff.out << diff.err;
  EXPECT_EQ(diff.out.rfind("diverged at call #0", 0), 0u) << diff.out;
  EXPECT_NE(diff.out.find("output y element 0 vs 0"), std::string::npos) << diff.out;
  EXPECT_NE(diff.out.find("differing fields: requested_backend, backend, isa, fingerprint"),
            std::string::npos)
      << diff.out;
}

}  // namespace
}  // namespace kernel_align::cli::test
