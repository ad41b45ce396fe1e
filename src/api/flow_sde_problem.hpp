// Flow-GRPO's SDE step and its log-probability as their backends compute them
// (docs/contract.md section 15): views of rank 2 to 4 whose dim 0 is the sample, the
// step's constants computed once on the host (flow_sde_coefficients), and an absent
// optional output as a view without data.
#pragma once

#include <cstdint>

#include "kernel_align/tables.hpp"  // FlowSdeCoefficients
#include "kernel_align/tensor.hpp"

namespace kernel_align::detail {

struct FlowSdeStepProblem {
  ConstTensorView x;
  ConstTensorView v;
  ConstTensorView noise;
  TensorView prev;
  FlowSdeCoefficients constants{};
};

struct FlowSdeStepBackwardProblem {
  ConstTensorView dprev;
  TensorView dx;  // data null: not asked for
  TensorView dv;
  FlowSdeCoefficients constants{};
};

struct FlowSdeLogpProblem {
  ConstTensorView x;
  ConstTensorView v;
  ConstTensorView prev;
  TensorView logp;  // fp32 [B]
  FlowSdeCoefficients constants{};
};

struct FlowSdeLogpBackwardProblem {
  ConstTensorView x;
  ConstTensorView v;
  ConstTensorView prev;
  ConstTensorView dlogp;  // fp32 [B]
  TensorView dx;          // data null: not asked for
  TensorView dv;
  FlowSdeCoefficients constants{};
};

}  // namespace kernel_align::detail
