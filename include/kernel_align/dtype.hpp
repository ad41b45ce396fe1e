// Element types the library reads and writes. Storage only: all arithmetic is fp32
// (see docs/contract.md).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kernel_align {

// The dtype of a TensorView's elements. Any op accepts any of the three floating types
// for its tensors, except the cos/sin tables, which are F32, and attention's key-padding
// mask, which is Bool (an Error names them otherwise).
enum class DType : std::uint8_t {
  F32,   // IEEE binary32
  BF16,  // bfloat16, stored as its 16-bit pattern
  F16,   // IEEE binary16, stored as its 16-bit pattern
  Bool,  // one byte, true when nonzero (torch.bool): masks only, never computed with
};

// Whether `t` holds numbers (F32, BF16, F16): every tensor but a mask.
constexpr bool is_floating(DType t) {
  return t != DType::Bool;
}

// Bytes per element: 4 for F32, 2 for BF16 and F16. Data pointers must be aligned to it.
constexpr std::size_t dtype_size(DType t) {
  return t == DType::F32 ? 4 : t == DType::Bool ? 1 : 2;
}

// "fp32", "bf16", "fp16": the names of messages, the trace and the CLI ("?" for a value
// outside the enum).
constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "fp32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "fp16";
    case DType::Bool:
      return "bool";
  }
  return "?";
}

}  // namespace kernel_align
