// Joint attention as its engines compute it (docs/contract.md, "Joint attention"): q, k,
// v and the outputs as [B, S, H, D] element strides, the key-padding mask as bytes.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "kernel_align/contract/convert.hpp"
#include "kernel_align/dtype.hpp"

namespace kernel_align::detail {

// Element (b, s, h, d) at data[b * strides[0] + s * strides[1] + h * strides[2] +
// d * strides[3]].
struct AttentionInput {
  const void* data;
  DType dtype;
  std::array<std::int64_t, 4> strides;
  std::int64_t offset(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const {
    return b * strides[0] + s * strides[1] + h * strides[2] + d * strides[3];
  }
};

struct AttentionOutput {
  void* data;
  DType dtype;
  std::array<std::int64_t, 4> strides;
  std::int64_t offset(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const {
    return b * strides[0] + s * strides[1] + h * strides[2] + d * strides[3];
  }
};

// Token (b, s) takes part when data[b * batch_stride + s * seq_stride] != 0; every token
// does when data is null.
struct AttentionMask {
  const std::uint8_t* data = nullptr;
  std::int64_t batch_stride = 0;
  std::int64_t seq_stride = 0;
};

struct AttentionProblem {
  std::int64_t batch, seq, heads, dim;
  AttentionInput q, k, v;
  AttentionMask mask;
  AttentionOutput out;
};

struct AttentionBackwardProblem {
  std::int64_t batch, seq, heads, dim;
  AttentionInput q, k, v;
  AttentionMask mask;
  AttentionInput out, dout;  // the forward's output and its gradient
  AttentionOutput dq, dk, dv;
};

// The valid positions t_0 < t_1 < ... of sample b (host memory).
inline std::vector<std::int64_t> attention_valid_tokens(const AttentionMask& mask, std::int64_t seq,
                                                        std::int64_t b) {
  std::vector<std::int64_t> tokens;
  tokens.reserve(static_cast<std::size_t>(seq));
  for (std::int64_t s = 0; s < seq; ++s) {
    if (mask.data == nullptr || mask.data[b * mask.batch_stride + s * mask.seq_stride] != 0) {
      tokens.push_back(s);
    }
  }
  return tokens;
}

// +0 at every (s, h, d) of sample b whose position s is not among `valid` (sorted).
inline void attention_zero_padding(const AttentionOutput& t, std::int64_t b, std::int64_t seq,
                                   std::int64_t heads, std::int64_t dim,
                                   const std::vector<std::int64_t>& valid) {
  std::size_t next = 0;
  for (std::int64_t s = 0; s < seq; ++s) {
    if (next < valid.size() && valid[next] == s) {
      ++next;
      continue;
    }
    for (std::int64_t h = 0; h < heads; ++h) {
      for (std::int64_t d = 0; d < dim; ++d) {
        contract::store_output(t.dtype, t.data, t.offset(b, s, h, d), 0.0f);
      }
    }
  }
}

}  // namespace kernel_align::detail
