// true_cfg as its backends compute it (docs/contract.md section 17): views of rows (the
// last dim a token's channels), any rank from 1 to 4; an absent optional output as a view
// without data.
#pragma once

#include "kernel_align/tensor.hpp"

namespace kernel_align::detail {

struct TrueCfgProblem {
  ConstTensorView cond;
  ConstTensorView uncond;
  TensorView v;
  float scale = 0.0f;
};

struct TrueCfgBackwardProblem {
  ConstTensorView cond;
  ConstTensorView uncond;
  ConstTensorView dv;
  TensorView dcond;  // data null: not asked for
  TensorView duncond;
  float scale = 0.0f;
};

}  // namespace kernel_align::detail
