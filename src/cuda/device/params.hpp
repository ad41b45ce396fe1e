// The arguments of the CUDA kernels: plain structs, passed to a launch by value, built on
// the host from the validated problems (api/problems.hpp) by plan.hpp. A kernel reads
// rows through RowIndexer (a row's first element) and the last dim's stride.
#pragma once

#include <cstdint>

#include "api/problems.hpp"
#include "kernel_align/dtype.hpp"

namespace kernel_align::cuda {

// One tensor as a kernel sees it: data, dtype, where each row starts, the step between a
// row's elements.
struct RowTensor {
  const void* data = nullptr;
  DType dtype = DType::F32;
  detail::RowIndexer rows;
  std::int64_t step = 1;  // stride of the last dim, in elements
};

struct OutRowTensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  detail::RowIndexer rows;
  std::int64_t step = 1;
};

// A weight [D] (absent: fp32 ones, the contract's definition).
struct WeightVector {
  const void* data = nullptr;  // null: no weight
  DType dtype = DType::F32;
  std::int64_t step = 1;
};

// The cos/sin tables of a RoPE call: fp32 [S, D/2] with any strides, and the table row
// of a row's sequence index (the fused op's streams start at seq_offset).
struct Tables {
  const float* cos = nullptr;
  const float* sin = nullptr;
  std::int64_t cos_row = 0, cos_column = 0;  // strides
  std::int64_t sin_row = 0, sin_column = 0;
  std::int64_t seq_offset = 0;
  // Rows of the 4-D tensors are (b, s, h) in bshd, (b, h, s) in bhsd: their dims 1 and 2
  // and the layout give a row's sequence index (row_sequence_index).
  std::int64_t dim1 = 1, dim2 = 1;
  Layout layout = Layout::BSHD;
  Pairing pairing = Pairing::Interleaved;
  bool transpose = false;  // backward: the transpose rotation

  KA_HD std::int64_t table_row(std::int64_t row) const {
    return seq_offset + detail::row_sequence_index(row, dim1, dim2, layout);
  }
};

// qk_rmsnorm forward; also one stream of the fused forward (then `rope` is set).
struct NormForwardParams {
  RowTensor x;
  OutRowTensor y;
  WeightVector weight;
  std::int64_t rows = 0;
  int d = 0;
  float eps = 0.0f;
  NormMode mode = NormMode::Single;
  bool rope = false;  // fused: y = rope(RN_y(norm(x)))
  Tables tables;
};

// qk_rmsnorm backward; also one stream of the fused backward (then `rope` is set and dy
// is the fused op's dq_out, rotated back and rounded to its dtype before the norm's
// backward reads it). dx always; with `partials`, the contract's dw block sums, one row
// of D fp32 per dw block, which finish_dw adds in block order.
struct NormBackwardParams {
  RowTensor x;
  RowTensor dy;
  OutRowTensor dx;
  WeightVector weight;
  float* partials = nullptr;  // [dw blocks, D], or null: no dw
  // The launch has one thread block per dw block (some stream of the launch computes
  // dw), rather than one row per row group.
  bool by_dw_blocks = false;
  std::int64_t rows = 0;
  int d = 0;
  float eps = 0.0f;
  NormMode mode = NormMode::Single;
  bool rope = false;
  Tables tables;
};

// multi_axis_rope, both directions.
struct RopeParams {
  RowTensor in;
  OutRowTensor out;
  std::int64_t rows = 0;
  int d = 0;
  Tables tables;
};

// The fused ops' streams in one launch: blockIdx.y picks the stream.
inline constexpr int kMaxStreams = 4;
template <class Stream>
struct StreamsParams {
  Stream streams[kMaxStreams];
  int count = 0;
};

// dw = the block sums in block order, rounded to dw's dtype.
struct FinishDwParams {
  const float* partials = nullptr;
  std::int64_t blocks = 0;
  int d = 0;
  void* dw = nullptr;
  DType dtype = DType::F32;
  std::int64_t step = 1;
};

// digest-v1 of each batch element of a tensor (trace/digest.hpp), one per block.
struct DigestParams {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int rank = 0;
  std::int64_t shape[kMaxRank]{};
  std::int64_t strides[kMaxRank]{};
  std::int64_t batches = 1;  // dim 0 of a 4-D tensor, else 1 (the whole tensor)
  std::uint64_t* digests = nullptr;
};

}  // namespace kernel_align::cuda
