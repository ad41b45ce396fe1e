// kernel-align trace diff on model traces (docs/alignment.md): module records, written
// here in docs/trace.md's format, aligned by (module, direction, call index) rather
// than by position, mixed with the library's own records; exit codes as for the
// library's traces.
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli_harness.hpp"

namespace kernel_align::cli::test {
namespace {

// A digest that depends on the module, its call, the output and the sample the batch
// element holds, never on the element's place in the batch (as digest-v1 does).
std::string digest(const std::string& module, int call, int output, int sample) {
  std::uint64_t h = 0xcbf29ce484222325u;
  for (const char c : module) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3u;
  h ^= (std::uint64_t(call) << 48) ^ (std::uint64_t(output) << 40) ^ std::uint64_t(sample + 1);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64, h * 0x9E3779B97F4A7C15u);
  return hex;
}

struct ModuleOutput {
  bool per_sample = true;     // false: a tensor without the batch (one digest, batch_dim null)
  int perturbed_sample = -1;  // this sample's digest is planted with another value
};

// One module call as the fixtures vary it.
struct ModuleCall {
  std::string module;
  std::string type = "Linear";
  int call = 0;
  std::string direction = "forward";
  std::vector<ModuleOutput> outputs{ModuleOutput{}};
};

std::string module_record(std::size_t seq, const ModuleCall& m, const std::vector<int>& samples) {
  std::ostringstream r;
  r << R"({"seq":)" << seq << R"(,"session":"00000000000000aa","pid":1,"kind":"module","op":")"
    << m.module << R"(","module_type":")" << m.type << R"(","call":)" << m.call
    << R"(,"direction":")" << m.direction << R"(","tensors":[)";
  for (std::size_t o = 0; o < m.outputs.size(); ++o) {
    const bool batched = m.outputs[o].per_sample;
    r << (o == 0 ? "" : ",") << R"({"name":"out)" << o << R"(","dtype":"f32","shape":[)"
      << (batched ? samples.size() : 7) << R"(,8],"strides":[8,1],"batch_dim":)"
      << (batched ? "0" : "null") << '}';
  }
  r << R"(],"digests":{)";
  for (std::size_t o = 0; o < m.outputs.size(); ++o) {
    r << (o == 0 ? "" : ",") << R"("out)" << o << R"(":[)";
    if (m.outputs[o].per_sample) {
      for (std::size_t e = 0; e < samples.size(); ++e) {
        const int sample = samples[e] == m.outputs[o].perturbed_sample ? 99 : samples[e];
        r << (e == 0 ? "" : ",") << '"' << digest(m.module, m.call, int(o), sample) << '"';
      }
    } else {
      r << '"' << digest(m.module, m.call, int(o), -1) << '"';
    }
    r << ']';
  }
  r << "}}";
  return r.str();
}

// A library record (docs/trace.md, the keys trace diff reads) of the fused op.
std::string library_record(std::size_t seq, const std::vector<int>& samples) {
  std::ostringstream r;
  r << R"({"seq":)" << seq << R"(,"session":"00000000000000aa","pid":1,"op":"qk_norm_rope",)"
    << R"("direction":"forward","backend":"simd","tensors":[{"name":"q_out","dtype":"f32",)"
    << R"("shape":[)" << samples.size() << R"(,4,2,128],"strides":[1024,256,128,1]}],)"
    << R"("digests":{"q_out":[)";
  for (std::size_t e = 0; e < samples.size(); ++e) {
    r << (e == 0 ? "" : ",") << '"' << digest("qk_norm_rope", 0, 0, samples[e]) << '"';
  }
  r << "]}}";
  return r.str();
}

// A tiny model's step: embed, two blocks whose linear runs twice each, the library's
// fused op in between, a head; post-order, as forward hooks fire.
struct Step {
  std::vector<ModuleCall> modules{
      {"embed", "Embedding"},
      {"blocks.0.linear", "Linear", 0},
      {"blocks.0.linear", "Linear", 1},
      {"blocks.0", "Block"},
      {"blocks.1.linear", "Linear", 0},
      {"blocks.1.linear", "Linear", 1},
      {"blocks.1", "Block"},
      {"head", "Linear"},
  };
  std::size_t library_after = 1;  // the fused op's record follows this module record
  bool with_library = true;
};

std::vector<std::string> trace_lines(const Step& step, const std::vector<int>& samples) {
  std::vector<std::string> lines;
  for (std::size_t i = 0; i < step.modules.size(); ++i) {
    lines.push_back(module_record(lines.size(), step.modules[i], samples));
    if (step.with_library && i == step.library_after) {
      lines.push_back(library_record(lines.size(), samples));
    }
  }
  return lines;
}

class ModelTraceDiffTest : public CliTest {
 protected:
  void write_lines(const std::string& name, const std::vector<std::string>& lines) const {
    std::ofstream file(work() / name, std::ios::binary);
    for (const std::string& line : lines) file << line << '\n';
  }
  void write_step(const std::string& name, const Step& step,
                  const std::vector<int>& samples = {0, 1}) const {
    write_lines(name, trace_lines(step, samples));
  }
  static std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }
  // The text after the summary's header.
  static std::string summary(const std::string& text) {
    const std::string header = "by module type (calls matching, differing, missing):\n";
    const std::size_t at = text.find(header);
    return at == std::string::npos ? "(no summary)" : text.substr(at + header.size());
  }
};

TEST_F(ModelTraceDiffTest, IdenticalModelTraces) {
  write_step("a.jsonl", {});
  write_step("b.jsonl", {});
  const std::string out = run_ok({"trace", "diff", "a.jsonl", "b.jsonl"});
  // 8 module calls of 2 digests each, and the fused op's 2.
  EXPECT_EQ(first_line(out),
            "identical: 8 module calls and 1 library calls matched by (name, direction, call "
            "index), 18 digests compared");
  EXPECT_EQ(summary(out),
            "  Embedding: 1 matching, 0 differing, 0 missing\n"
            "  Linear: 5 matching, 0 differing, 0 missing\n"
            "  qk_norm_rope (kernel-align): 1 matching, 0 differing, 0 missing\n"
            "  Block: 2 matching, 0 differing, 0 missing\n");
}

// Aligned by (module, call index): another order of the records in B, or the library's
// record elsewhere, is no divergence; each call is found by its key.
TEST_F(ModelTraceDiffTest, AlignsByModuleAndCallIndexNotPosition) {
  write_step("a.jsonl", {});
  Step shuffled;
  std::swap(shuffled.modules[1], shuffled.modules[4]);
  std::swap(shuffled.modules[0], shuffled.modules[7]);
  shuffled.library_after = 5;
  write_step("b.jsonl", shuffled);
  EXPECT_TRUE(run_ok({"trace", "diff", "a.jsonl", "b.jsonl"}).starts_with("identical: 8 module"));

  // A positional diff of the same files would have failed at the first record.
  Step lone = shuffled;
  lone.modules[2].outputs[0].perturbed_sample = 1;  // B's blocks.0.linear #1, at B line 3
  write_step("b.jsonl", lone);
  const CliResult r = run({"trace", "diff", "a.jsonl", "b.jsonl"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(first_line(r.out),
            "diverged at module call blocks.0.linear #1 (forward) (A line 4, B line 3): output "
            "out0 element 1 vs 1: " +
                digest("blocks.0.linear", 1, 0, 1) + " != " + digest("blocks.0.linear", 1, 0, 99));
}

// A planted divergence in one sample of one module's second output: that module call,
// output and element are named, the later calls it feeds are counted, not reported.
TEST_F(ModelTraceDiffTest, FirstDivergentModuleCallIsNamedWithOutputAndElement) {
  Step step;
  step.modules[4].outputs = {ModuleOutput{}, ModuleOutput{}};  // blocks.1.linear #0
  write_step("a.jsonl", step, {0, 1, 2, 3});
  Step planted = step;
  planted.modules[4].outputs[1].perturbed_sample = 2;
  planted.modules[6].outputs[0].perturbed_sample = 0;  // later: blocks.1, element 0
  write_step("b.jsonl", planted, {0, 1, 2, 3});
  const CliResult r = run({"trace", "diff", "a.jsonl", "b.jsonl"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(first_line(r.out),
            "diverged at module call blocks.1.linear #0 (forward) (A line 6, B line 6): output "
            "out1 element 2 vs 2: " +
                digest("blocks.1.linear", 0, 1, 2) + " != " + digest("blocks.1.linear", 0, 1, 99));
  EXPECT_NE(r.out.find("\ndiffering fields: none (same configuration, different bytes)\n"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(summary(r.out),
            "  Embedding: 1 matching, 0 differing, 0 missing\n"
            "  Linear: 4 matching, 1 differing, 0 missing\n"
            "  qk_norm_rope (kernel-align): 1 matching, 0 differing, 0 missing\n"
            "  Block: 1 matching, 1 differing, 0 missing\n");
}

TEST_F(ModelTraceDiffTest, MissingCallsOnEitherSide) {
  write_step("a.jsonl", {});
  Step fewer;
  fewer.modules.erase(fewer.modules.begin() + 2);  // blocks.0.linear #1
  write_step("b.jsonl", fewer);
  CliResult r = run({"trace", "diff", "a.jsonl", "b.jsonl"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(first_line(r.out),
            "diverged at module call blocks.0.linear #1 (forward) (A line 4): in A only");
  EXPECT_NE(summary(r.out).find("  Linear: 4 matching, 0 differing, 1 missing\n"),
            std::string::npos)
      << r.out;
  r = run({"trace", "diff", "b.jsonl", "a.jsonl"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(first_line(r.out),
            "diverged at module call blocks.0.linear #1 (forward) (B line 4): in B only");

  // Our op's record missing on one side (a run without kernel-align's processor).
  Step without = {};
  without.with_library = false;
  write_step("b.jsonl", without);
  r = run({"trace", "diff", "a.jsonl", "b.jsonl"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(first_line(r.out),
            "diverged at library call qk_norm_rope #0 (forward) (A line 3): "
            "in A only");
  EXPECT_NE(summary(r.out).find("  qk_norm_rope (kernel-align): 0 matching, 0 differing, 1 "
                                "missing\n"),
            std::string::npos)
      << r.out;
}

// Backward records are keyed apart from forward ones of the same module and call.
TEST_F(ModelTraceDiffTest, BackwardCallsAreTheirOwnCalls) {
  Step step;
  step.modules.push_back({"head", "Linear", 0, "backward"});
  write_step("a.jsonl", step);
  Step planted = step;
  planted.modules.back().outputs[0].perturbed_sample = 0;
  write_step("b.jsonl", planted);
  const CliResult r = run({"trace", "diff", "a.jsonl", "b.jsonl"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_TRUE(
      r.out.starts_with("diverged at module call head #0 (backward) (A line 10, B line "
                        "10): output out0 element 0 vs 0"))
      << r.out;
}

// A sample alone (batch 1) against the same sample at element 2 of a batch of 4: per-sample
// outputs compare element 0 with element 2, outputs without the batch compare whole.
TEST_F(ModelTraceDiffTest, SampleAloneVersusInABatchOfFour) {
  Step step;
  step.modules[0].outputs = {ModuleOutput{}, ModuleOutput{false}};  // embed: a batch-free table
  write_step("alone.jsonl", step, {7});
  write_step("batch.jsonl", step, {5, 6, 7, 8});
  // 8 module calls: 8 per-sample digests, 1 whole; the fused op's 1.
  EXPECT_EQ(first_line(run_ok({"trace", "diff", "batch.jsonl", "alone.jsonl", "--sample", "2:0"})),
            "identical: 8 module calls and 1 library calls matched by (name, direction, call "
            "index), 10 digests compared");
  CliResult r = run({"trace", "diff", "batch.jsonl", "alone.jsonl", "--sample", "1:0"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(first_line(r.out),
            "diverged at module call embed #0 (forward) (A line 1, B line 1): output out0 element "
            "1 vs 0: " +
                digest("embed", 0, 0, 6) + " != " + digest("embed", 0, 0, 7));

  // The batch-free output differs: compared whole, it is the divergence.
  Step other = step;
  other.modules[0].outputs[1].perturbed_sample = -1;
  std::vector<std::string> lines = trace_lines(other, {7});
  const std::string whole = digest("embed", 0, 1, -1);
  lines[0].replace(lines[0].find(whole), 16, std::string(16, 'f'));
  write_lines("alone.jsonl", lines);
  r = run({"trace", "diff", "batch.jsonl", "alone.jsonl", "--sample", "2:0"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(first_line(r.out),
            "diverged at module call embed #0 (forward) (A line 1, B line 1): output out1 element "
            "0 vs 0: " +
                whole + " != ffffffffffffffff");

  // Per sample on one side only (a tensor whose dim 0 is the batch in one run only).
  Step one_sided = step;
  one_sided.modules[0].outputs[1].per_sample = true;
  write_step("alone.jsonl", one_sided, {7});
  r = run({"trace", "diff", "batch.jsonl", "alone.jsonl", "--sample", "2:0"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(first_line(r.out),
            "diverged at module call embed #0 (forward) (A line 1, B line 1): output out1 has one "
            "digest per sample in B only");
}

// A model trace against a library-only one: the positional comparison of today.
TEST_F(ModelTraceDiffTest, ALibraryTraceIsComparedByPosition) {
  write_step("a.jsonl", {});
  write_lines("b.jsonl", {library_record(0, {0, 1})});
  const CliResult r = run({"trace", "diff", "a.jsonl", "b.jsonl"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(first_line(r.out),
            "diverged at call #0 (A line 1, B line 1): different op: embed vs qk_norm_rope");
  EXPECT_EQ(r.out.find("by module type"), std::string::npos) << r.out;
}

TEST_F(ModelTraceDiffTest, MalformedModelRecords) {
  const std::vector<std::string> lines = trace_lines({}, {0, 1});
  write_lines("a.jsonl", lines);
  const auto with = [&](std::size_t n, const std::string& from, const std::string& to) {
    std::vector<std::string> changed = lines;
    changed[n].replace(changed[n].find(from), from.size(), to);
    write_lines("b.jsonl", changed);
  };
  const auto expect_bad = [&](const std::vector<std::string>& args, const std::string& argument,
                              const std::string& mention) {
    expect_bad_argument(args, argument);
    const std::string err = run(args).err;
    EXPECT_NE(err.find(mention), std::string::npos) << err;
  };
  with(1, R"("kind":"module")", R"("kind":"layer")");
  expect_bad({"trace", "diff", "a.jsonl", "b.jsonl"}, "B",
             "expected 'kind' \"module\" (library records have no 'kind'), found \"layer\" at "
             "'b.jsonl' line 2");
  with(1, R"("call":0)", R"("call":-1)");
  expect_bad({"trace", "diff", "a.jsonl", "b.jsonl"}, "B",
             "a whole number as 'call', found '-1' at 'b.jsonl' line 2");
  with(1, R"("module_type":"Linear",)", "");
  expect_bad({"trace", "diff", "a.jsonl", "b.jsonl"}, "B",
             "key 'module_type' (a string) in every record, found none at 'b.jsonl' line 2");
  // Two runs appended to one file: calls repeat, and the file cannot be keyed.
  with(3, R"("call":1)", R"("call":0)");
  expect_bad({"trace", "diff", "a.jsonl", "b.jsonl"}, "B",
             "call 0 of module 'blocks.0.linear' again, first at line 2 at 'b.jsonl' line 4");
  // --sample needs each module output's batch_dim.
  with(0, R"(,"batch_dim":0)", "");
  expect_bad({"trace", "diff", "a.jsonl", "b.jsonl", "--sample", "0:0"}, "B",
             "a tensor named 'out0' in 'tensors' with a 'batch_dim'");
  write_lines("b.jsonl", lines);
  expect_bad({"trace", "diff", "a.jsonl", "b.jsonl", "--sample", "0:2"}, "--sample",
             "index 2 past the 2 elements of output 'out0' at 'b.jsonl' line 1");
}

}  // namespace
}  // namespace kernel_align::cli::test
