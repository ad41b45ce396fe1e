// The subcommands of `kernel-align` that parse their flags with Args.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cli_args.hpp"

namespace kernel_align::cli {

struct Command {
  std::string name;      // as typed: "positions", "apply rope"
  std::string synopsis;  // its flags, as the usage line shows them
  std::string summary;   // one sentence for the help
  std::vector<FlagSpec> flags;
  std::function<void(const Args& args)> run;
};

Command backends_command();
Command positions_command();
Command tables_command();
// apply <op> and apply <op>-backward for every op (commands_apply.cpp).
std::vector<Command> apply_commands();
Command shapes_command();

}  // namespace kernel_align::cli
