// Writing a command's outputs all at once, or not at all.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

namespace kernel_align::cli {

struct OutputFile {
  std::string argument;  // the flag that named the file, for error messages
  std::filesystem::path path;
  std::vector<std::byte> bytes;
};

// Each file goes first to a temporary file beside its target; only when every one is
// complete are they renamed into place, so a failure leaves no output behind (and
// never a half-written one). Throws kernel_align::Error naming the failing flag.
void write_outputs(const std::vector<OutputFile>& files);

}  // namespace kernel_align::cli
