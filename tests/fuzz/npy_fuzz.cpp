// libFuzzer target: the .npy reader. Whatever the bytes, parse_npy returns an array whose
// data matches its header, or throws kernel_align::Error; anything else (a crash, a
// sanitizer report, another exception) is a finding.
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>

#include "kernel_align/error.hpp"
#include "npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const kernel_align::cli::NpyArray array =
        kernel_align::cli::parse_npy(bytes, "--x", "fuzz.npy");
    if (array.data.size() !=
        static_cast<std::size_t>(array.numel()) * kernel_align::cli::npy_type_size(array.type)) {
      throw std::logic_error("parse_npy: data size does not match the shape");
    }
    // What is read is written back the same way.
    (void)kernel_align::cli::encode_npy(array);
  } catch (const kernel_align::Error&) {
  }
  return 0;
}
