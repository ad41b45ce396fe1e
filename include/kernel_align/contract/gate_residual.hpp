// The elementwise steps of adaln_gate_residual (docs/contract.md, "Gated residual"):
// out = x + gate * y, a Qwen-Image block's `hidden_states + gate * attn_output` (and its
// MLP's). No reduction in the forward; the backward's dgate sums over a sample's tokens in
// the dw partition of rmsnorm.hpp (reference/token_sums.hpp).
#pragma once

#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/float_ops.hpp"
#include "kernel_align/options.hpp"

namespace kernel_align::contract {

// out before its one rounding to the output dtype: x + gate * y, the product rounded
// through the output's dtype in diffusers mode (torch's `gate * y` in the model's dtype,
// then `+`).
KA_HD static inline float gate_residual_forward(float x, float gate, float y, NormMode mode,
                                                DType out_dtype) {
  const float p = mul(gate, y);
  return add(x, mode == NormMode::Diffusers ? round_through(out_dtype, p) : p);
}

// dy before its one rounding: gate * dout (the rounding of diffusers mode passes the
// gradient through). dgate's term is mul(dout, y), in fp32.
KA_HD static inline float gate_residual_dy(float gate, float dout) {
  return mul(gate, dout);
}

}  // namespace kernel_align::contract
