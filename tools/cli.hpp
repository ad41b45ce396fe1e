// The `kernel-align` command line: dispatch, help and error reporting.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace kernel_align::cli {

// Exit statuses.
inline constexpr int kExitOk = 0;
inline constexpr int kExitInternalError = 1;
inline constexpr int kExitBadArgument = 2;

// Runs the command in `args` (the tokens after the program name). Help and version
// go to `out`; an error is one line on `err`.
int main_entry(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace kernel_align::cli
