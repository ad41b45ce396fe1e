// Reading and writing NumPy .npy files (format versions 1.0, 2.0 and 3.0), limited to
// the element types the tools exchange with the library. Every rejected file raises
// kernel_align::Error naming the command-line argument it came from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace kernel_align::cli {

// bf16 has no NumPy type: it travels as its 16-bit patterns, '<u2'.
enum class NpyType : std::uint8_t { F32, F16, BF16, I32, Bool };

inline constexpr int kNpyMaxRank = 4;

struct NpyArray {
  NpyType type = NpyType::F32;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> data;  // row-major, little-endian

  std::int64_t numel() const;
};

std::size_t npy_type_size(NpyType t);
const char* npy_descr(NpyType t);  // "<f4", ...

// A zero-filled array of the given type and shape.
NpyArray make_npy_array(NpyType type, std::vector<std::int64_t> shape);

// Parses the bytes of a whole .npy file. `argument` and `source` (the file name) are
// used in error messages only.
NpyArray parse_npy(std::span<const std::byte> file, const std::string& argument,
                   const std::string& source);

NpyArray read_npy(const std::filesystem::path& path, const std::string& argument);

// A version 1.0 file whose data starts at a multiple of 64 bytes.
std::vector<std::byte> encode_npy(const NpyArray& array);

// "(7145, 3)", as NumPy prints a shape.
std::string shape_tuple(std::span<const std::int64_t> shape);

}  // namespace kernel_align::cli
