// The elementwise activation as its backends compute it (docs/contract.md section 14): the
// tensors as views of rows (the last dim), any rank from 1 to 4.
#pragma once

#include <cstdint>

#include "kernel_align/contract/activation.hpp"
#include "kernel_align/tensor.hpp"

namespace kernel_align::detail {

struct ActivationProblem {
  ConstTensorView x;
  TensorView y;
  contract::Activation activation;
};

struct ActivationBackwardProblem {
  ConstTensorView x;
  ConstTensorView dy;
  TensorView dx;
  contract::Activation activation;
};

}  // namespace kernel_align::detail
