// Conversions between fp32 and the 16-bit storage types. Narrowing rounds to
// nearest-even, keeps subnormals (no flush to zero), overflows to Inf, and turns
// a NaN into the canonical quiet NaN of the target type with the sign kept.
// Widening is exact.
#pragma once

#include <cstdint>

#include "kernel_align/contract/float_ops.hpp"
#include "kernel_align/dtype.hpp"

namespace kernel_align::contract {

KA_HD static inline float bf16_to_f32(std::uint16_t h) {
  return float_of(std::uint32_t{h} << 16);
}

KA_HD static inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t x = bits_of(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<std::uint16_t>(((x >> 16) & 0x8000u) | 0x7FC0u);
  }
  x += 0x7FFFu + ((x >> 16) & 1u);  // carries into the exponent, up to Inf
  return static_cast<std::uint16_t>(x >> 16);
}

KA_HD static inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1Fu;
  const std::uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1Fu) return float_of(sign | 0x7F800000u | (mantissa << 13));
  if (exponent != 0) return float_of(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24, exact in fp32.
  const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
  return float_of(sign | bits_of(magnitude));
}

KA_HD static inline std::uint16_t f32_to_f16(float f) {
  const std::uint32_t x = bits_of(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t magnitude = x & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u);
  // 65520 is the midpoint between 65504 (odd mantissa) and 2^16: ties to even, Inf.
  if (magnitude >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
  if (magnitude >= 0x38800000u) {               // normal in fp16: >= 2^-14
    std::uint32_t v = magnitude - 0x38000000u;  // rebias the exponent 127 -> 15
    v += 0xFFFu + ((v >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | (v >> 13));
  }
  // At most 2^-25, the midpoint between 0 and the smallest subnormal: ties to 0.
  if (magnitude <= 0x33000000u) return static_cast<std::uint16_t>(sign);
  // Subnormal in fp16: round significand * 2^(e-150) to a multiple of 2^-24.
  const std::uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t shift = 126u - (magnitude >> 23);  // 14..24
  std::uint32_t q = significand >> shift;
  const std::uint32_t rest = significand & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (q & 1u) != 0)) ++q;  // may become 0x400, the smallest normal
  return static_cast<std::uint16_t>(sign | q);
}

// Narrow to `t` and widen back: the value a tensor of type `t` would hold.
KA_HD static inline float round_through(DType t, float v) {
  switch (t) {
    case DType::BF16:
      return bf16_to_f32(f32_to_bf16(v));
    case DType::F16:
      return f16_to_f32(f32_to_f16(v));
    case DType::F32:
    case DType::Bool:  // holds no numbers: validation keeps it from every computed tensor
      break;
  }
  return v;
}

// How an op stores a result. Arithmetic NaNs carry a sign and payload that differ
// between instruction sets, so every NaN an op writes is the positive canonical quiet
// NaN of the output type: the output bytes are then the same on every backend.
KA_HD static inline std::uint32_t canonical_nan_bits(DType t) {
  return t == DType::F32 ? 0x7FC00000u : (t == DType::BF16 ? 0x7FC0u : 0x7E00u);
}

// The bits store_output writes for `v` into a 16-bit type (bf16 or fp16), and the value
// it writes into fp32: vectorised stores assemble these.
KA_HD static inline std::uint16_t stored_bits16(DType t, float v) {
  if (is_nan(v)) return static_cast<std::uint16_t>(canonical_nan_bits(t));
  return t == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
}

KA_HD static inline float stored_f32(float v) {
  return is_nan(v) ? float_of(canonical_nan_bits(DType::F32)) : v;
}

KA_HD static inline void store_output(DType t, void* base, std::int64_t index, float v) {
  if (t == DType::F32) {
    static_cast<float*>(base)[index] = stored_f32(v);
  } else {
    static_cast<std::uint16_t*>(base)[index] = stored_bits16(t, v);
  }
}

KA_HD static inline float load_f32(DType t, const void* base, std::int64_t index) {
  switch (t) {
    case DType::BF16:
      return bf16_to_f32(static_cast<const std::uint16_t*>(base)[index]);
    case DType::F16:
      return f16_to_f32(static_cast<const std::uint16_t*>(base)[index]);
    case DType::Bool:
      return static_cast<const std::uint8_t*>(base)[index] != 0 ? 1.0f : 0.0f;
    case DType::F32:
      break;
  }
  return static_cast<const float*>(base)[index];
}

}  // namespace kernel_align::contract
