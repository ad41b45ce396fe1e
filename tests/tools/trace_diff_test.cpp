// kernel-align trace diff on trace files written here, in docs/trace.md's record format:
// exit 0 and a count when identical, 1 and the first divergence, 2 on bad input.
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli_harness.hpp"

namespace kernel_align::cli::test {
namespace {

// One call as the fixtures vary it. The digest of a batch element depends on the call,
// the output and which sample the element holds, never on its place in the batch: a
// sample run alone and inside a batch has equal digests, as the real digest-v1 has.
struct Call {
  std::string op = "qk_norm_rope";  // or "qk_rmsnorm", here a backward call with dw
  std::string backend = "simd";
  std::string isa = "avx2";
  std::vector<int> samples{0, 1};  // the sample held by each batch element
  bool with_dw = true;             // qk_rmsnorm: whether dw was asked for
};

std::string digest(std::size_t seq, std::size_t output, int sample) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64,
                (std::uint64_t{seq} << 40) | (std::uint64_t{output} << 32) |
                    (static_cast<std::uint64_t>(sample) * 0x01000193u));
  return hex;
}

std::string tensor(const std::string& name, const std::string& shape, const std::string& strides) {
  return R"({"name":")" + name + R"(","dtype":"bf16","shape":)" + shape + R"(,"strides":)" +
         strides + "}";
}

// The record of `call` at `seq`, keys in docs/trace.md's order.
std::string record(std::size_t seq, const Call& call) {
  const bool fused = call.op == "qk_norm_rope";
  const std::string batch = std::to_string(call.samples.size());
  const std::string shape = "[" + batch + ",16,2,128]";
  const std::string strides = "[4096,256,128,1]";
  std::vector<std::string> tensors;
  std::vector<std::string> batched_outputs;
  if (fused) {
    tensors = {tensor("q", shape, strides),        tensor("k", shape, strides),
               tensor("cos", "[16,64]", "[64,1]"), tensor("sin", "[16,64]", "[64,1]"),
               tensor("q_out", shape, strides),    tensor("k_out", shape, strides)};
    batched_outputs = {"q_out", "k_out"};
  } else {
    tensors = {tensor("x", shape, strides), tensor("dy", shape, strides),
               tensor("weight", "[128]", "[1]"), tensor("dx", shape, strides)};
    if (call.with_dw) tensors.push_back(tensor("dw", "[128]", "[1]"));
    batched_outputs = {"dx"};
  }
  std::ostringstream r;
  r << R"({"seq":)" << seq << R"(,"contract":"kernel-align-contract/3","op":")" << call.op
    << R"(","direction":")" << (fused ? "forward" : "backward")
    << R"(","platform":"cpu","requested_backend":")" << call.backend << R"(","backend":")"
    << call.backend << R"(","isa":")" << call.isa << R"(","fallback":null,"fingerprint":")"
    << (call.backend == "simd" ? "0123456789abcdef" : "fedcba9876543210") << R"(","tensors":[)";
  for (const std::string& t : tensors) r << (&t == &tensors.front() ? "" : ",") << t;
  r << R"(],"layout":)" << (fused ? R"("bshd")" : "null") << R"(,"pairing":)"
    << (fused ? R"("interleaved")" : "null")
    << R"(,"mode":"diffusers","eps":9.99999997e-07,"text_len":)" << (fused ? "4" : "null")
    << R"(,"accumulator":"fp32","output_dtype":"bf16","reduction_tree":"tree16-v1")"
    << R"(,"dw_block_rows":)" << (!fused && call.with_dw ? "256" : "null")
    << R"(,"fma_contraction":false,"ftz":false,"daz":false,"threads":2,"partition":[[[0,)"
    << 32 * call.samples.size() << R"(]]],"digests":{)";
  for (std::size_t o = 0; o < batched_outputs.size(); ++o) {
    r << (o == 0 ? "" : ",") << '"' << batched_outputs[o] << R"(":[)";
    for (std::size_t e = 0; e < call.samples.size(); ++e) {
      r << (e == 0 ? "" : ",") << '"' << digest(seq, o, call.samples[e]) << '"';
    }
    r << ']';
  }
  // dw sums over the batch: one digest, here the same for any batch.
  if (!fused && call.with_dw) r << R"(,"dw":[")" << digest(seq, 9, 0) << R"("])";
  r << "}}";
  return r.str();
}

Call on_reference() {
  Call call;
  call.backend = "reference";
  call.isa = "scalar";
  return call;
}

Call of_samples(std::vector<int> samples) {
  Call call;
  call.samples = std::move(samples);
  return call;
}

// Five calls: fused forward, rmsnorm backward, fused, rmsnorm backward, fused.
std::vector<Call> five_calls(const Call& fused) {
  Call rmsnorm = fused;
  rmsnorm.op = "qk_rmsnorm";
  return {fused, rmsnorm, fused, rmsnorm, fused};
}

class TraceDiffTest : public CliTest {
 protected:
  void write_trace(const std::string& name, const std::vector<Call>& calls) const {
    std::vector<std::string> lines;
    for (std::size_t seq = 0; seq < calls.size(); ++seq) lines.push_back(record(seq, calls[seq]));
    write_lines(name, lines);
  }

  void write_lines(const std::string& name, const std::vector<std::string>& lines) const {
    std::ofstream file(work() / name, std::ios::binary);
    for (const std::string& line : lines) file << line << '\n';
  }

  static std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

  static std::string line_starting(const std::string& text, const std::string& prefix) {
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      if (line.starts_with(prefix)) return line;
    }
    return "";
  }

  // The words of the table row for `key`: its mark ("*" or none), the key, A's value and
  // B's (the fixtures' values hold no spaces).
  static std::vector<std::string> row(const std::string& text, const std::string& key) {
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      if (!line.substr(2).starts_with(key + ' ')) continue;
      std::istringstream words(line);
      std::vector<std::string> row;
      if (line[0] != '*') row.emplace_back();
      for (std::string word; words >> word;) row.push_back(word);
      return row;
    }
    return {};
  }

  // Status 2, one stderr line for `argument`, which also contains each of `mentions`.
  void expect_bad_input(const std::vector<std::string>& args, const std::string& argument,
                        const std::vector<std::string>& mentions) const {
    expect_bad_argument(args, argument);
    const std::string err = run(args).err;
    for (const std::string& m : mentions) EXPECT_NE(err.find(m), std::string::npos) << err;
  }
};

// Per fused call of batch 2: q_out and k_out, 2 digests each; per rmsnorm backward call:
// dx 2 and dw 1.
constexpr int kFiveCallDigests = 3 * 4 + 2 * 3;

TEST_F(TraceDiffTest, IdenticalTraces) {
  write_trace("a.jsonl", five_calls({}));
  write_trace("b.jsonl", five_calls({}));
  EXPECT_EQ(run_ok({"trace", "diff", "a.jsonl", "b.jsonl"}),
            "identical: 5 calls, " + std::to_string(kFiveCallDigests) + " digests compared\n");
}

TEST_F(TraceDiffTest, EmptyTracesAreIdentical) {
  write_lines("a.jsonl", {});
  write_lines("b.jsonl", {});
  EXPECT_EQ(run_ok({"trace", "diff", "a.jsonl", "b.jsonl"}),
            "identical: 0 calls, 0 digests compared\n");
}

// Another backend with the same bytes is what the contract promises: no divergence.
TEST_F(TraceDiffTest, DifferentBackendsWithEqualDigestsAreIdentical) {
  write_trace("a.jsonl", five_calls({}));
  write_trace("b.jsonl", five_calls(on_reference()));
  EXPECT_EQ(run_ok({"trace", "diff", "a.jsonl", "b.jsonl"}),
            "identical: 5 calls, " + std::to_string(kFiveCallDigests) + " digests compared\n");
}

// Records are aligned by seq, not by their place in the file.
TEST_F(TraceDiffTest, AlignsBySeq) {
  const std::vector<Call> calls = five_calls({});
  write_trace("a.jsonl", calls);
  std::vector<std::string> reversed;
  for (std::size_t seq = calls.size(); seq-- > 0;) reversed.push_back(record(seq, calls[seq]));
  write_lines("b.jsonl", reversed);
  EXPECT_EQ(run_ok({"trace", "diff", "a.jsonl", "b.jsonl"}),
            "identical: 5 calls, " + std::to_string(kFiveCallDigests) + " digests compared\n");

  // Call #1 is on line 4 of B.
  std::vector<Call> changed = calls;
  changed[1].samples = {0, 7};
  write_trace("a.jsonl", changed);
  const CliResult r = run({"trace", "diff", "a.jsonl", "b.jsonl"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_TRUE(
      r.out.starts_with("diverged at call #1 (A line 2, B line 4): output dx element 1 vs 1"))
      << r.out;
}

TEST_F(TraceDiffTest, DigestDivergenceNamesCallOutputAndElement) {
  const std::vector<Call> calls = five_calls({});
  write_trace("a.jsonl", calls);
  std::vector<Call> planted = calls;
  planted[3].samples = {0, 5};  // call #3 (rmsnorm backward): dx element 1 differs
  write_trace("b.jsonl", planted);
  const CliResult r = run({"trace", "diff", "a.jsonl", "b.jsonl"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(first_line(r.out),
            "diverged at call #3 (A line 4, B line 4): output dx element 1 vs 1: " +
                digest(3, 0, 1) + " != " + digest(3, 0, 5));
  // The table: a header, then a row per key but digests, none marked, in columns.
  const std::string header = line_starting(r.out, "  field ");
  const std::string seq = line_starting(r.out, "  seq ");
  EXPECT_EQ(header.find(" A "), seq.find(" 3 ")) << r.out;
  EXPECT_EQ(header.rfind(" B"), seq.rfind(" 3")) << r.out;
  EXPECT_EQ(row(r.out, "backend"),
            (std::vector<std::string>{"", "backend", "\"simd\"", "\"simd\""}));
  EXPECT_EQ(row(r.out, "eps"),
            (std::vector<std::string>{"", "eps", "9.99999997e-07", "9.99999997e-07"}));
  EXPECT_EQ(row(r.out, "partition"),
            (std::vector<std::string>{"", "partition", "[[[0,64]]]", "[[[0,64]]]"}));
  EXPECT_EQ(row(r.out, "digests"), std::vector<std::string>{});
  EXPECT_EQ(line_starting(r.out, "* "), "");
  EXPECT_TRUE(r.out.ends_with("\ndiffering fields: none (same configuration, different bytes)\n"))
      << r.out;
}

TEST_F(TraceDiffTest, ListsTheFieldsThatDiffer) {
  write_trace("a.jsonl", five_calls({}));
  std::vector<Call> reference = five_calls(on_reference());
  reference[0].samples = {0, 3};
  write_trace("b.jsonl", reference);
  const CliResult r = run({"trace", "diff", "a.jsonl", "b.jsonl"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_TRUE(
      r.out.starts_with("diverged at call #0 (A line 1, B line 1): output q_out element 1 vs 1: "))
      << r.out;
  EXPECT_EQ(row(r.out, "backend"),
            (std::vector<std::string>{"*", "backend", "\"simd\"", "\"reference\""}));
  EXPECT_EQ(row(r.out, "isa"), (std::vector<std::string>{"*", "isa", "\"avx2\"", "\"scalar\""}));
  EXPECT_EQ(row(r.out, "op"),
            (std::vector<std::string>{"", "op", "\"qk_norm_rope\"", "\"qk_norm_rope\""}));
  EXPECT_EQ(line_starting(r.out, "differing fields: "),
            "differing fields: requested_backend, backend, isa, fingerprint");
}

TEST_F(TraceDiffTest, DifferentCallCounts) {
  const std::vector<Call> calls = five_calls({});
  write_trace("a.jsonl", calls);
  write_trace("b.jsonl", std::vector<Call>(calls.begin(), calls.end() - 1));
  CliResult r = run({"trace", "diff", "a.jsonl", "b.jsonl"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.out,
            "diverged at call #4 (A line 5, end of B): different call counts: A has 5, B has 4\n");
  r = run({"trace", "diff", "b.jsonl", "a.jsonl"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.out,
            "diverged at call #4 (B line 5, end of A): different call counts: A has 4, B has 5\n");
}

TEST_F(TraceDiffTest, DifferentOpOrOutputsAtTheSamePosition) {
  std::vector<Call> calls = five_calls({});
  write_trace("a.jsonl", calls);
  std::vector<Call> other = calls;
  other[2].op = "qk_rmsnorm";
  write_trace("b.jsonl", other);
  CliResult r = run({"trace", "diff", "a.jsonl", "b.jsonl"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(first_line(r.out),
            "diverged at call #2 (A line 3, B line 3): different op: qk_norm_rope vs qk_rmsnorm");
  EXPECT_EQ(row(r.out, "op"),
            (std::vector<std::string>{"*", "op", "\"qk_norm_rope\"", "\"qk_rmsnorm\""}));

  other = calls;
  other[1].with_dw = false;
  write_trace("b.jsonl", other);
  r = run({"trace", "diff", "a.jsonl", "b.jsonl"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(first_line(r.out),
            "diverged at call #1 (A line 2, B line 2): output dw present in A only");
  EXPECT_EQ(line_starting(r.out, "differing fields: "), "differing fields: tensors, dw_block_rows");
  r = run({"trace", "diff", "b.jsonl", "a.jsonl"});
  EXPECT_EQ(first_line(r.out),
            "diverged at call #1 (A line 2, B line 2): output dw present in B only");
}

// A sample run alone (batch 1) against the same sample at element 1 of a batch of 3.
TEST_F(TraceDiffTest, SampleMatchesOneElementAgainstAnother) {
  write_trace("alone.jsonl", five_calls(of_samples({7})));
  write_trace("batch.jsonl", five_calls(of_samples({5, 7, 9})));
  // Per call: q_out and k_out (fused) or dx (rmsnorm) compared; dw skipped.
  EXPECT_EQ(run_ok({"trace", "diff", "alone.jsonl", "batch.jsonl", "--sample", "0:1"}),
            "identical: 5 calls, 8 digests compared, 2 single-digest outputs skipped (--sample)\n");
  EXPECT_EQ(run_ok({"trace", "diff", "batch.jsonl", "alone.jsonl", "--sample=1:0"}),
            "identical: 5 calls, 8 digests compared, 2 single-digest outputs skipped (--sample)\n");

  CliResult r = run({"trace", "diff", "alone.jsonl", "batch.jsonl", "--sample", "0:2"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(first_line(r.out),
            "diverged at call #0 (A line 1, B line 1): output q_out element 0 vs 2: " +
                digest(0, 0, 7) + " != " + digest(0, 0, 9));
  EXPECT_EQ(line_starting(r.out, "differing fields: "), "differing fields: tensors, partition");

  // Without --sample the batches themselves differ.
  r = run({"trace", "diff", "alone.jsonl", "batch.jsonl"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(first_line(r.out),
            "diverged at call #0 (A line 1, B line 1): output q_out has 1 digests in A, 3 in B");
}

TEST_F(TraceDiffTest, MalformedRecordsNameFileAndLine) {
  const std::vector<Call> calls = five_calls({});
  write_trace("a.jsonl", calls);
  std::vector<std::string> lines;
  for (std::size_t seq = 0; seq < calls.size(); ++seq) lines.push_back(record(seq, calls[seq]));

  std::vector<std::string> truncated = lines;
  truncated[1].resize(40);
  write_lines("b.jsonl", truncated);
  expect_bad_input({"trace", "diff", "a.jsonl", "b.jsonl"}, "B",
                   {"(one JSON record per line)", "'b.jsonl' line 2, column 41"});

  std::vector<std::string> no_digests = lines;
  no_digests[2].resize(no_digests[2].find(R"(,"digests")"));
  no_digests[2] += '}';
  write_lines("b.jsonl", no_digests);
  expect_bad_input({"trace", "diff", "a.jsonl", "b.jsonl"}, "B",
                   {"key 'digests' (an object) in every record, found none at 'b.jsonl' line 3"});

  std::vector<std::string> bad_digest = lines;
  bad_digest[4].replace(bad_digest[4].find(digest(4, 1, 1)), 16, "not-a-hex-digest");
  write_lines("b.jsonl", bad_digest);
  expect_bad_input({"trace", "diff", "a.jsonl", "b.jsonl"}, "B",
                   {"'k_out': [", "\"not-a-hex-digest\"]", "'b.jsonl' line 5"});

  write_lines("b.jsonl", {lines[0], lines[1], lines[1]});
  expect_bad_input({"trace", "diff", "a.jsonl", "b.jsonl"}, "B",
                   {"expected seq 2", "found seq 1 at 'b.jsonl' line 3"});

  write_lines("b.jsonl", {lines[0], "", lines[1]});
  expect_bad_input({"trace", "diff", "a.jsonl", "b.jsonl"}, "B", {"'b.jsonl' line 2, column 1"});

  std::vector<std::string> bad_seq = lines;
  bad_seq[0].replace(0, 8, R"({"seq":-0)");
  write_lines("b.jsonl", bad_seq);
  expect_bad_input({"trace", "diff", "a.jsonl", "b.jsonl"}, "B",
                   {"a whole number as 'seq', found '-0' at 'b.jsonl' line 1"});

  write_lines("b.jsonl", {"[1]"});
  expect_bad_input({"trace", "diff", "a.jsonl", "b.jsonl"}, "B",
                   {"a JSON object per line, found an array at 'b.jsonl' line 1"});

  expect_bad_input({"trace", "diff", "absent.jsonl", "a.jsonl"}, "A",
                   {"a readable trace file", "'absent.jsonl'"});
  if (::geteuid() != 0) {  // root reads a file whatever its mode
    write_lines("private.jsonl", {});
    fs::permissions(work() / "private.jsonl", fs::perms::none);
    expect_bad_input({"trace", "diff", "private.jsonl", "a.jsonl"}, "A",
                     {"'private.jsonl' (Permission denied)"});
  }
  fs::create_directory(work() / "directory.jsonl");
  expect_bad_input({"trace", "diff", "a.jsonl", "directory.jsonl"}, "B",
                   {"'directory.jsonl' (not a regular file)"});
}

// A record cut short by a write that failed part-way (an old writer on a full disk, a
// process killed inside a long write) is named as such: at the end of the file, and
// with another record appended to it on the same line.
TEST_F(TraceDiffTest, TornRecordsAreNamed) {
  const std::vector<Call> calls = five_calls({});
  write_trace("a.jsonl", calls);
  const std::string first = record(0, calls[0]);
  const std::string second = record(1, calls[1]);
  std::ofstream(work() / "b.jsonl", std::ios::binary) << first << '\n' << second.substr(0, 50);
  expect_bad_input({"trace", "diff", "a.jsonl", "b.jsonl"}, "B",
                   {"found a record cut short at the end of the file (no newline after it: a "
                    "write that failed part-way, such as on a full disk) at 'b.jsonl' line 2"});

  // The torn record, then the next one glued to it: the line and the column where the
  // second record starts are named.
  write_lines("b.jsonl", {first, second.substr(0, 50) + record(2, calls[2])});
  expect_bad_input({"trace", "diff", "a.jsonl", "b.jsonl"}, "B",
                   {"found a record cut short and another record starting at column 51 of the "
                    "same line (a write that failed part-way, such as on a full disk, then "
                    "another record appended) at 'b.jsonl' line 2"});

  // A last record whole but for its newline is read.
  std::ofstream(work() / "b.jsonl", std::ios::binary) << first;
  const CliResult r = run({"trace", "diff", "b.jsonl", "b.jsonl"});
  EXPECT_EQ(r.status, 0) << r.err;
}

// Records of several sessions interleaved in one file (a parent and the workers it
// forked): each session's seq is checked on its own, and the sessions are taken in the
// order of their first records, so two files pair their sessions in that order.
TEST_F(TraceDiffTest, InterleavedSessionsArePairedInOrderOfTheirFirstRecord) {
  const auto in_session = [](std::string line, const std::string& session) {
    return line.insert(line.find(',') + 1, R"("session":")" + session + R"(",)");
  };
  std::vector<Call> calls = five_calls({});
  calls[3].samples = {0, 5};  // the two workers' calls differ
  // Parent p: calls 0, 2, 4; worker w1: call 1; worker w2: call 3 (numbered per session).
  write_lines("a.jsonl",
              {in_session(record(0, calls[0]), "p"), in_session(record(0, calls[1]), "w1"),
               in_session(record(1, calls[2]), "p"), in_session(record(0, calls[3]), "w2"),
               in_session(record(2, calls[4]), "p")});
  const CliResult same = run({"trace", "diff", "a.jsonl", "a.jsonl"});
  EXPECT_EQ(same.status, 0) << same.out << same.err;
  EXPECT_NE(same.out.find("sessions (trace openings) taken in order of their first record: 3 in "
                          "A, 3 in B"),
            std::string::npos)
      << same.out;
  // The same sessions, their records interleaved otherwise: identical.
  write_lines("b.jsonl",
              {in_session(record(0, calls[0]), "q"), in_session(record(1, calls[2]), "q"),
               in_session(record(0, calls[1]), "v1"), in_session(record(2, calls[4]), "q"),
               in_session(record(0, calls[3]), "v2")});
  EXPECT_EQ(run({"trace", "diff", "a.jsonl", "b.jsonl"}).status, 0);
  // The workers' first records in the other order: worker 2's call is set beside
  // worker 1's.
  write_lines("b.jsonl",
              {in_session(record(0, calls[0]), "q"), in_session(record(0, calls[3]), "v2"),
               in_session(record(1, calls[2]), "q"), in_session(record(0, calls[1]), "v1"),
               in_session(record(2, calls[4]), "q")});
  const CliResult swapped = run({"trace", "diff", "a.jsonl", "b.jsonl"});
  EXPECT_EQ(swapped.status, 1) << swapped.err;
  EXPECT_TRUE(swapped.out.starts_with("diverged at call #3 (A line 2, B line 2): ")) << swapped.out;
}

TEST_F(TraceDiffTest, BadSample) {
  write_trace("alone.jsonl", five_calls(of_samples({7})));
  write_trace("batch.jsonl", five_calls(of_samples({5, 7, 9})));
  for (const std::string sample : {"1", "1:", ":1", "a:b", "-1:0", "+1:0", "1:2:3", "0x1:0", ""}) {
    expect_bad_input({"trace", "diff", "alone.jsonl", "batch.jsonl", "--sample", sample},
                     "--sample", {"expected I:J"});
  }
  expect_bad_input({"trace", "diff", "alone.jsonl", "batch.jsonl", "--sample", "1:0"}, "--sample",
                   {"index 1 past the 1 elements of output 'q_out' at 'alone.jsonl' line 1"});
  expect_bad_input({"trace", "diff", "alone.jsonl", "batch.jsonl", "--sample", "0:3"}, "--sample",
                   {"index 3 past the 3 elements of output 'q_out' at 'batch.jsonl' line 1"});
  // The rank of an output comes from `tensors`: --sample cannot go without it.
  std::string record_0 = record(0, of_samples({7}));
  record_0.replace(record_0.find(R"("name":"k_out")"), 14, R"("name":"k_o")");
  write_lines("alone.jsonl", {record_0});
  expect_bad_input({"trace", "diff", "alone.jsonl", "batch.jsonl", "--sample", "0:0"}, "A",
                   {"a tensor named 'k_out' in 'tensors'", "none at 'alone.jsonl' line 1"});
}

TEST_F(TraceDiffTest, BadCommandLine) {
  write_trace("a.jsonl", five_calls({}));
  expect_bad_argument({"trace"}, "trace");
  expect_bad_argument({"trace", "compare", "a.jsonl", "a.jsonl"}, "trace");
  expect_bad_argument({"trace", "diff", "a.jsonl"}, "trace diff");
  expect_bad_argument({"trace", "diff", "--sample", "0:0", "a.jsonl", "a.jsonl"}, "trace diff");
  expect_bad_argument({"trace", "diff", "a.jsonl", "a.jsonl", "a.jsonl"}, "a.jsonl");
  expect_bad_argument({"trace", "diff", "a.jsonl", "a.jsonl", "--bogus", "1"}, "--bogus");
  expect_bad_argument({"trace", "diff", "a.jsonl", "a.jsonl", "--sample"}, "--sample");
  expect_bad_argument({"trace", "diff", "a.jsonl", "a.jsonl", "--sample", "0:0", "--sample", "0:0"},
                      "--sample");
}

TEST_F(TraceDiffTest, Help) {
  const std::string usage = "usage: kernel-align trace diff A.jsonl B.jsonl [--sample I:J]\n";
  EXPECT_TRUE(run_ok({"trace", "--help"}).starts_with(usage));
  EXPECT_TRUE(run_ok({"help", "trace"}).starts_with(usage));
  EXPECT_NE(run_ok({"--help"}).find(usage), std::string::npos);
  const CliResult r = run({"frobnicate"});
  EXPECT_NE(r.err.find(", trace, "), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kernel_align::cli::test
