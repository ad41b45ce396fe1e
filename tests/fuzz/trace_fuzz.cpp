// libFuzzer target: the trace reader of `kernel-align trace diff`. The input is a trace
// file, compared with itself and with a fixed valid trace, with and without --sample.
// Malformed records are a kernel_align::Error (status 2); nothing else may escape.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kernel_align/error.hpp"
#include "trace_diff.hpp"

namespace {

std::string temporary(const char* name) {
  return "/tmp/ka_trace_fuzz_" + std::to_string(::getpid()) + "_" + name;
}

// One call of a real trace (digest values arbitrary).
constexpr const char* kValid =
    R"({"seq":0,"session":"00000000000000aa","pid":1,"op":"qk_rmsnorm","direction":"forward",)"
    R"("tensors":[{"name":"x","dtype":"bf16","shape":[2,3,1,8],"strides":[24,8,8,1]},)"
    R"({"name":"y","dtype":"bf16","shape":[2,3,1,8],"strides":[24,8,8,1]}],)"
    R"("digests":{"y":["0123456789abcdef","fedcba9876543210"]}})"
    "\n";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string fuzzed = temporary("a.jsonl");
  static const std::string valid = [] {
    const std::string path = temporary("b.jsonl");
    std::ofstream(path) << kValid;
    return path;
  }();
  std::ofstream(fuzzed, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  for (const std::vector<std::string>& args : {std::vector<std::string>{"diff", fuzzed, fuzzed},
                                               {"diff", fuzzed, valid},
                                               {"diff", valid, fuzzed, "--sample", "1:0"},
                                               {"diff", fuzzed, fuzzed, "--sample", "0:0"}}) {
    std::ostringstream out;
    try {
      kernel_align::cli::run_trace_command(args, out);
    } catch (const kernel_align::Error&) {
    }
  }
  return 0;
}
