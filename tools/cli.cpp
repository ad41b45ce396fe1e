#include "cli.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <iostream>
#include <new>
#include <ostream>
#include <string_view>

#include "commands.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/registry.hpp"
#include "kernel_align/runtime.hpp"
#include "kernel_align/version.hpp"
#include "messages.hpp"
#include "output_files.hpp"
#include "run.hpp"
#include "tensor_io.hpp"
#include "trace_diff.hpp"
#include "verify.hpp"

namespace kernel_align::cli {
namespace {

constexpr std::string_view kApply = "apply";

const std::vector<Command>& commands() {
  static const std::vector<Command> all = [] {
    std::vector<Command> commands{backends_command(), positions_command(), tables_command()};
    for (Command& c : apply_commands()) commands.push_back(std::move(c));
    commands.push_back(shapes_command());
    return commands;
  }();
  return all;
}

const Command* find_command(std::string_view name) {
  for (const Command& c : commands()) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

// "qk-rmsnorm, qk-rmsnorm-backward, ..." for `apply`, "positions, tables, apply, ..." at the top.
std::string command_words(bool apply_operations) {
  std::vector<std::string> words;
  for (const Command& c : commands()) {
    const std::string_view name = c.name;
    const bool is_apply = name.starts_with(kApply) && name.size() > kApply.size();
    if (apply_operations != is_apply) continue;
    words.emplace_back(apply_operations ? name.substr(kApply.size() + 1) : name);
  }
  if (!apply_operations) {
    words.insert(words.end(), {std::string(kApply), "run", "trace", "verify", "help"});
  }
  std::string joined;
  for (const std::string& w : words) joined += (joined.empty() ? "" : ", ") + w;
  return joined;
}

std::string version_line() {
  return std::string("kernel-align ") + kernel_align::version() + " (" +
         kernel_align::contract_version() + ")";
}

void print_usage(std::ostream& out, const Command& c) {
  out << "usage: kernel-align " << c.name << ' ' << c.synopsis << "\n  " << c.summary << '\n';
}

void print_run_usage(std::ostream& out) {
  out << "usage: kernel-align run " << kRunSynopsis
      << "\n  the main job: positions, tables, qk-rmsnorm then rope on random q and k, judged by "
         "the fp64 oracle, and a batch-invariance check\n";
}

void print_trace_usage(std::ostream& out) {
  out << "usage: kernel-align trace " << kTraceSynopsis
      << "\n  compares two trace files (docs/trace.md) call by call (model traces, docs/"
         "alignment.md: by module and call index): exit 0 when identical, 1 at the first "
         "divergence\n";
}

void print_verify_usage(std::ostream& out) {
  out << "usage: kernel-align verify " << kVerifySynopsis
      << "\n  the conformance matrix: every CPU backend and ISA path against the reference, "
         "byte for byte, with batch and thread-count invariance (docs/verify.md); exit 1 on any "
         "FAIL\n";
}

void print_help(std::ostream& out) {
  out << version_line() << ": the Qwen-Image transformer's ops, bitwise reproducible\n\n";
  for (const Command& c : commands()) print_usage(out, c);
  print_run_usage(out);
  print_trace_usage(out);
  print_verify_usage(out);
  out << "usage: kernel-align --help | help [COMMAND] | --version\n\n"
         "Every command also takes --backend simd|reference, --isa portable|avx2|avx512 and\n"
         "--threads N (or KERNEL_ALIGN_BACKEND, KERNEL_ALIGN_ISA, KERNEL_ALIGN_NUM_THREADS):\n"
         "they change the speed, never the bytes. KERNEL_ALIGN_STRICT=1 turns fallbacks into\n"
         "errors; KERNEL_ALIGN_TRACE=FILE.jsonl writes one record per call (docs/trace.md).\n\n"
         "Arrays are .npy files: fp32 '<f4', fp16 '<f2', bf16 '<u2' (bit patterns), int32 '<i4'.\n"
         "A bad argument exits with status 2 and one line on stderr; no output is written.\n";
}

bool asks_for_help(const std::vector<std::string>& tokens) {
  return std::any_of(tokens.begin(), tokens.end(),
                     [](const std::string& t) { return t == "--help" || t == "-h"; });
}

std::string backend_list() {
  std::string names;
  for (const std::string& name : backend_names()) names += (names.empty() ? "" : ", ") + name;
  return names;
}

// --backend NAME, --isa portable|avx2|avx512 and --threads N may stand
// anywhere on the line, once each: they choose how every command computes, never what.
std::vector<std::string> apply_runtime_flags(const std::vector<std::string>& args) {
  std::vector<std::string> rest;
  std::vector<std::string> seen;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (flag != "--backend" && flag != "--isa" && flag != "--threads") {
      rest.push_back(flag);
      continue;
    }
    if (i + 1 == args.size()) throw Error(flag, "a value", "none");
    const std::string& value = args[++i];
    if (std::find(seen.begin(), seen.end(), flag) != seen.end()) {
      throw Error(flag, "a single value", "a second one, " + single_quoted(value));
    }
    seen.push_back(flag);
    if (flag == "--backend") {
      // The library's "" restores the registry's order; on the command line, where the
      // default is to give no flag, an empty name is a mistake.
      if (value.empty()) {
        throw Error(flag, "a backend name, one of " + backend_list(), single_quoted(value));
      }
      call_library({{"backend", "--backend"}}, [&] { set_backend(value); });
    } else if (flag == "--isa") {
      const Isa isa = parse_choice<Isa>(
          flag, value, {{"portable", Isa::Portable}, {"avx2", Isa::Avx2}, {"avx512", Isa::Avx512}});
      call_library({{"isa", "--isa"}}, [&] { set_isa(isa); });
    } else {
      set_num_threads(parse_num_threads(flag, value));
    }
  }
  return rest;
}

int dispatch(const std::vector<std::string>& all_args, std::ostream& out) {
  const std::vector<std::string> args = apply_runtime_flags(all_args);
  if (args.empty()) throw Error("command", "one of " + command_words(false), "none");
  const std::string& first = args[0];
  if (first == "--version") {
    out << version_line() << '\n';
    return kExitOk;
  }
  if (first == "--help" || first == "-h" || (first == "help" && args.size() == 1)) {
    print_help(out);
    return kExitOk;
  }
  if (first == "help") {  // help COMMAND: the usage of that command
    std::vector<std::string> command(args.begin() + 1, args.end());
    command.emplace_back("--help");
    return dispatch(command, out);
  }
  if (first == "run") {
    const std::vector<std::string> tokens(args.begin() + 1, args.end());
    if (asks_for_help(tokens)) {
      print_run_usage(out);
      return kExitOk;
    }
    return run_main_job(tokens);
  }
  if (first == "trace") {
    const std::vector<std::string> tokens(args.begin() + 1, args.end());
    if (asks_for_help(tokens)) {
      print_trace_usage(out);
      return kExitOk;
    }
    return run_trace_command(tokens, out);
  }
  if (first == "verify") {
    const std::vector<std::string> tokens(args.begin() + 1, args.end());
    if (asks_for_help(tokens)) {
      print_verify_usage(out);
      return kExitOk;
    }
    // The progress goes to the process's stderr, rewritten in place on a terminal.
    return run_verify(tokens, out, std::cerr, ::isatty(STDERR_FILENO) == 1);
  }

  // `apply` takes the operation as a second word.
  const std::size_t words = first == kApply && args.size() > 1 ? 2 : 1;
  const Command* command = find_command(words == 2 ? first + " " + args[1] : first);
  if (command == nullptr) {
    // Help for `apply` itself lists every operation; help for an unknown word is an error.
    if (first == kApply && asks_for_help(args) && (args.size() < 2 || args[1].starts_with("--"))) {
      print_help(out);
      return kExitOk;
    }
    if (first == kApply) {
      throw Error(first, "an operation, one of " + command_words(true),
                  words == 2 ? single_quoted(args[1]) : "none");
    }
    throw Error("command", "one of " + command_words(false), single_quoted(first));
  }
  const std::vector<std::string> tokens(args.begin() + static_cast<std::ptrdiff_t>(words),
                                        args.end());
  if (asks_for_help(tokens)) {
    print_usage(out, *command);
    return kExitOk;
  }
  const Args parsed(tokens, command->flags);
  check_not_the_trace(parsed);
  command->run(parsed);
  return kExitOk;
}

// Escapes control characters (a newline in a path, say): an error stays one line.
std::string one_line(std::string_view text) {
  std::string line;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7F) {
      line += c;
    } else {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", u);
      line += escaped;
    }
  }
  return line;
}

}  // namespace

int main_entry(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  try {
    return dispatch(args, out);
  } catch (const Error& e) {
    err << "kernel-align: error: " << one_line(e.what()) << '\n';
    return kExitBadArgument;
  } catch (const std::bad_alloc&) {
    // What the size checks before allocation (memory.hpp) could not foresee.
    const Error e("memory", "allocations that fit in the available memory",
                  "one that failed (std::bad_alloc): use smaller inputs");
    err << "kernel-align: error: " << e.what() << '\n';
    return kExitBadArgument;
  } catch (const std::exception& e) {
    err << "kernel-align: internal error: " << one_line(e.what()) << '\n';
    return kExitInternalError;
  }
}

}  // namespace kernel_align::cli
