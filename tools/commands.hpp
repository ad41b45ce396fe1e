// The subcommands of `kernel-align` that parse their flags with Args.
#pragma once

#include <string>
#include <vector>

#include "cli_args.hpp"

namespace kernel_align::cli {

struct Command {
  std::string name;      // as typed: "positions", "apply rope"
  std::string synopsis;  // its flags, as the usage line shows them
  std::string summary;   // one sentence for the help
  std::vector<FlagSpec> flags;
  void (*run)(const Args& args);
};

Command backends_command();
Command positions_command();
Command tables_command();
Command rmsnorm_forward_command();
Command rmsnorm_backward_command();
Command rope_forward_command();
Command rope_backward_command();
Command linear_forward_command();
Command linear_backward_command();
Command attention_forward_command();
Command attention_backward_command();
Command shapes_command();

}  // namespace kernel_align::cli
