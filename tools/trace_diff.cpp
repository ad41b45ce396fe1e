#include "trace_diff.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <ostream>
#include <span>
#include <tuple>

#include "cli_args.hpp"
#include "json.hpp"
#include "kernel_align/error.hpp"
#include "messages.hpp"

namespace kernel_align::cli {
namespace {

constexpr std::string_view kSampleFlag = "--sample";
constexpr FlagSpec kDiffFlags[] = {{kSampleFlag}};

// The digests are hex text; 16 digits is 64 bits (docs/trace.md, digest-v1).
constexpr std::size_t kDigestDigits = 16;
// Longer values in the side-by-side table push their row's B value right rather than
// every row's: a list of tensors can take hundreds of characters.
constexpr std::size_t kMaxColumnWidth = 40;

struct Sample {
  std::size_t a = 0;  // I: the element of each output of A's call
  std::size_t b = 0;  // J: the element of the same output of B's call
};

struct Output {
  std::string name;
  std::vector<std::string> digests;  // one per batch element, or one for the whole tensor
  // Whether `digests` holds one digest per batch element, which is what --sample picks
  // from: a library output of rank 4, a module output whose tensor has a `batch_dim`.
  // Absent when `tensors` does not list the output.
  std::optional<bool> per_sample;

  bool batched() const { return per_sample == true; }
};

struct Record {
  std::size_t line = 0;  // in its file, from 1
  std::string session;   // "" in traces written before sessions were recorded
  std::uint64_t seq = 0;
  std::string op;  // a module record's: the module's qualified name
  std::string direction;
  // Module records (kernel_align.alignment, "kind": "module"): the module's class and
  // which call of it this is, counted per module and direction.
  bool module = false;
  std::string module_type;
  std::uint64_t call = 0;
  std::vector<Output> outputs;  // in the order of `digests`
  json::Value fields;           // the whole record, for the side-by-side table
};

struct Trace {
  std::string role;  // "A" or "B": errors name the argument by its place in the synopsis
  std::string path;
  // Every session's calls in seq order, the sessions in the order of their first record.
  std::vector<Record> calls;
  std::size_t sessions = 0;
  bool has_modules = false;  // a model trace: some record is a module record
};

// Fields that say which run wrote a record, not what it computed: never a divergence.
bool identifies_the_run(std::string_view key) {
  return key == "session" || key == "pid";
}

std::string at(const Trace& trace, std::size_t line) {
  return " at " + single_quoted(trace.path) + " line " + std::to_string(line);
}

[[noreturn]] void fail(const Trace& trace, std::size_t line, const std::string& expected,
                       const std::string& found) {
  throw Error(trace.role, expected, found + at(trace, line));
}

std::string kind_name(json::Value::Kind kind) {
  switch (kind) {
    case json::Value::Kind::Null:
      return "null";
    case json::Value::Kind::Boolean:
      return "a boolean";
    case json::Value::Kind::Number:
      return "a number";
    case json::Value::Kind::String:
      return "a string";
    case json::Value::Kind::Array:
      return "an array";
    case json::Value::Kind::Object:
      return "an object";
  }
  return "an unknown value";
}

// The member `key` of a record, which must be there and of `kind`.
const json::Value& field(const Trace& trace, std::size_t line, const json::Value& record,
                         std::string_view key, json::Value::Kind kind) {
  const json::Value* value = record.find(key);
  if (value == nullptr || value->kind != kind) {
    fail(trace, line, "key " + single_quoted(key) + " (" + kind_name(kind) + ") in every record",
         value == nullptr ? "none" : kind_name(value->kind));
  }
  return *value;
}

// Whether output `name` has one digest per batch element, from its entry in `tensors`:
// rank 4 for the library's outputs, a number as `batch_dim` for a module's.
std::optional<bool> per_sample(const json::Value& record, std::string_view name, bool module) {
  const json::Value* tensors = record.find("tensors");
  if (tensors == nullptr) return std::nullopt;
  for (const json::Value& tensor : tensors->items) {
    const json::Value* tensor_name = tensor.find("name");
    if (tensor_name == nullptr || tensor_name->text != name) continue;
    if (module) {
      const json::Value* batch_dim = tensor.find("batch_dim");
      if (batch_dim == nullptr) return std::nullopt;
      return batch_dim->kind == json::Value::Kind::Number;
    }
    const json::Value* shape = tensor.find("shape");
    if (shape != nullptr && shape->kind == json::Value::Kind::Array) {
      return shape->items.size() == 4;
    }
  }
  return std::nullopt;
}

bool is_digest(const json::Value& v) {
  return v.kind == json::Value::Kind::String && v.text.size() == kDigestDigits &&
         v.text.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos;
}

// `text` is line `line`; `terminated`: whether a newline follows it.
Record read_record(const Trace& trace, std::size_t line, std::string_view text, bool terminated) {
  Record record;
  record.line = line;
  try {
    record.fields = json::parse(text);
  } catch (const json::SyntaxError& e) {
    // A write that failed part-way and was not cut back (docs/trace.md) leaves a record
    // cut short: at the end of the file, or with the next record appended to it.
    const std::string cause = "a write that failed part-way, such as on a full disk";
    if (!terminated && text.starts_with('{')) {
      fail(trace, line, "one JSON record per line",
           "a record cut short at the end of the file (no newline after it: " + cause + ")");
    }
    if (const std::size_t next = text.find(R"({"seq":)", 1); next != std::string_view::npos) {
      fail(trace, line, "one JSON record per line",
           "a record cut short and another record starting at column " + std::to_string(next + 1) +
               " of the same line (" + cause + ", then another record appended)");
    }
    throw Error(trace.role, e.expected() + " (one JSON record per line)",
                e.found() + at(trace, line) + ", column " + std::to_string(e.column()));
  }
  if (record.fields.kind != json::Value::Kind::Object) {
    fail(trace, line, "a JSON object per line", kind_name(record.fields.kind));
  }
  const std::string& seq = field(trace, line, record.fields, "seq", json::Value::Kind::Number).text;
  if (!parse_whole(seq, record.seq)) {
    fail(trace, line, "a whole number as 'seq'", single_quoted(seq));
  }
  if (record.fields.find("session") != nullptr) {
    record.session = field(trace, line, record.fields, "session", json::Value::Kind::String).text;
  }
  record.op = field(trace, line, record.fields, "op", json::Value::Kind::String).text;
  record.direction = field(trace, line, record.fields, "direction", json::Value::Kind::String).text;
  if (const json::Value* kind = record.fields.find("kind")) {
    const std::string& name =
        field(trace, line, record.fields, "kind", json::Value::Kind::String).text;
    if (name != "module") {
      fail(trace, line, "'kind' \"module\" (library records have no 'kind')", json::compact(*kind));
    }
    record.module = true;
    record.module_type =
        field(trace, line, record.fields, "module_type", json::Value::Kind::String).text;
    const std::string& call =
        field(trace, line, record.fields, "call", json::Value::Kind::Number).text;
    if (!parse_whole(call, record.call)) {
      fail(trace, line, "a whole number as 'call'", single_quoted(call));
    }
  }
  const json::Value& digests =
      field(trace, line, record.fields, "digests", json::Value::Kind::Object);
  for (const json::Member& output : digests.members) {
    // An empty list is a rank-4 output of batch 0.
    if (output.value.kind != json::Value::Kind::Array ||
        !std::all_of(output.value.items.begin(), output.value.items.end(), is_digest)) {
      fail(trace, line,
           "lists of " + std::to_string(kDigestDigits) + "-hex-digit strings in 'digests'",
           single_quoted(output.key) + ": " + json::compact(output.value));
    }
    Output& o = record.outputs.emplace_back();
    o.name = output.key;
    for (const json::Value& digest : output.value.items) o.digests.push_back(digest.text);
    o.per_sample = per_sample(record.fields, output.key, record.module);
  }
  return record;
}

std::string read_text(const Trace& trace) {
  std::error_code error;
  const auto status = std::filesystem::status(trace.path, error);
  if (error) {
    throw Error(trace.role, "a readable trace file",
                single_quoted(trace.path) + " (" + error.message() + ")");
  }
  if (!std::filesystem::is_regular_file(status)) {
    throw Error(trace.role, "a readable trace file",
                single_quoted(trace.path) + " (not a regular file)");
  }
  std::ifstream in(trace.path, std::ios::binary);
  if (!in) {
    throw Error(trace.role, "a readable trace file",
                single_quoted(trace.path) + " (" + std::strerror(errno) + ")");
  }
  return {std::istreambuf_iterator<char>(in), {}};
}

// The records of a trace file, one per line. Each opening of a trace (a process, or a
// set_trace_path) is a session whose seq counts its calls from 0; processes sharing a
// file interleave their records, and calls may complete (and so be written) in another
// order than they started in. So records are grouped by session, in the order of each
// session's first record, and ordered by seq within it.
Trace read_trace(std::string role, std::string path) {
  Trace trace;
  trace.role = std::move(role);
  trace.path = std::move(path);
  const std::string text = read_text(trace);
  std::vector<std::string> sessions;                    // in order of first appearance
  std::vector<std::pair<std::size_t, Record>> records;  // (session index, record)
  std::size_t line = 0;
  for (std::size_t start = 0; start < text.size();) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    Record record = read_record(trace, ++line, std::string_view(text).substr(start, end - start),
                                end < text.size());
    const auto known = std::find(sessions.begin(), sessions.end(), record.session);
    const auto index = static_cast<std::size_t>(known - sessions.begin());
    if (known == sessions.end()) sessions.push_back(record.session);
    records.emplace_back(index, std::move(record));
    start = end + 1;
  }
  std::stable_sort(records.begin(), records.end(), [](const auto& x, const auto& y) {
    return x.first != y.first ? x.first < y.first : x.second.seq < y.second.seq;
  });
  std::uint64_t expected_seq = 0;
  for (std::size_t n = 0; n < records.size(); ++n) {
    if (n > 0 && records[n].first != records[n - 1].first) expected_seq = 0;
    const Record& record = records[n].second;
    if (record.seq != expected_seq) {
      fail(trace, record.line,
           "seq " + std::to_string(expected_seq) + " (seq counts a session's calls from 0)",
           "seq " + std::to_string(record.seq));
    }
    ++expected_seq;
    trace.has_modules = trace.has_modules || record.module;
    trace.calls.push_back(record);
  }
  trace.sessions = sessions.size();
  return trace;
}

// --sample needs every output's rank, and every batched output to have element `index`.
void check_sample_index(const Trace& trace, std::size_t index) {
  for (const Record& record : trace.calls) {
    for (const Output& output : record.outputs) {
      if (!output.per_sample) {
        fail(trace, record.line,
             "a tensor named " + single_quoted(output.name) + " in 'tensors'" +
                 (record.module ? " with a 'batch_dim'" : "") +
                 " (it says whether --sample picks from its digests)",
             "none");
      }
      if (output.batched() && index >= output.digests.size()) {
        throw Error(std::string(kSampleFlag), "element indices within every output's batch",
                    "index " + std::to_string(index) + " past the " +
                        std::to_string(output.digests.size()) + " elements of output " +
                        single_quoted(output.name) + at(trace, record.line));
      }
    }
  }
}

Sample parse_sample(std::string_view text) {
  const std::size_t colon = text.find(':');
  Sample sample;
  if (colon == std::string_view::npos || !parse_whole(text.substr(0, colon), sample.a) ||
      !parse_whole(text.substr(colon + 1), sample.b)) {
    throw Error(std::string(kSampleFlag), "I:J, an element index of A and one of B, such as 0:2",
                single_quoted(text));
  }
  return sample;
}

struct Tally {
  std::size_t digests_compared = 0;
  std::size_t outputs_skipped = 0;  // single-digest outputs, under --sample
};

const Output* find_output(const Record& record, std::string_view name) {
  for (const Output& o : record.outputs) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

std::string digest_difference(const std::string& output, std::size_t i, std::size_t j,
                              const std::string& digest_a, const std::string& digest_b) {
  return "output " + output + " element " + std::to_string(i) + " vs " + std::to_string(j) + ": " +
         digest_a + " != " + digest_b;
}

// Why the call of A and the call of B at the same position differ, or nothing.
std::optional<std::string> compare_calls(const Record& a, const Record& b,
                                         const std::optional<Sample>& sample, Tally& tally) {
  if (a.op != b.op) return "different op: " + a.op + " vs " + b.op;
  if (a.direction != b.direction)
    return "different direction: " + a.direction + " vs " + b.direction;
  for (const Output& output_a : a.outputs) {
    const Output* output_b = find_output(b, output_a.name);
    if (output_b == nullptr) return "output " + output_a.name + " present in A only";
    const std::vector<std::string>& da = output_a.digests;
    const std::vector<std::string>& db = output_b->digests;
    if (sample) {
      const bool modules = a.module && b.module;
      if (modules && output_a.batched() != output_b->batched()) {
        return "output " + output_a.name + " has one digest per sample in " +
               (output_a.batched() ? "A" : "B") + " only";
      }
      if (output_a.batched() && output_b->batched()) {
        ++tally.digests_compared;
        if (da[sample->a] != db[sample->b]) {
          return digest_difference(output_a.name, sample->a, sample->b, da[sample->a],
                                   db[sample->b]);
        }
        continue;
      }
      // An output without the batch: a module's (a table of positions, say) is compared
      // whole below; a library output's (dw, a sum over the batch) cannot be, and is
      // skipped.
      if (!modules) {
        ++tally.outputs_skipped;
        continue;
      }
    }
    if (da.size() != db.size()) {
      return "output " + output_a.name + " has " + std::to_string(da.size()) + " digests in A, " +
             std::to_string(db.size()) + " in B";
    }
    for (std::size_t i = 0; i < da.size(); ++i) {
      ++tally.digests_compared;
      if (da[i] != db[i]) return digest_difference(output_a.name, i, i, da[i], db[i]);
    }
  }
  for (const Output& output_b : b.outputs) {
    if (find_output(a, output_b.name) == nullptr) {
      return "output " + output_b.name + " present in B only";
    }
  }
  return std::nullopt;
}

std::string padded(std::string text, std::size_t width) {
  if (text.size() < width) text.append(width - text.size(), ' ');
  return text;
}

// Both records, one row per key (A's keys in order, then any only B has; the digests
// aside), '*' marking the rows that differ. Returns the keys of those rows.
std::vector<std::string> print_side_by_side(std::ostream& out, const json::Value& a,
                                            const json::Value& b) {
  struct Row {
    std::string key, a, b;
  };
  std::vector<Row> rows;
  for (const json::Value* record : {&a, &b}) {
    for (const json::Member& m : record->members) {
      const bool listed =
          std::any_of(rows.begin(), rows.end(), [&](const Row& row) { return row.key == m.key; });
      if (m.key == "digests" || identifies_the_run(m.key) || listed) continue;
      const json::Value* value_a = a.find(m.key);
      const json::Value* value_b = b.find(m.key);
      rows.push_back({m.key, value_a != nullptr ? json::compact(*value_a) : "(absent)",
                      value_b != nullptr ? json::compact(*value_b) : "(absent)"});
    }
  }
  std::size_t key_width = 5;  // "field"
  std::size_t a_width = 1;
  for (const Row& row : rows) {
    key_width = std::max(key_width, row.key.size());
    if (row.a.size() <= kMaxColumnWidth) a_width = std::max(a_width, row.a.size());
  }
  out << "  " << padded("field", key_width) << "  " << padded("A", a_width) << "  B\n";
  std::vector<std::string> differing;
  for (const Row& row : rows) {
    const bool differs = row.a != row.b;
    if (differs) differing.push_back(row.key);
    out << (differs ? "* " : "  ") << padded(row.key, key_width) << "  " << padded(row.a, a_width)
        << "  " << row.b << '\n';
  }
  return differing;
}

// The records of a divergence side by side, and the fields that differ.
void print_records(std::ostream& out, const Record& a, const Record& b) {
  const std::vector<std::string> differing = print_side_by_side(out, a.fields, b.fields);
  out << "differing fields: ";
  if (differing.empty()) out << "none (same configuration, different bytes)";
  for (const std::string& key : differing) out << (&key == &differing.front() ? "" : ", ") << key;
  out << '\n';
}

void print_divergence(std::ostream& out, std::size_t call, const Record& a, const Record& b,
                      const std::string& reason) {
  out << "diverged at call #" << call << " (A line " << a.line << ", B line " << b.line
      << "): " << reason << '\n';
  print_records(out, a, b);
}

// A call's place in a model trace: a module call by (module, direction, call index),
// a library call by (op, direction, how many calls of that op and direction came before
// it), so that a module that one run calls more often, or not at all, shifts nothing.
struct Key {
  bool module = false;
  std::string name;
  std::string direction;
  std::uint64_t index = 0;
  // (Not a defaulted operator<=>: clang-tidy 14 misreads its synthesised 0 as a null
  // pointer constant, modernize-use-nullptr.)
  bool operator<(const Key& other) const {
    return std::tie(module, name, direction, index) <
           std::tie(other.module, other.name, other.direction, other.index);
  }
};

std::vector<Key> keys_of(const Trace& trace) {
  std::map<std::pair<std::string, std::string>, std::uint64_t> library_calls;
  std::map<Key, std::size_t> seen;  // key -> line
  std::vector<Key> keys;
  for (const Record& r : trace.calls) {
    Key key{r.module, r.op, r.direction, r.module ? r.call : library_calls[{r.op, r.direction}]++};
    if (const auto [it, added] = seen.emplace(key, r.line); !added) {
      fail(trace, r.line,
           "one record per (module, direction, call) in a model trace (one run per file)",
           "call " + std::to_string(key.index) + " of module " + single_quoted(key.name) +
               " again, first at line " + std::to_string(it->second));
    }
    keys.push_back(std::move(key));
  }
  return keys;
}

std::string describe(const Key& key) {
  return std::string(key.module ? "module call " : "library call ") + key.name + " #" +
         std::to_string(key.index) + " (" + key.direction + ")";
}

// The summary's row of a record: a module's class, or the library's op.
std::string type_of(const Record& r) {
  return r.module ? r.module_type : r.op + " (kernel-align)";
}

struct TypeCounts {
  std::string type;
  std::size_t matching = 0;
  std::size_t differing = 0;
  std::size_t missing = 0;
};

TypeCounts& counts_of(std::vector<TypeCounts>& summary, const std::string& type) {
  for (TypeCounts& c : summary) {
    if (c.type == type) return c;
  }
  return summary.emplace_back(TypeCounts{type});
}

// Two model traces: calls aligned by key rather than position. Reports the first
// divergence in A's call order (or, when every call of A matches, the first call of B
// that A lacks), then how many calls of each module type match, differ or are missing.
int model_trace_diff(const Trace& a, const Trace& b, const std::optional<Sample>& sample,
                     std::ostream& out) {
  const std::vector<Key> keys_a = keys_of(a);
  const std::vector<Key> keys_b = keys_of(b);
  std::map<Key, std::size_t> index_b;
  for (std::size_t j = 0; j < keys_b.size(); ++j) index_b.emplace(keys_b[j], j);
  std::vector<bool> matched_b(keys_b.size(), false);
  std::vector<TypeCounts> summary;
  Tally tally;
  struct First {
    const Record* a = nullptr;
    const Record* b = nullptr;
    const Key* key = nullptr;
    std::string reason;
  };
  std::optional<First> first;
  std::size_t modules = 0;
  std::size_t library = 0;
  for (std::size_t i = 0; i < keys_a.size(); ++i) {
    const Record& ra = a.calls[i];
    TypeCounts& counts = counts_of(summary, type_of(ra));
    const auto found = index_b.find(keys_a[i]);
    if (found == index_b.end()) {
      ++counts.missing;
      if (!first) first = First{&ra, nullptr, &keys_a[i], "in A only"};
      continue;
    }
    const Record& rb = b.calls[found->second];
    matched_b[found->second] = true;
    if (auto reason = compare_calls(ra, rb, sample, tally)) {
      ++counts.differing;
      if (!first) first = First{&ra, &rb, &keys_a[i], std::move(*reason)};
    } else {
      ++counts.matching;
      ++(ra.module ? modules : library);
    }
  }
  for (std::size_t j = 0; j < keys_b.size(); ++j) {
    if (matched_b[j]) continue;
    ++counts_of(summary, type_of(b.calls[j])).missing;
    if (!first) first = First{nullptr, &b.calls[j], &keys_b[j], "in B only"};
  }
  if (first) {
    out << "diverged at " << describe(*first->key) << " (";
    if (first->a != nullptr) out << "A line " << first->a->line;
    if (first->a != nullptr && first->b != nullptr) out << ", ";
    if (first->b != nullptr) out << "B line " << first->b->line;
    out << "): " << first->reason << '\n';
    if (first->a != nullptr && first->b != nullptr) print_records(out, *first->a, *first->b);
  } else {
    out << "identical: " << modules << " module calls and " << library
        << " library calls matched by (name, direction, call index), " << tally.digests_compared
        << " digests compared";
    if (tally.outputs_skipped > 0) {
      out << ", " << tally.outputs_skipped << " single-digest outputs skipped (--sample)";
    }
    out << '\n';
  }
  out << "by module type (calls matching, differing, missing):\n";
  for (const TypeCounts& c : summary) {
    out << "  " << c.type << ": " << c.matching << " matching, " << c.differing << " differing, "
        << c.missing << " missing\n";
  }
  return first ? kExitDiverged : kExitIdentical;
}

int trace_diff(const std::string& path_a, const std::string& path_b,
               const std::optional<Sample>& sample, std::ostream& out) {
  const Trace a = read_trace("A", path_a);
  const Trace b = read_trace("B", path_b);
  if (sample) {
    check_sample_index(a, sample->a);
    check_sample_index(b, sample->b);
  }
  if (a.has_modules && b.has_modules) return model_trace_diff(a, b, sample, out);
  Tally tally;
  const std::size_t common = std::min(a.calls.size(), b.calls.size());
  for (std::size_t n = 0; n < common; ++n) {
    if (const auto reason = compare_calls(a.calls[n], b.calls[n], sample, tally)) {
      print_divergence(out, n, a.calls[n], b.calls[n], *reason);
      return kExitDiverged;
    }
  }
  if (a.calls.size() != b.calls.size()) {
    // The longer trace's next call has nothing to be set beside: no table.
    const Trace& longer = a.calls.size() > b.calls.size() ? a : b;
    const Trace& shorter = &longer == &a ? b : a;
    out << "diverged at call #" << common << " (" << longer.role << " line "
        << longer.calls[common].line << ", end of " << shorter.role
        << "): different call counts: A has " << a.calls.size() << ", B has " << b.calls.size()
        << '\n';
    return kExitDiverged;
  }
  out << "identical: " << common << " calls, " << tally.digests_compared << " digests compared";
  if (tally.outputs_skipped > 0) {
    out << ", " << tally.outputs_skipped << " single-digest outputs skipped (--sample)";
  }
  if (a.sessions > 1 || b.sessions > 1) {
    out << "; sessions (trace openings) taken in order of their first record: " << a.sessions
        << " in A, " << b.sessions << " in B";
  }
  out << '\n';
  return kExitIdentical;
}

}  // namespace

int run_trace_command(const std::vector<std::string>& args, std::ostream& out) {
  if (args.empty() || args[0] != "diff") {
    throw Error("trace", "the subcommand diff", args.empty() ? "none" : single_quoted(args[0]));
  }
  // The two files come first, as in the synopsis; only flags follow them.
  const auto is_file = [&](std::size_t i) { return i < args.size() && !args[i].starts_with("--"); };
  if (!is_file(1) || !is_file(2)) {
    throw Error("trace diff", "two trace files A.jsonl B.jsonl before any flag",
                is_file(1) ? "only " + single_quoted(args[1]) : "none");
  }
  const std::span<const std::string> flag_tokens = std::span(args).subspan(3);
  const Args flags(flag_tokens, kDiffFlags);
  const std::optional<std::string> sample = flags.optional(kSampleFlag);
  return trace_diff(args[1], args[2], sample ? std::optional(parse_sample(*sample)) : std::nullopt,
                    out);
}

}  // namespace kernel_align::cli
