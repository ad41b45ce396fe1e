// Element types the library reads and writes. Storage only: all arithmetic is fp32
// (see docs/contract.md).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kernel_align {

enum class DType : std::uint8_t {
  F32,   // IEEE binary32
  BF16,  // bfloat16, stored as its 16-bit pattern
  F16,   // IEEE binary16, stored as its 16-bit pattern
};

constexpr std::size_t dtype_size(DType t) {
  return t == DType::F32 ? 4 : 2;
}

constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "fp32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "fp16";
  }
  return "?";
}

}  // namespace kernel_align
