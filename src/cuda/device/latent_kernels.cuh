// The CUDA kernel bodies of latent_normalize and latent_pack (docs/contract.md section
// 16), written as kernels.cuh's: a thread an element. The normalization: the element's
// channel constants and contract::latent_normalized (rows through RowIndexer, any rank 3
// or 4, dtypes and strides; an output may be its input, each element read and written by
// its own thread). The patchify: the latent element's bytes copied to or from the token
// and feature contract::latent_token_index names (the output never overlaps the input).
#pragma once

#include <cstdint>
#include <cstring>

#include "api/latent_problem.hpp"
#include "cuda/device/params.hpp"
#include "cuda/device/primitives.cuh"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/latent.hpp"

namespace kernel_align::cuda {

// A [C] vector of per-channel constants.
struct ChannelVector {
  const void* data = nullptr;  // null: absent (the backward's mean)
  DType dtype = DType::F32;
  std::int64_t step = 1;
};

struct LatentNormalizeParams {
  RowTensor in;
  OutRowTensor out;
  ChannelVector mean;
  ChannelVector std;
  std::int64_t rows = 0;
  std::int64_t d = 0;
  std::int64_t channels = 1;
  std::int64_t rows_per_channel = 1;
  bool denormalize = false;
};

KA_DEVICE float channel_value(const ChannelVector& v, std::int64_t c) {
  return contract::load_f32(v.dtype, v.data, c * v.step);
}

template <class Grid>
struct LatentNormalizeKernel {
  using Params = LatentNormalizeParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    const std::int64_t e = global_thread<Grid>();
    if (e >= p.rows * p.d) return;
    const std::int64_t row = e / p.d, i = e % p.d;
    const std::int64_t c = detail::latent_channel_of_row(row, p.channels, p.rows_per_channel);
    const bool gradient = p.mean.data == nullptr;
    const contract::LatentChannel k = contract::latent_channel(
        p.denormalize, gradient, gradient ? 0.0f : channel_value(p.mean, c),
        channel_value(p.std, c));
    const float z =
        contract::load_f32(p.in.dtype, p.in.data, p.in.rows.offset(row) + i * p.in.step);
    contract::store_output(p.out.dtype, p.out.data, p.out.rows.offset(row) + i * p.out.step,
                           contract::latent_normalized(k, z));
  }
};

struct LatentPackParams {
  const char* from = nullptr;  // the latents (pack) or the tokens (unpack)
  char* to = nullptr;
  std::int64_t element_bytes = 4;
  std::int64_t batch = 0, channels = 0, height = 0, width = 0;
  std::int64_t latent_strides[4] = {};  // in elements
  std::int64_t token_strides[3] = {};
  bool to_tokens = true;
};

template <class Grid>
struct LatentPackKernel {
  using Params = LatentPackParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    const std::int64_t e = global_thread<Grid>();
    if (e >= p.batch * p.channels * p.height * p.width) return;
    const std::int64_t w = e % p.width, h = (e / p.width) % p.height;
    const std::int64_t c = (e / (p.width * p.height)) % p.channels;
    const std::int64_t b = e / (p.width * p.height * p.channels);
    const contract::LatentTokenIndex t = contract::latent_token_index(c, h, w, p.width);
    const std::int64_t latent =
        p.element_bytes * (b * p.latent_strides[0] + c * p.latent_strides[1] +
                           h * p.latent_strides[2] + w * p.latent_strides[3]);
    const std::int64_t token =
        p.element_bytes *
        (b * p.token_strides[0] + t.token * p.token_strides[1] + t.feature * p.token_strides[2]);
    const auto bytes = static_cast<std::size_t>(p.element_bytes);
    if (p.to_tokens) {
      std::memcpy(p.to + token, p.from + latent, bytes);
    } else {
      std::memcpy(p.to + latent, p.from + token, bytes);
    }
  }
};

}  // namespace kernel_align::cuda
