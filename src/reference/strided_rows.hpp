// Rows of the [B, S, D] strided tensors of adaln_modulation and adaln_gate_residual
// (detail::Strided3), moved between memory and fp32 arrays a row at a time: one switch on
// the dtype a row, not one an element.
#pragma once

#include <cstdint>

#include "api/adaln_problem.hpp"
#include "kernel_align/contract/convert.hpp"

namespace kernel_align::reference {

// Row (b, s) of `t` (D elements) widened to fp32 into out[0..D): one switch on the dtype
// a row, not one an element.
template <class Tensor>
void load_row(const Tensor& t, std::int64_t b, std::int64_t s, int d, float* out) {
  const std::int64_t base = t.offset(b, s, 0);
  const std::int64_t step = t.strides[2];
  switch (t.dtype) {
    case DType::BF16: {
      const auto* p = static_cast<const std::uint16_t*>(t.data) + base;
      for (int i = 0; i < d; ++i) out[i] = contract::bf16_to_f32(p[i * step]);
      return;
    }
    case DType::F16: {
      const auto* p = static_cast<const std::uint16_t*>(t.data) + base;
      for (int i = 0; i < d; ++i) out[i] = contract::f16_to_f32(p[i * step]);
      return;
    }
    default:
      for (int i = 0; i < d; ++i) out[i] = contract::load_f32(t.dtype, t.data, base + i * step);
      return;
  }
}

// values[0..D) stored (store_output) into row (b, s) of `t`.
inline void store_row(const detail::AdaLnOutput& t, std::int64_t b, std::int64_t s, int d,
                      const float* values) {
  const std::int64_t base = t.offset(b, s, 0);
  const std::int64_t step = t.strides[2];
  if (t.dtype == DType::F32) {
    float* p = static_cast<float*>(t.data) + base;
    for (int i = 0; i < d; ++i) p[i * step] = contract::stored_f32(values[i]);
  } else {
    std::uint16_t* p = static_cast<std::uint16_t*>(t.data) + base;
    for (int i = 0; i < d; ++i) p[i * step] = contract::stored_bits16(t.dtype, values[i]);
  }
}

}  // namespace kernel_align::reference
