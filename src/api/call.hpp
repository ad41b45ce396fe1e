// One call of an op as validation returns it (validate.cpp): the record that the
// registry chooses a backend from and the trace writes (the op, its options, every
// tensor argument named once), and the problem the backend runs. A public function
// (ops.cpp) builds one per call and hands it on; nothing on the way allocates.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "api/problems.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/registry.hpp"  // OpType, Direction

namespace kernel_align::detail {

// One tensor argument of a call.
struct TensorArg {
  const char* name = "";      // as the trace records it
  const char* argument = "";  // as errors name it: the API's argument, which differs for the
                              // fused op's weights ("weights.text_q", traced "weight_text_q")
  ConstTensorView view;
  bool output = false;
  // The inputs (by name) this output may be exactly, computing in place (contract
  // section 7); none for inputs.
  std::array<const char*, 2> in_place_of{};
};

// The fused backward has the most tensor arguments: 16.
inline constexpr int kMaxTensorArgs = 16;
using TensorArgs = FixedList<TensorArg, kMaxTensorArgs>;

// What the registry chooses a backend from and the trace writes.
struct CallRecord {
  OpType op = OpType::QkRmsNorm;
  Direction direction = Direction::Forward;
  TensorArgs tensors;  // in signature order
  Device device;       // the one device every tensor lives on
  int d = 0;           // the head dim
  // The op's options (empty where the op has no such option: the trace writes null).
  std::optional<Layout> layout;
  std::optional<Pairing> pairing;
  std::optional<NormMode> mode;
  std::optional<float> eps;
  std::optional<std::int64_t> text_len;
  DType output_dtype = DType::F32;
  bool computes_dw = false;
};

template <class Problem>
struct Call {
  CallRecord record;
  Problem problem;
};

// Each checks every argument of its op, throwing kernel_align::Error naming the first
// bad one, and returns the call.
Call<RmsNormForwardProblem> rmsnorm_forward_call(const ConstTensorView& x,
                                                 const std::optional<ConstTensorView>& weight,
                                                 const TensorView& y,
                                                 const RmsNormOptions& options);

Call<RmsNormBackwardProblem> rmsnorm_backward_call(const ConstTensorView& x,
                                                   const ConstTensorView& dy,
                                                   const std::optional<ConstTensorView>& weight,
                                                   const TensorView& dx,
                                                   const std::optional<TensorView>& dw,
                                                   const RmsNormOptions& options);

// Forward: x -> y; backward: dy -> dx (the transposed rotation).
Call<RopeProblem> rope_call(Direction direction, const ConstTensorView& in,
                            const ConstTensorView& cos, const ConstTensorView& sin,
                            const TensorView& out, const RopeOptions& options);

Call<QkNormRopeForwardProblem> qk_norm_rope_forward_call(
    const ConstTensorView& q, const ConstTensorView& k, const QkNormWeights& weights,
    const ConstTensorView& cos, const ConstTensorView& sin, const TensorView& q_out,
    const TensorView& k_out, const QkNormRopeOptions& options);

Call<QkNormRopeBackwardProblem> qk_norm_rope_backward_call(
    const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& dq_out,
    const ConstTensorView& dk_out, const QkNormWeights& weights, const ConstTensorView& cos,
    const ConstTensorView& sin, const TensorView& dq, const TensorView& dk,
    const QkNormWeightGrads& weight_grads, const QkNormRopeOptions& options);

}  // namespace kernel_align::detail
