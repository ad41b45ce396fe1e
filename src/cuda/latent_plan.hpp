// latent_normalize's and latent_pack's launches (device/latent_kernels.cuh) from their
// validated problems, for plan.hpp's Executors: one launch each, a thread an element.
#pragma once

#include <cstdint>

#include "api/latent_problem.hpp"
#include "cuda/device/latent_kernels.cuh"
#include "cuda/modulation_plan.hpp"  // item_launch
#include "cuda/plan.hpp"

namespace kernel_align::cuda::plan {

inline ChannelVector channel_vector(const ConstTensorView& v) {
  return v.data != nullptr ? ChannelVector{v.data, v.dtype, v.strides[0]} : ChannelVector{};
}

template <class Executor>
void latent_normalize(const detail::LatentNormalizeProblem& p, Executor& exec) {
  LatentNormalizeParams a;
  a.in = row_tensor(p.in);
  a.out = out_row_tensor(p.out);
  a.mean = channel_vector(p.mean);
  a.std = channel_vector(p.std);
  a.rows = detail::row_count(p.in);
  a.d = p.in.shape[p.in.rank - 1];
  a.channels = p.in.shape[1];
  a.rows_per_channel = detail::latent_rows_per_channel(p.in);
  a.denormalize = p.denormalize;
  exec.template launch<LatentNormalizeKernel>(item_launch("latent_normalize", a.rows * a.d), a);
}

// The latents' and tokens' extents and strides; the caller sets from, to and to_tokens.
inline LatentPackParams latent_pack_params(const ConstTensorView& latents,
                                           const ConstTensorView& tokens) {
  LatentPackParams a;
  a.element_bytes = static_cast<std::int64_t>(dtype_size(latents.dtype));
  a.batch = latents.shape[0];
  a.channels = latents.shape[1];
  a.height = latents.shape[2];
  a.width = latents.shape[3];
  for (int i = 0; i < 4; ++i) a.latent_strides[i] = latents.strides[i];
  for (int i = 0; i < 3; ++i) a.token_strides[i] = tokens.strides[i];
  return a;
}

template <class Executor>
void latent_pack(const detail::LatentPackProblem& p, Executor& exec) {
  LatentPackParams a = latent_pack_params(p.latents, ConstTensorView(p.tokens));
  a.from = static_cast<const char*>(p.latents.data);
  a.to = static_cast<char*>(p.tokens.data);
  a.to_tokens = true;
  exec.template launch<LatentPackKernel>(item_launch("latent_pack", p.latents.numel()), a);
}

template <class Executor>
void latent_unpack(const detail::LatentUnpackProblem& p, Executor& exec) {
  LatentPackParams a = latent_pack_params(ConstTensorView(p.latents), p.tokens);
  a.from = static_cast<const char*>(p.tokens.data);
  a.to = static_cast<char*>(p.latents.data);
  a.to_tokens = false;
  exec.template launch<LatentPackKernel>(item_launch("latent_unpack", p.tokens.numel()), a);
}

}  // namespace kernel_align::cuda::plan
