// kernel-align run: the job runner (tools/run.cpp).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kernel_align::cli {

// `args` are the tokens after `run`. Returns the exit status; a bad argument throws
// kernel_align::Error.
int run_main_job(const std::vector<std::string>& args);

// Its flags, as `kernel-align run --help` and the main help show them.
inline constexpr std::string_view kRunSynopsis =
    "[--image WxH ...] [--text-len 256] [--heads 24] [--dtype bf16|fp16|fp32] "
    "[--layout diffusers|seed] [--seed 42] [--batch 4] [--trace FILE.jsonl]";

}  // namespace kernel_align::cli
