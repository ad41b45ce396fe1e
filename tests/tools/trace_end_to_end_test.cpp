// Traces written by the real library and compared by `kernel-align trace diff` (the
// issue's acceptance): the main job on different backends and thread counts is
// "identical"; a sample alone and inside a batch has the same per-element digests;
// a run whose input differs in one element diverges at the call that reads it.
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <utility>
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

// Processes sharing one trace file: each appends whole records under its own session,
// whose seq counts from 0; no record is lost (once each process truncated the file: 8
// concurrent applies left 1-2 lines of 8).
TEST_F(TraceEndToEnd, ConcurrentProcessesSharingATraceLoseNoRecord) {
  write("x.npy", input(2));
  constexpr int kApplies = 8;
  constexpr int kRuns = 4;
  std::vector<std::vector<std::string>> commands;
  for (int i = 0; i < kApplies; ++i) {
    commands.push_back(
        {"apply", "qk-rmsnorm", "--x", "x.npy", "--out", std::to_string(i).append(".npy")});
  }
  for (int i = 0; i < kRuns; ++i) {
    commands.push_back({"run", "--image", "256x256", "--text-len", "16", "--heads", "4", "--batch",
                        "3", "--threads", "1"});
  }
  ::setenv("KERNEL_ALIGN_TRACE", (work() / "shared.jsonl").c_str(), 1);
  const std::vector<CliResult> results = run_concurrently(commands);
  ::unsetenv("KERNEL_ALIGN_TRACE");
  for (const CliResult& r : results) ASSERT_EQ(r.status, 0) << r.out << r.err;

  std::ifstream in(work() / "shared.jsonl");
  std::map<std::string, std::vector<std::string>> seqs_of_session;
  std::set<std::string> pids;
  for (std::string line; std::getline(in, line);) {
    const auto member = [&](const std::string& key) {
      std::string tag = "\"";  // appended: g++ 12 warns falsely on "\"" + key
      tag.append(key).append("\":");
      const std::size_t at = line.find(tag);
      EXPECT_NE(at, std::string::npos) << line;
      const std::size_t begin = at + tag.size();
      return line.substr(begin, line.find(',', begin) - begin);
    };
    seqs_of_session[member("session")].push_back(member("seq"));
    pids.insert(member("pid"));
  }
  EXPECT_EQ(seqs_of_session.size(), std::size_t{kApplies + kRuns});
  EXPECT_EQ(pids.size(), std::size_t{kApplies + kRuns});
  std::size_t records = 0;
  for (const auto& [session, seqs] : seqs_of_session) {
    // An apply makes 1 call, a run 8 (see MainJobIsIdenticalAcrossBackendsAndThreadCounts).
    ASSERT_TRUE(seqs.size() == 1 || seqs.size() == 8) << session;
    std::set<std::string> distinct(seqs.begin(), seqs.end());
    EXPECT_EQ(distinct.size(), seqs.size()) << "a seq repeated in session " << session;
    EXPECT_TRUE(distinct.contains("0"));
    records += seqs.size();
  }
  EXPECT_EQ(records, std::size_t{kApplies + 8 * kRuns});
  // The shared file against itself: sessions are taken in order, so identical.
  const CliResult diff = run({"trace", "diff", "shared.jsonl", "shared.jsonl"});
  EXPECT_EQ(diff.status, 0) << diff.out << diff.err;
  EXPECT_NE(diff.out.find(std::to_string(kApplies + kRuns) + " in A"), std::string::npos)
      << diff.out;
}

// The trace file is never an input or an output of the same command: it would append
// JSON to the input, or the output's rename would swallow the trace.
TEST_F(TraceEndToEnd, ATracePathEqualToAnInputOrOutputIsRefused) {
  write("x.npy", input(2));
  write("y.npy", input(2));
  for (const auto& [trace, flag] : {std::pair{"x.npy", "--x"}, std::pair{"y.npy", "--out"}}) {
    ::setenv("KERNEL_ALIGN_TRACE", (work() / trace).c_str(), 1);
    expect_bad_argument({"apply", "qk-rmsnorm", "--x", "x.npy", "--out", "y.npy"}, flag);
    ::unsetenv("KERNEL_ALIGN_TRACE");
  }
  // The same file under another name (a symlink) is the same file.
  fs::create_symlink("x.npy", work() / "alias.npy");
  ::setenv("KERNEL_ALIGN_TRACE", (work() / "alias.npy").c_str(), 1);
  expect_bad_argument({"apply", "qk-rmsnorm", "--x", "x.npy", "--out", "y.npy"}, "--x");
  ::unsetenv("KERNEL_ALIGN_TRACE");
}

}  // namespace
}  // namespace kernel_align::cli::test
