// kernel-align verify: every available CPU backend (each ISA path of simd) against the
// reference backend, over every op, direction, dtype, pairing, mode, layout and activation at the
// issue's shapes, with batch- and thread-count invariance (docs/verify.md).
#include "verify.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <future>
#include <optional>
#include <ostream>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "cases/bytes.hpp"
#include "cases/configs.hpp"
#include "cases/inputs.hpp"
#include "cases/parallel.hpp"
#include "cases/shapes.hpp"
#include "cli_args.hpp"
#include "kernel_align/contract/version.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/positions.hpp"
#include "kernel_align/registry.hpp"
#include "kernel_align/runtime.hpp"
#include "kernel_align/tables.hpp"
#include "messages.hpp"
#include "npy.hpp"
#include "output_files.hpp"
#include "tensor_io.hpp"
#include "verify_cases.hpp"

namespace kernel_align::cli {
namespace {

namespace fs = std::filesystem;
using cases::byte_difference;
using cases::Config;
using cases::config_words;
using cases::kHeadDim;
using cases::Random;
using cases::seed_of;
using cases::Shape;
using cases::ShapeTables;

constexpr std::array<FlagSpec, 3> kVerifyFlags{
    {{"--quick"}, {"--shape", true}, file_flag("--json")}};
constexpr std::string_view kQuickFlag = "--quick";
constexpr std::string_view kReferenceBackend = "reference";
// The only backend with ISA paths to choose from (set_isa).
constexpr std::string_view kSimdBackend = "simd";
using verify_cases::Case;
using verify_cases::compute;
using verify_cases::kBatch;
using verify_cases::kSampleSlot;
using verify_cases::Outputs;
constexpr float kInputLow = -4.0f, kInputWidth = 8.0f;   // activations, gradients
constexpr float kWeightLow = 0.5f, kWeightWidth = 1.0f;  // near 1, as trained norm weights are

// A backend as verify runs it: simd once per ISA path, any other backend as it is.
struct Variant {
  std::string backend;
  std::optional<Isa> isa;

  std::string label() const { return isa ? backend + "/" + isa_name(*isa) : backend; }
};

struct SkippedBackend {
  std::string name;
  std::string reason;
};

struct Backends {
  std::vector<Variant> variants;
  std::vector<SkippedBackend> skipped;  // registered on the CPU but not available here
};

// Every CPU backend of the registry except the reference, in registry order.
Backends backends_to_verify() {
  std::vector<BackendStatus> cpu;
  for (const RegistryRow& row : registry_table()) {
    if (row.platform != Platform::Cpu) continue;
    for (const BackendStatus& b : row.backends) {
      const bool seen = std::any_of(cpu.begin(), cpu.end(),
                                    [&](const BackendStatus& s) { return s.name == b.name; });
      if (!seen) cpu.push_back(b);
    }
  }
  Backends backends;
  for (const BackendStatus& b : cpu) {
    if (b.name == kReferenceBackend) continue;
    if (!b.available) {
      backends.skipped.push_back({b.name, b.unavailable_reason});
    } else if (b.name == kSimdBackend) {
      for (int i = static_cast<int>(Isa::Portable); i <= static_cast<int>(best_isa()); ++i) {
        backends.variants.push_back({b.name, static_cast<Isa>(i)});
      }
    } else {
      backends.variants.push_back({b.name, std::nullopt});
    }
  }
  return backends;
}

// The thread counts of the invariance check: the main run uses max(2, hardware
// threads), the others compare against it.
struct ThreadCounts {
  int main = 2;
  std::vector<int> others;
};

// "1 thread", "3 threads"
std::string thread_words(int n) {
  return std::to_string(n) + (n == 1 ? " thread" : " threads");
}

ThreadCounts thread_counts() {
  ThreadCounts counts;
  counts.main = std::max(2, static_cast<int>(std::thread::hardware_concurrency()));
  for (const int n : {1, 3}) {
    if (n != counts.main) counts.others.push_back(n);
  }
  return counts;
}

using verify_cases::reused_array;

// The op's cases (ops/<op>.cpp).
const verify_cases::OpCases& op_cases_of(OpType op) {
  static const std::array<verify_cases::OpCases, kOpCount> op_cases{{
#define KERNEL_ALIGN_OP_CASES(Enumerator, name) verify_cases::name##_cases(),
      KERNEL_ALIGN_OPS(KERNEL_ALIGN_OP_CASES)
#undef KERNEL_ALIGN_OP_CASES
  }};
  return op_cases[static_cast<std::size_t>(op)];
}

// `c` as the case of `config` at `shape`: its seeded inputs in c's arrays.
void set_case(Case& c, const Config& config, const Shape& shape, const ShapeTables& tables) {
  c.config = &config;
  c.shape = &shape;
  c.tables = &tables;
  // The numbers depend on the op, direction, dtype and shape, not on the pairing, mode
  // or layout: the configurations of one (op, direction, dtype), next to each other in
  // all_configs, share them, drawn once (a layout only changes which element a number
  // is). Drawing them per configuration was a tenth of the matrix's CPU time.
  const std::uint64_t seed =
      seed_of(std::string(op_type_name(config.op)) + " " + direction_name(config.direction) + " " +
              dtype_name(config.dtype) + " " + shape.name);
  const bool drawn = c.seed == seed;
  c.seed = seed;
  Random random(seed);
  c.inputs = op_cases_of(config.op).inputs(config, tables, shape.heads);
  c.options = op_cases_of(config.op).options;
  c.arrays.resize(c.inputs.size());
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    const DType dtype = c.inputs[i].fp32 ? DType::F32 : config.dtype;
    NpyArray& a = reused_array(c.arrays[i], npy_type_of(dtype), c.inputs[i].shape);
    if (drawn) continue;
    if (c.inputs[i].batched) {
      cases::fill_uniform(random, dtype, a.data, kInputLow, kInputWidth);
    } else {
      cases::fill_uniform(random, dtype, a.data, kWeightLow, kWeightWidth);
    }
  }
}

// Runs `c` on `backend` (and, when set, ISA path `isa`); throws when the call ran
// anywhere else, so that no fallback passes for the backend under test.
void compute_on(const std::string& backend, std::optional<Isa> isa, const Case& c, bool whole_batch,
                Outputs& outputs) {
  compute(c, whole_batch, outputs);
  const CallReport call = last_call();
  if (call.backend != backend) {
    throw std::runtime_error("the call ran on " + call.backend + ", not " + backend +
                             (call.fallback.empty() ? "" : " (fallback: " + call.fallback + ")"));
  }
  if (isa && call.isa != isa_name(*isa)) {
    throw std::runtime_error("the call ran on isa " + call.isa + ", not " + isa_name(*isa));
  }
}

// "" when every output has the expected bytes, else the differences ("; "-joined).
std::string outputs_difference(const Outputs& expected, const Outputs& found) {
  std::string differences;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const std::string d = byte_difference(expected[i].name, npy_type_size(expected[i].array.type),
                                          expected[i].array.data, found[i].array.data);
    if (!d.empty()) differences += (differences.empty() ? "" : "; ") + d;
  }
  return differences;
}

// "" when each per-sample output of the sample alone has the bytes of its element in
// the batch. Both layouts put the batch outermost, so the element is one byte range.
std::string batch_difference(const Outputs& alone, const Outputs& batched) {
  std::string differences;
  for (std::size_t i = 0; i < alone.size(); ++i) {
    if (!alone[i].per_sample) continue;
    const std::span<const std::byte> sample = alone[i].array.data;
    const std::span<const std::byte> element =
        std::span<const std::byte>(batched[i].array.data)
            .subspan(static_cast<std::size_t>(kSampleSlot) * sample.size(), sample.size());
    const std::string d =
        byte_difference(alone[i].name, npy_type_size(alone[i].array.type), sample, element);
    if (!d.empty()) differences += (differences.empty() ? "" : "; ") + d;
  }
  return differences;
}

enum Check : std::size_t { kReferenceCheck, kBatchCheck, kThreadsCheck, kChecks };
constexpr std::array<const char*, kChecks> kCheckNames{"reference", "batch", "threads"};

struct Cell {
  std::size_t variant = 0;
  std::size_t config = 0;
  std::size_t shape = 0;
  std::array<std::string, kChecks> failures;  // "" where the check passed

  bool pass() const {
    return std::all_of(failures.begin(), failures.end(),
                       [](const std::string& f) { return f.empty(); });
  }
};

// "" when `check` returns "", else its reason; an exception is a reason too.
std::string attempt(const std::function<std::string()>& check) {
  try {
    return check();
  } catch (const std::exception& e) {
    return e.what();
  }
}

// The outputs of the calls of a case, reused from case to case of a shape.
struct CaseOutputs {
  Outputs expected;            // the reference backend's, shared by every variant
  std::string expected_error;  // why the reference could not give them, "" when it did
  Outputs sample;              // the variant's, on the sample alone with the main thread count
  Outputs other;               // the variant's on the batch, or with another thread count
};

// The reference's outputs of a case, on a thread of its own (set_thread_backend) beside
// the variants' calls: the reference is scalar and single-threaded, and the matrix spent
// a quarter of its time waiting for it with one core idle.
std::future<void> start_expected(const Case& c, CaseOutputs& outputs) {
  return std::async(std::launch::async, [&c, &outputs] {
    outputs.expected_error = attempt([&] {
      set_thread_backend(kReferenceBackend);
      compute_on(std::string(kReferenceBackend), std::nullopt, c, false, outputs.expected);
      return std::string();
    });
  });
}

// The three checks of one variant on one case; the reference check compares last, once
// `expected` (start_expected) is ready.
void verify_cell(const Variant& variant, const Case& c, const ThreadCounts& threads,
                 const std::shared_future<void>& expected, CaseOutputs& outputs, Cell& cell) {
  const auto run = [&](int thread_count, bool whole_batch, Outputs& into) -> const Outputs& {
    set_backend(variant.backend);
    if (variant.isa) set_isa(*variant.isa);
    set_num_threads(thread_count);
    compute_on(variant.backend, variant.isa, c, whole_batch, into);
    return into;
  };
  bool sample_ran = false;
  const std::string sample_error = attempt([&] {
    run(threads.main, false, outputs.sample);
    sample_ran = true;
    return std::string();
  });
  if (!sample_ran) {
    const std::string not_run = "not run: the sample's call failed";
    cell.failures[kReferenceCheck] = sample_error;
    cell.failures[kBatchCheck] = not_run;
    cell.failures[kThreadsCheck] = not_run;
    return;
  }
  cell.failures[kBatchCheck] = attempt([&] {
    const std::string d = batch_difference(outputs.sample, run(threads.main, true, outputs.other));
    return d.empty() ? d
                     : "element " + std::to_string(kSampleSlot) + " of a batch of " +
                           std::to_string(kBatch) + " vs alone: " + d;
  });
  cell.failures[kThreadsCheck] = attempt([&] {
    for (const int n : threads.others) {
      const std::string d = outputs_difference(outputs.sample, run(n, false, outputs.other));
      if (!d.empty()) {
        return thread_words(n) + " vs " + thread_words(threads.main) + ": " + d;
      }
    }
    return std::string();
  });
  expected.wait();
  cell.failures[kReferenceCheck] = outputs.expected_error.empty()
                                       ? outputs_difference(outputs.expected, outputs.sample)
                                       : "the reference backend failed: " + outputs.expected_error;
}

// Puts the backend override, ISA path and thread count back as they were.
class SettingsGuard {
 public:
  SettingsGuard() : backend_(backend_override()), isa_(isa()), threads_(num_threads()) {}
  ~SettingsGuard() {
    set_backend(backend_);
    set_isa(isa_);
    set_num_threads(threads_);
  }
  SettingsGuard(const SettingsGuard&) = delete;
  SettingsGuard& operator=(const SettingsGuard&) = delete;

 private:
  std::string backend_;
  Isa isa_;
  int threads_;
};

// "verify: [ 37/672] simd/avx2 qk_norm_rope backward bf16 half diffusers bhsd t2i_1328x1328",
// one line per cell, or one line rewritten in place on a terminal.
class Progress {
 public:
  Progress(std::ostream& out, bool terminal, std::size_t total)
      : out_(out), terminal_(terminal), total_(total), width_(std::to_string(total).size()) {}

  void step(const std::string& what) {
    std::string count = std::to_string(++done_);
    count.insert(0, width_ - count.size(), ' ');
    out_ << (terminal_ ? "\r" : "") << "verify: [" << count << '/' << total_ << "] " << what
         << (terminal_ ? "\x1b[K" : "\n") << std::flush;
  }

  void finish(double seconds) {
    char line[96];
    std::snprintf(line, sizeof line, "verify: %zu cells in %.1f s", done_, seconds);
    out_ << (terminal_ ? "\r" : "") << line << (terminal_ ? "\x1b[K\n" : "\n") << std::flush;
  }

 private:
  std::ostream& out_;
  bool terminal_;
  std::size_t total_;
  std::size_t width_;
  std::size_t done_ = 0;
};

struct Options {
  bool quick = false;
  std::vector<Shape> shapes;
  std::optional<fs::path> json;
};

Options parse_options(const std::vector<std::string>& tokens) {
  Options options;
  // --quick takes no value, unlike every flag Args knows: it is taken out first.
  std::vector<std::string> rest;
  for (const std::string& t : tokens) {
    if (t == kQuickFlag) {
      options.quick = true;
    } else {
      rest.push_back(t);
    }
  }
  const Args args(rest, kVerifyFlags);
  check_not_the_trace(args);
  if (const auto value = args.optional("--quick")) {
    throw Error("--quick", "no value", single_quoted(*value));
  }
  const std::vector<Shape>& known = options.quick ? cases::quick_shapes() : cases::issue_shapes();
  const std::vector<std::string> asked = args.all("--shape");
  for (const Shape& s : known) {
    if (asked.empty() || std::find(asked.begin(), asked.end(), s.name) != asked.end()) {
      options.shapes.push_back(s);
    }
  }
  for (const std::string& name : asked) {
    if (std::none_of(known.begin(), known.end(), [&](const Shape& s) { return s.name == name; })) {
      std::string names;
      for (const Shape& s : known) names += (names.empty() ? "" : ", ") + s.name;
      throw Error("--shape", std::string("one of ") + names + (options.quick ? " (--quick)" : ""),
                  single_quoted(name));
    }
  }
  if (const auto json = args.optional("--json")) {
    // Refused now rather than after the run.
    const fs::path path(*json);
    const fs::path parent = path.has_parent_path() ? path.parent_path() : fs::path(".");
    std::error_code error;
    if (path.filename().empty() || fs::is_directory(path, error) ||
        !fs::is_directory(parent, error)) {
      throw Error("--json", "a writable output path (a file in an existing directory)",
                  single_quoted(*json));
    }
    options.json = path;
  }
  return options;
}

// A JSON string literal of `text`.
std::string quoted(std::string_view text) {
  std::string q = "\"";
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      q += '\\';
      q += c;
    } else if (u < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", u);
      q += escaped;
    } else {
      q += c;
    }
  }
  return q + '"';
}

template <class Enum>
std::string quoted_or_null(const std::optional<Enum>& value, const char* (*name)(Enum)) {
  return value ? quoted(name(*value)) : "null";
}

struct Matrix {
  const Options* options = nullptr;
  Backends backends;
  std::vector<Config> configs;
  ThreadCounts threads;
  std::vector<Cell> cells;

  std::size_t failed() const {
    return static_cast<std::size_t>(
        std::count_if(cells.begin(), cells.end(), [](const Cell& c) { return !c.pass(); }));
  }
};

std::string cell_words(const Matrix& m, const Cell& cell) {
  return m.backends.variants[cell.variant].label() + " " + config_words(m.configs[cell.config]) +
         " " + m.options->shapes[cell.shape].name;
}

std::string json_document(const Matrix& m) {
  std::ostringstream j;
  j << "{\n  \"contract\": " << quoted(contract::kVersionString)
    << ",\n  \"quick\": " << (m.options->quick ? "true" : "false") << ",\n  \"shapes\": [";
  for (std::size_t s = 0; s < m.options->shapes.size(); ++s) {
    j << (s == 0 ? "\n" : ",\n") << "    " << cases::shape_json(m.options->shapes[s]);
  }
  j << "\n  ],\n  \"threads\": [" << m.threads.main;
  for (const int n : m.threads.others) j << ", " << n;
  j << "],\n  \"skipped_backends\": [";
  for (std::size_t i = 0; i < m.backends.skipped.size(); ++i) {
    j << (i == 0 ? "" : ", ") << "{\"backend\": " << quoted(m.backends.skipped[i].name)
      << ", \"reason\": " << quoted(m.backends.skipped[i].reason) << "}";
  }
  j << "],\n  \"cells\": [";
  for (std::size_t i = 0; i < m.cells.size(); ++i) {
    const Cell& cell = m.cells[i];
    const Variant& v = m.backends.variants[cell.variant];
    const Config& c = m.configs[cell.config];
    std::string detail;
    for (std::size_t k = 0; k < kChecks; ++k) {
      if (cell.failures[k].empty()) continue;
      detail +=
          (detail.empty() ? "" : "; ") + std::string(kCheckNames[k]) + ": " + cell.failures[k];
    }
    j << (i == 0 ? "\n" : ",\n") << "    {\"backend\": " << quoted(v.backend)
      << ", \"isa\": " << quoted_or_null(v.isa, isa_name)
      << ", \"op\": " << quoted(op_type_name(c.op))
      << ", \"direction\": " << quoted(direction_name(c.direction))
      << ", \"dtype\": " << quoted(dtype_name(c.dtype))
      << ", \"pairing\": " << quoted_or_null(c.pairing, pairing_name)
      << ", \"mode\": " << quoted_or_null(c.mode, norm_mode_name)
      << ", \"layout\": " << quoted_or_null(c.layout, layout_name)
      << ", \"activation\": " << quoted_or_null(c.activation, activation_name)
      << ", \"transform\": " << quoted_or_null(c.transform, latent_transform_name)
      << ", \"shape\": " << quoted(m.options->shapes[cell.shape].name) << ", \"checks\": {";
    for (std::size_t k = 0; k < kChecks; ++k) {
      j << (k == 0 ? "" : ", ") << quoted(kCheckNames[k]) << ": "
        << (cell.failures[k].empty() ? "\"PASS\"" : "\"FAIL\"");
    }
    j << "}, \"detail\": " << quoted(detail) << "}";
  }
  const std::size_t failed = m.failed();
  j << "\n  ],\n  \"summary\": {\"cells\": " << m.cells.size()
    << ", \"pass\": " << m.cells.size() - failed << ", \"fail\": " << failed << "}\n}\n";
  return j.str();
}

std::string padded(std::string text, std::size_t width) {
  if (text.size() < width) text.append(width - text.size(), ' ');
  return text;
}

// The table: one row per variant, op, direction and dtype; one column per shape; a
// cell PASSes when every pairing, mode, layout and activation passed all three checks. Then every
// failing check, and the summary line.
void print_report(const Matrix& m, std::ostream& out) {
  const std::vector<Shape>& shapes = m.options->shapes;
  const std::size_t rows = m.configs.empty() ? 0 : m.configs.back().row + 1;
  // failures[(variant * rows + row) * shapes + shape]
  std::vector<std::size_t> failures(m.backends.variants.size() * rows * shapes.size(), 0);
  for (const Cell& cell : m.cells) {
    if (cell.pass()) continue;
    ++failures[(cell.variant * rows + m.configs[cell.config].row) * shapes.size() + cell.shape];
  }
  std::size_t variant_width = std::string("variant").size();
  for (const Variant& v : m.backends.variants) {
    variant_width = std::max(variant_width, v.label().size());
  }
  std::size_t op_width = 0;
  for (const OpType op : kOpTypes)
    op_width = std::max(op_width, std::string(op_type_name(op)).size());
  const std::size_t direction_width = std::string("direction").size();
  const std::size_t dtype_width = std::string("dtype").size();
  std::string header = padded("variant", variant_width) + "  " + padded("op", op_width) + "  " +
                       padded("direction", direction_width) + "  " + padded("dtype", dtype_width);
  for (const Shape& s : shapes) header += "  " + s.name;
  out << header << '\n';
  for (std::size_t v = 0; v < m.backends.variants.size(); ++v) {
    for (const Config& c : m.configs) {
      if (&c != &m.configs.front() && (&c - 1)->row == c.row) continue;  // one line per row
      std::string line = padded(m.backends.variants[v].label(), variant_width) + "  " +
                         padded(op_type_name(c.op), op_width) + "  " +
                         padded(direction_name(c.direction), direction_width) + "  " +
                         padded(dtype_name(c.dtype), dtype_width);
      for (std::size_t s = 0; s < shapes.size(); ++s) {
        const bool pass = failures[(v * rows + c.row) * shapes.size() + s] == 0;
        line += "  " + padded(pass ? "PASS" : "FAIL", shapes[s].name.size());
      }
      while (line.ends_with(' ')) line.pop_back();
      out << line << '\n';
    }
  }
  const std::size_t failed = m.failed();
  if (failed > 0) {
    out << "failures:\n";
    for (const Cell& cell : m.cells) {
      for (std::size_t k = 0; k < kChecks; ++k) {
        if (cell.failures[k].empty()) continue;
        out << "  " << cell_words(m, cell) << ": " << kCheckNames[k]
            << " check: " << cell.failures[k] << '\n';
      }
    }
  }
  out << "verify: " << m.cells.size() << " cells, " << m.cells.size() - failed << " PASS, "
      << failed << " FAIL\n";
}

}  // namespace

int run_verify(const std::vector<std::string>& args, std::ostream& out, std::ostream& progress,
               bool progress_is_terminal) {
  const Options options = parse_options(args);
  const SettingsGuard restore_settings;
  Matrix m;
  m.options = &options;
  m.backends = backends_to_verify();
  m.configs = cases::all_configs();
  m.threads = thread_counts();

  std::string labels;
  for (const Variant& v : m.backends.variants) {
    labels += (labels.empty() ? "" : ", ") + v.label();
  }
  out << "kernel-align verify (" << contract::kVersionString << "): " << labels << " against "
      << kReferenceBackend << "; " << m.configs.size() << " configurations x "
      << options.shapes.size() << " shapes" << (options.quick ? " (--quick)" : "") << "; "
      << thread_words(m.threads.main) << ", compared with";
  for (std::size_t i = 0; i < m.threads.others.size(); ++i) {
    out << (i == 0 ? " " : ", ") << m.threads.others[i];
  }
  out << '\n';
  for (const SkippedBackend& s : m.backends.skipped) {
    out << "  skipped backend " << s.name << ": unavailable: " << s.reason << '\n';
  }
  if (m.backends.variants.empty()) {
    out << "verify: nothing to verify: no available CPU backend besides " << kReferenceBackend
        << '\n';
    return kExitSomeFail;
  }

  const auto start = std::chrono::steady_clock::now();
  Progress bar(progress, progress_is_terminal,
               m.backends.variants.size() * m.configs.size() * options.shapes.size());
  for (std::size_t s = 0; s < options.shapes.size(); ++s) {
    const ShapeTables tables = cases::shape_tables(options.shapes[s]);
    Case one_case;
    CaseOutputs outputs;
    for (std::size_t c = 0; c < m.configs.size(); ++c) {
      set_case(one_case, m.configs[c], options.shapes[s], tables);
      const std::shared_future<void> expected = start_expected(one_case, outputs).share();
      for (std::size_t v = 0; v < m.backends.variants.size(); ++v) {
        Cell& cell = m.cells.emplace_back(Cell{v, c, s, {}});
        bar.step(cell_words(m, cell));
        verify_cell(m.backends.variants[v], one_case, m.threads, expected, outputs, cell);
      }
      expected.wait();  // the next case refills the inputs the reference reads
    }
  }
  bar.finish(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());

  std::stable_sort(m.cells.begin(), m.cells.end(), [](const Cell& a, const Cell& b) {
    return std::tie(a.variant, a.config, a.shape) < std::tie(b.variant, b.config, b.shape);
  });
  print_report(m, out);
  if (options.json) {
    const std::string document = json_document(m);
    const auto* bytes = reinterpret_cast<const std::byte*>(document.data());
    write_outputs({{"--json", *options.json, {bytes, bytes + document.size()}}});
  }
  return m.failed() == 0 ? kExitAllPass : kExitSomeFail;
}

}  // namespace kernel_align::cli
