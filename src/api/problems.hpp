// Validated descriptions of one call, the form in which every backend receives
// work. Building one checks every argument (validate.cpp); a backend may assume
// all of it holds.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "kernel_align/ops.hpp"

namespace kernel_align::detail {

// The rows of a view whose last dim is the row: row r is the r-th combination
// of the leading indices in row-major order, independent of the strides.
class RowIndexer {
 public:
  explicit RowIndexer(const ConstTensorView& v);
  std::int64_t rows() const { return rows_; }
  // Element offset of row r's first element.
  std::int64_t offset(std::int64_t r) const;

 private:
  int leading_ = 0;
  std::int64_t rows_ = 1;
  std::array<std::int64_t, kMaxRank - 1> shape_{};
  std::array<std::int64_t, kMaxRank - 1> strides_{};
};

struct RmsNormForwardProblem {
  ConstTensorView x;
  std::optional<ConstTensorView> weight;
  TensorView y;
  RmsNormOptions options;
  int d = 0;
};

struct RmsNormBackwardProblem {
  ConstTensorView x;
  ConstTensorView dy;
  std::optional<ConstTensorView> weight;
  TensorView dx;
  std::optional<TensorView> dw;
  RmsNormOptions options;
  int d = 0;
};

// A 4-D tensor addressed as (batch, sequence, head, d) whatever its layout.
struct SequenceTensor {
  std::int64_t stride_batch = 0;
  std::int64_t stride_seq = 0;
  std::int64_t stride_head = 0;
  std::int64_t stride_d = 0;
};

struct RopeProblem {
  ConstTensorView in;
  TensorView out;
  SequenceTensor in_strides;
  SequenceTensor out_strides;
  ConstTensorView cos;
  ConstTensorView sin;
  RopeOptions options;
  bool transpose = false;  // backward
  std::int64_t batch = 0;
  std::int64_t seq = 0;
  std::int64_t heads = 0;
  int d = 0;
};

RmsNormForwardProblem make_rmsnorm_forward(const ConstTensorView& x,
                                           const std::optional<ConstTensorView>& weight,
                                           const TensorView& y, const RmsNormOptions& options);

RmsNormBackwardProblem make_rmsnorm_backward(const ConstTensorView& x, const ConstTensorView& dy,
                                             const std::optional<ConstTensorView>& weight,
                                             const TensorView& dx,
                                             const std::optional<TensorView>& dw,
                                             const RmsNormOptions& options);

// `in_name`/`out_name` name the arguments in messages (x/y or dy/dx).
RopeProblem make_rope(const ConstTensorView& in, const ConstTensorView& cos,
                      const ConstTensorView& sin, const TensorView& out, const RopeOptions& options,
                      bool transpose, const char* in_name, const char* out_name);

}  // namespace kernel_align::detail
