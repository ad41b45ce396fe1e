// libFuzzer target: the command-line flag parser and the value parsers. The input is
// NUL-separated tokens; the first byte picks the flag set of one command. Every malformed
// argument must be a kernel_align::Error naming a flag; nothing else may escape.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cli_args.hpp"
#include "commands.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/runtime.hpp"
#include "tensor_io.hpp"

using namespace kernel_align;
using namespace kernel_align::cli;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  // backends, positions, tables, then every op's apply commands (their flags derived from
  // the op's descriptor).
  static const std::vector<Command> commands = [] {
    std::vector<Command> all{backends_command(), positions_command(), tables_command()};
    for (Command& c : apply_commands()) all.push_back(std::move(c));
    return all;
  }();
  const Command& command = commands[data[0] % commands.size()];
  std::vector<std::string> tokens(1);
  for (std::size_t i = 1; i < size; ++i) {
    if (data[i] == 0) {
      tokens.emplace_back();
    } else {
      tokens.back() += static_cast<char>(data[i]);
    }
  }
  try {
    const Args args(tokens, command.flags);
    for (const FlagSpec& flag : command.flags) {
      for (const std::string& value : args.all(flag.name)) {
        // Every value parser on every value: each accepts or throws Error.
        const auto quietly = [](const auto& parse) {
          try {
            parse();
          } catch (const Error&) {
          }
        };
        quietly([&] { parse_int<std::int64_t>(flag.name, value); });
        quietly([&] { parse_finite_float(flag.name, value); });
        quietly([&] { parse_int_list(flag.name, value); });
        quietly([&] { parse_image(value); });
        quietly([&] { parse_dtype(std::string(flag.name), value); });
        quietly([&] { parse_num_threads(std::string(flag.name), value); });
      }
    }
    (void)args.file_paths();
  } catch (const Error&) {
  }
  return 0;
}
