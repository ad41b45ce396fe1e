// kernel-align trace diff: compares two trace files (docs/trace.md) call by call.
#pragma once

#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace kernel_align::cli {

// What follows `kernel-align trace`, as the help shows it.
inline constexpr std::string_view kTraceSynopsis = "diff A.jsonl B.jsonl [--sample I:J]";

// Exit statuses of `trace diff`; unreadable or malformed input throws kernel_align::Error
// instead (status 2).
inline constexpr int kExitIdentical = 0;
inline constexpr int kExitDiverged = 1;

// `args` are the tokens after `trace`. Prints the verdict on `out` and returns the exit
// status.
int run_trace_command(const std::vector<std::string>& args, std::ostream& out);

}  // namespace kernel_align::cli
