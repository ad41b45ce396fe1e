// kernel-align verify: the quick matrix passes through the CLI with one progress line
// per cell, --json holds one entry per cell with the documented keys, backends planted
// in the registry (one writing a wrong bit, one falling back) are reported as FAIL with
// exit status 1, and bad arguments exit 2.
#include <gtest/gtest.h>

#include <cstddef>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_harness.hpp"
#include "cpu/cpu_backend.hpp"
#include "json.hpp"
#include "kernel_align/registry.hpp"
#include "kernel_align/runtime.hpp"
#include "registry/registry.hpp"
#include "support/runtime_guard.hpp"
#include "verify.hpp"

namespace kernel_align::cli::test {
namespace {

// Configurations per variant and shape: qk_rmsnorm 2 directions x 3 dtypes x 2 modes,
// multi_axis_rope 2 x 3 x 2 pairings x 2 layouts, qk_norm_rope 2 x 3 x 2 x 2 x 2, linear
// 2 x 3 x 3 activations, attention 2 x 3 x 2 layouts, adaln_modulation and
// adaln_gate_residual 2 x 3 x 2 modes each, activation 2 x 3 x 3 kinds, flow_sde_step and
// flow_sde_logp 2 x 3 each (no enumerated option), latent_normalize 2 x 3 x 2 transforms,
// latent_pack 2 x 3, true_cfg 2 x 3.
constexpr std::size_t kRmsNormConfigs = 12, kRopeConfigs = 24, kFusedConfigs = 48,
                      kLinearConfigs = 18, kAttentionConfigs = 12, kAdaLnConfigs = 12,
                      kGateResidualConfigs = 12, kActivationConfigs = 18, kFlowSdeConfigs = 12,
                      kLatentConfigs = 12 + 6, kCfgConfigs = 6;
constexpr std::size_t kConfigs = kRmsNormConfigs + kRopeConfigs + kFusedConfigs + kLinearConfigs +
                                 kAttentionConfigs + kAdaLnConfigs + kGateResidualConfigs +
                                 kActivationConfigs + kFlowSdeConfigs + kLatentConfigs +
                                 kCfgConfigs;
constexpr std::size_t kQuickShapes = 4;
// The one --quick shape the in-process tests run: 16 text + 8 x 8 image tokens, 8 heads.
const std::vector<std::string> kOneQuickShape{"--quick", "--shape", "t2i_128x128"};
constexpr std::size_t kQuickSampleElements = (16 + 64) * 8 * 128;

// The built-in simd backend runs once per ISA path.
std::size_t simd_variants() {
  return kernel_align::test::available_isas().size();
}

std::string summary(std::size_t cells, std::size_t failed) {
  return "verify: " + std::to_string(cells) + " cells, " + std::to_string(cells - failed) +
         " PASS, " + std::to_string(failed) + " FAIL\n";
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The table row of `variant`, op, direction and dtype, split into words.
std::vector<std::string> table_row(const std::string& report, const std::string& variant,
                                   const std::string& op, const std::string& direction,
                                   const std::string& dtype) {
  for (const std::string& line : lines_of(report)) {
    std::istringstream in(line);
    std::vector<std::string> words;
    for (std::string w; in >> w;) words.push_back(w);
    if (words.size() > 4 && words[0] == variant && words[1] == op && words[2] == direction &&
        words[3] == dtype) {
      return words;
    }
  }
  ADD_FAILURE() << "no row " << variant << " " << op << " " << direction << " " << dtype << " in\n"
                << report;
  return {};
}

// The report's "failures:" lines.
std::vector<std::string> failure_lines(const std::string& report) {
  std::vector<std::string> failures;
  for (const std::string& line : lines_of(report)) {
    if (line.starts_with("  ") && line.find(" check: ") != std::string::npos) {
      failures.push_back(line);
    }
  }
  return failures;
}

// Runs verify in this process, so that it sees the backends a test registers.
struct InProcessRun {
  int status = -1;
  std::string out;
  std::string progress;
};

InProcessRun verify_in_process(const std::vector<std::string>& args) {
  std::ostringstream out, progress;
  InProcessRun r;
  r.status = run_verify(args, out, progress, false);
  r.out = out.str();
  r.progress = progress.str();
  return r;
}

// A CPU backend running the simd kernels, after simd and before the reference, so that
// only verify's override makes it run.
registry::Backend simd_clone(const std::string& name) {
  registry::Backend b;
  b.name = name;
  b.platform = Platform::Cpu;
  b.priority = 50;
  b.unavailable_reason = [] { return std::string(); };
  b.isa_paths = [] { return std::string("as simd"); };
  b.fingerprint = "0000000000000000";
  b.kernels = cpu::simd_kernels();
  return b;
}

TEST_F(CliTest, VerifyQuickPassesEveryCell) {
  const CliResult r = run({"verify", "--quick"});
  const std::size_t cells = simd_variants() * kConfigs * kQuickShapes;
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(r.out.ends_with(summary(cells, 0))) << r.out;
  // "FAIL" only in the summary line.
  EXPECT_EQ(r.out.find("FAIL"), r.out.rfind("FAIL")) << r.out;
  const std::vector<std::string> row =
      table_row(r.out, "simd/portable", "qk_norm_rope", "backward", "bf16");
  EXPECT_EQ(row, (std::vector<std::string>{"simd/portable", "qk_norm_rope", "backward", "bf16",
                                           "PASS", "PASS", "PASS", "PASS"}));
  EXPECT_EQ(table_row(r.out, "variant", "op", "direction", "dtype"),
            (std::vector<std::string>{"variant", "op", "direction", "dtype", "t2i_128x128",
                                      "t2i_144x144", "t2i_192x112", "edit_128x128+ref128x128"}));

  // One progress line per cell on stderr (not a terminal), then the time taken.
  const std::vector<std::string> progress = lines_of(r.err);
  ASSERT_EQ(progress.size(), cells + 1) << r.err;
  const std::string total = std::to_string(cells);
  EXPECT_EQ(progress.front(), "verify: [" + std::string(total.size() - 1, ' ') + "1/" + total +
                                  "] simd/portable qk_rmsnorm forward fp32 single t2i_128x128");
  EXPECT_TRUE(progress.back().starts_with("verify: " + total + " cells in ")) << progress.back();
}

TEST_F(CliTest, VerifyJsonHasOneEntryPerCell) {
  const CliResult r = run({"verify", "--quick", "--shape", "t2i_144x144", "--json", "matrix.json"});
  EXPECT_EQ(r.status, 0) << r.out;
  std::ostringstream text;
  text << std::ifstream(work() / "matrix.json").rdbuf();
  const json::Value document = json::parse(text.str());

  ASSERT_NE(document.find("contract"), nullptr);
  EXPECT_EQ(document.find("contract")->text, "kernel-align-contract/3");
  ASSERT_NE(document.find("quick"), nullptr);
  EXPECT_TRUE(document.find("quick")->boolean);
  ASSERT_NE(document.find("shapes"), nullptr);
  ASSERT_EQ(document.find("shapes")->items.size(), 1u);
  EXPECT_EQ(document.find("shapes")->items[0].find("name")->text, "t2i_144x144");

  const std::size_t cells = simd_variants() * kConfigs;
  const json::Value* entries = document.find("cells");
  ASSERT_NE(entries, nullptr);
  ASSERT_EQ(entries->items.size(), cells);
  const std::vector<std::string> keys{"backend", "isa",    "op",     "direction",  "dtype",
                                      "pairing", "mode",   "layout", "activation", "transform",
                                      "shape",   "checks", "detail"};
  std::map<std::string, std::size_t> per_op;
  std::set<std::string> distinct;
  for (const json::Value& cell : entries->items) {
    std::vector<std::string> found;
    for (const json::Member& m : cell.members) found.push_back(m.key);
    ASSERT_EQ(found, keys) << json::compact(cell);
    EXPECT_EQ(cell.find("backend")->text, "simd");
    EXPECT_EQ(cell.find("shape")->text, "t2i_144x144");
    const json::Value* checks = cell.find("checks");
    for (const char* check : {"reference", "batch", "threads"}) {
      ASSERT_NE(checks->find(check), nullptr) << json::compact(cell);
      EXPECT_EQ(checks->find(check)->text, "PASS") << json::compact(cell);
    }
    EXPECT_EQ(cell.find("detail")->text, "");
    ++per_op[cell.find("op")->text];
    distinct.insert(json::compact(cell));
  }
  EXPECT_EQ(distinct.size(), cells);  // no combination twice
  EXPECT_EQ(per_op["qk_rmsnorm"], simd_variants() * kRmsNormConfigs);
  EXPECT_EQ(per_op["multi_axis_rope"], simd_variants() * kRopeConfigs);
  EXPECT_EQ(per_op["qk_norm_rope"], simd_variants() * kFusedConfigs);
  EXPECT_EQ(per_op["linear"], simd_variants() * kLinearConfigs);
  // Not applicable: null. RMSNorm has no pairing or layout, RoPE no mode.
  EXPECT_EQ(entries->items[0].find("op")->text, "qk_rmsnorm");
  EXPECT_EQ(entries->items[0].find("pairing")->kind, json::Value::Kind::Null);
  EXPECT_EQ(entries->items[0].find("layout")->kind, json::Value::Kind::Null);

  const json::Value* totals = document.find("summary");
  ASSERT_NE(totals, nullptr);
  EXPECT_EQ(totals->find("cells")->text, std::to_string(cells));
  EXPECT_EQ(totals->find("pass")->text, std::to_string(cells));
  EXPECT_EQ(totals->find("fail")->text, "0");
  EXPECT_TRUE(r.out.ends_with(summary(cells, 0))) << r.out;
}

TEST(VerifyPlanted, WrongBytesFailTheReferenceAndBatchChecks) {
  const kernel_align::test::RuntimeGuard restore;
  registry::Backend flipping = simd_clone("flips_a_bit");
  // The lowest bit of the first element of y: the sample alone gets a wrong first
  // element, the sample inside a batch (element 1) does not; every thread count agrees.
  flipping.kernels.set<OpType::QkRmsNorm, Direction::Forward>(
      [](const detail::RmsNormForwardProblem& p, registry::Execution& exec) {
        cpu::simd_kernels().get<OpType::QkRmsNorm, Direction::Forward>()(p, exec);
        *static_cast<unsigned char*>(p.y.data) ^= 1u;
      });
  const registry::ScopedRegistration planted(flipping);
  set_num_threads(5);

  const InProcessRun r = verify_in_process(kOneQuickShape);
  EXPECT_EQ(r.status, kExitSomeFail);
  const std::size_t cells = (simd_variants() + 1) * kConfigs;
  const std::size_t failing = 6;  // qk_rmsnorm forward: 3 dtypes x 2 modes
  EXPECT_TRUE(r.out.ends_with(summary(cells, failing))) << r.out;
  for (const char* dtype : {"fp32", "bf16", "fp16"}) {
    EXPECT_EQ(table_row(r.out, "flips_a_bit", "qk_rmsnorm", "forward", dtype).back(), "FAIL");
    EXPECT_EQ(table_row(r.out, "flips_a_bit", "qk_rmsnorm", "backward", dtype).back(), "PASS");
    EXPECT_EQ(table_row(r.out, "simd/portable", "qk_rmsnorm", "forward", dtype).back(), "PASS");
  }
  // The reference and batch checks of each failing cell, not the thread check.
  const std::vector<std::string> failures = failure_lines(r.out);
  ASSERT_EQ(failures.size(), 2 * failing) << r.out;
  const std::string difference = "y: 1 of " + std::to_string(kQuickSampleElements) +
                                 " elements differ, first at element 0: expected 0x";
  for (std::size_t i = 0; i < failures.size(); ++i) {
    const std::string& line = failures[i];
    EXPECT_TRUE(line.starts_with("  flips_a_bit qk_rmsnorm forward ")) << line;
    const std::string check = i % 2 == 0 ? " t2i_128x128: reference check: "
                                         : " t2i_128x128: batch check: element 1 of a batch of "
                                           "2 vs alone: ";
    EXPECT_NE(line.find(check + difference), std::string::npos) << line;
  }
  // The runtime settings are as they were.
  EXPECT_EQ(num_threads(), 5);
  EXPECT_EQ(backend_override(), "");
}

TEST(VerifyPlanted, BytesThatDependOnTheThreadCountFailTheThreadsCheck) {
  const kernel_align::test::RuntimeGuard restore;
  registry::Backend by_threads = simd_clone("one_thread_differs");
  // dx of the rope backward, wrong in its last bit only when the backend has one thread.
  const auto rope = [](const detail::RopeProblem& p, registry::Execution& exec) {
    cpu::simd_kernels().get<OpType::MultiAxisRope, Direction::Forward>()(p, exec);
    if (p.transpose && num_threads() == 1) *static_cast<unsigned char*>(p.out.data) ^= 1u;
  };
  by_threads.kernels.set<OpType::MultiAxisRope, Direction::Forward>(rope);
  by_threads.kernels.set<OpType::MultiAxisRope, Direction::Backward>(rope);
  const registry::ScopedRegistration planted(by_threads);

  const InProcessRun r = verify_in_process(kOneQuickShape);
  EXPECT_EQ(r.status, kExitSomeFail);
  const std::size_t failing = kRopeConfigs / 2;  // the backward ones
  EXPECT_TRUE(r.out.ends_with(summary((simd_variants() + 1) * kConfigs, failing))) << r.out;
  const std::vector<std::string> failures = failure_lines(r.out);
  ASSERT_EQ(failures.size(), failing) << r.out;
  for (const std::string& line : failures) {
    EXPECT_TRUE(line.starts_with("  one_thread_differs multi_axis_rope backward ")) << line;
    EXPECT_NE(line.find(" t2i_128x128: threads check: 1 thread vs "), std::string::npos) << line;
    EXPECT_NE(line.find(": dx: 1 of " + std::to_string(kQuickSampleElements) + " elements differ"),
              std::string::npos)
        << line;
  }
}

TEST(VerifyPlanted, AFallbackIsAFailure) {
  const kernel_align::test::RuntimeGuard restore;
  registry::Backend fp32_only = simd_clone("fp32_only");
  fp32_only.capabilities.dtypes = registry::bit(DType::F32);
  const registry::ScopedRegistration planted(fp32_only);

  const InProcessRun r = verify_in_process(kOneQuickShape);
  EXPECT_EQ(r.status, kExitSomeFail);
  const std::size_t cells = (simd_variants() + 1) * kConfigs;
  const std::size_t failing = kConfigs * 2 / 3;  // every bf16 and fp16 configuration
  EXPECT_TRUE(r.out.ends_with(summary(cells, failing))) << r.out;
  EXPECT_EQ(table_row(r.out, "fp32_only", "multi_axis_rope", "backward", "fp32").back(), "PASS");
  EXPECT_EQ(table_row(r.out, "fp32_only", "multi_axis_rope", "backward", "fp16").back(), "FAIL");
  const std::string reason =
      ": reference check: the call ran on simd, not fp32_only (fallback: fp32_only: dtype bf16 "
      "is not supported (supports fp32))";
  EXPECT_NE(
      r.out.find("  fp32_only qk_norm_rope backward bf16 half diffusers bhsd t2i_128x128" + reason),
      std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  fp32_only qk_norm_rope backward bf16 half diffusers bhsd t2i_128x128: "
                       "batch check: not run: the sample's call failed"),
            std::string::npos)
      << r.out;
  // Every cell has a progress line.
  EXPECT_EQ(lines_of(r.progress).size(), cells + 1);
}

TEST_F(CliTest, VerifyBadArgumentsExit2) {
  expect_bad_argument({"verify", "--shape", "t2i_9x9"}, "--shape");
  expect_bad_argument({"verify", "--quick", "--shape", "t2i_1024x1024"}, "--shape");
  expect_bad_argument({"verify", "--quick=yes"}, "--quick");
  expect_bad_argument({"verify", "--json"}, "--json");
  expect_bad_argument({"verify", "--quick", "--json", "no_such_directory/matrix.json"}, "--json");
  expect_bad_argument({"verify", "--frobnicate", "1"}, "--frobnicate");
  expect_bad_argument({"verify", "quick"}, "quick");
}

TEST_F(CliTest, VerifyHelp) {
  EXPECT_TRUE(run_ok({"verify", "--help"}).starts_with("usage: kernel-align verify [--quick]"));
  EXPECT_NE(run_ok({"--help"}).find("usage: kernel-align verify [--quick]"), std::string::npos);
}

}  // namespace
}  // namespace kernel_align::cli::test
