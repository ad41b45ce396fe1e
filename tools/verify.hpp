// kernel-align verify: the conformance matrix (tools/verify.cpp, docs/verify.md).
#pragma once

#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace kernel_align::cli {

// Its flags, as `kernel-align verify --help` and the main help show them.
inline constexpr std::string_view kVerifySynopsis = "[--quick] [--shape NAME ...] [--json FILE]";

// Exit statuses of `verify`; a bad argument throws kernel_align::Error instead (status 2).
inline constexpr int kExitAllPass = 0;
inline constexpr int kExitSomeFail = 1;

// `args` are the tokens after `verify`. Runs every available CPU backend (other than
// the reference, which gives the expected bytes) over the matrix, prints the table on
// `out` and one progress line per cell on `progress` (rewritten in place when
// `progress_is_terminal`), and returns the exit status. The backend, ISA path and
// thread count are restored when it returns.
int run_verify(const std::vector<std::string>& args, std::ostream& out, std::ostream& progress,
               bool progress_is_terminal);

}  // namespace kernel_align::cli
