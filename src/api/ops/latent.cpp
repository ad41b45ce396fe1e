// latent_normalize and latent_pack (contract section 16): their validators (each argument
// checked and named, the call's tensors listed once for the aliasing rule) and their
// public functions (kernel_align/ops.hpp).
#include "api/ops/latent.hpp"

#include <string>

#include "api/run.hpp"
#include "api/validate.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"

namespace kernel_align {
namespace detail {
namespace {

constexpr std::string_view kChannelsRank = "rank 3 or 4 ([B, C, L] or [B, C, H, W])";

void check_channels(const char* name, const ConstTensorView& t) {
  check_view(name, t, 3, 4, {kChannelsRank});
}

// A [C] vector of per-channel constants of `latents` (dim 1).
void check_constants(const char* name, const ConstTensorView& t, const char* latents_name,
                     const ConstTensorView& latents) {
  check_view(name, t, 1, 1, {kVectorRank});
  if (t.shape[0] != latents.shape[1]) {
    throw Error(
        name, "shape [" + std::to_string(latents.shape[1]) + "] (C, dim 1 of " + latents_name + ")",
        "shape " + shape_string(t));
  }
}

CallRecord normalize_record(Direction direction, const LatentNormalizeOptions& o,
                            DType output_dtype) {
  CallRecord record = record_of(OpType::LatentNormalize, direction, output_dtype);
  add_option(record, choice("transform", latent_transform_name(o.transform)));
  return record;
}

// Latents [B, C, H, W] with H and W even; returns nothing, throws naming `name`.
void check_packable(const char* name, const ConstTensorView& t) {
  check_view(name, t, 4, 4, {"rank 4 ([B, C, H, W])"});
  if (t.shape[2] % 2 != 0 || t.shape[3] % 2 != 0) {
    throw Error(name,
                "even H and W (2x2 patches; the pipelines' latent sizes are 2 * (pixels // 16))",
                "shape " + shape_string(t));
  }
}

CallRecord pack_record(Direction direction, const ConstTensorView& latents, DType output_dtype) {
  CallRecord record = record_of(OpType::LatentPack, direction, output_dtype);
  add_option(record, integer_value("height", latents.shape[2]));
  add_option(record, integer_value("width", latents.shape[3]));
  return record;
}

// The tokens [B, H/2 * W/2, 4C] of latents [B, C, H, W], of the latents' dtype.
void check_tokens_of(const char* name, const ConstTensorView& tokens, const char* latents_name,
                     const ConstTensorView& latents) {
  const std::int64_t b = latents.shape[0], c = latents.shape[1];
  const std::int64_t s = (latents.shape[2] / 2) * (latents.shape[3] / 2);
  if (tokens.rank != 3 || tokens.shape[0] != b || tokens.shape[1] != s ||
      tokens.shape[2] != 4 * c) {
    throw Error(name,
                "shape [" + std::to_string(b) + ", " + std::to_string(s) + ", " +
                    std::to_string(4 * c) + "] ([B, H/2 * W/2, 4C] of " + latents_name + " " +
                    shape_string(latents) + ")",
                "shape " + shape_string(tokens));
  }
  if (tokens.dtype != latents.dtype) {
    throw Error(name,
                std::string("dtype ") + dtype_name(latents.dtype) + " (that of " + latents_name +
                    ": a permutation copies bytes)",
                std::string("dtype ") + dtype_name(tokens.dtype));
  }
}

}  // namespace

Call<LatentNormalizeProblem> latent_normalize_forward_call(const ConstTensorView& z,
                                                           const ConstTensorView& mean,
                                                           const ConstTensorView& std,
                                                           const TensorView& y,
                                                           const LatentNormalizeOptions& options) {
  check_channels("z", z);
  check_constants("mean", mean, "z", z);
  check_constants("std", std, "z", z);
  check_channels("y", y);
  check_same_shape("y", y, "z", z);
  Call<LatentNormalizeProblem> call{
      normalize_record(Direction::Forward, options, y.dtype),
      {z, mean, std, y, options.transform == LatentTransform::Denormalize}};
  check_call(call.record, {z, mean, std, y});
  return call;
}

Call<LatentNormalizeProblem> latent_normalize_backward_call(const ConstTensorView& dy,
                                                            const ConstTensorView& std,
                                                            const TensorView& dz,
                                                            const LatentNormalizeOptions& options) {
  check_channels("dy", dy);
  check_constants("std", std, "dy", dy);
  check_channels("dz", dz);
  check_same_shape("dz", dz, "dy", dy);
  Call<LatentNormalizeProblem> call{
      normalize_record(Direction::Backward, options, dz.dtype),
      {dy, ConstTensorView(), std, dz, options.transform == LatentTransform::Denormalize}};
  check_call(call.record, {dy, std, dz});
  return call;
}

Call<LatentPackProblem> latent_pack_forward_call(const ConstTensorView& x, const TensorView& y) {
  check_packable("x", x);
  check_view("y", y, 3, 3, {"rank 3 ([B, S, 4C])"});
  check_tokens_of("y", y, "x", x);
  Call<LatentPackProblem> call{pack_record(Direction::Forward, x, y.dtype), {x, y}};
  check_call(call.record, {x, y});
  return call;
}

Call<LatentUnpackProblem> latent_pack_backward_call(const ConstTensorView& dy,
                                                    const TensorView& dx) {
  check_view("dy", dy, 3, 3, {"rank 3 ([B, S, 4C])"});
  check_packable("dx", dx);
  check_tokens_of("dy", dy, "dx", dx);
  Call<LatentUnpackProblem> call{pack_record(Direction::Backward, dx, dx.dtype), {dy, dx}};
  check_call(call.record, {dy, dx});
  return call;
}

}  // namespace detail

void latent_normalize_forward(const ConstTensorView& z, const ConstTensorView& mean,
                              const ConstTensorView& std, const TensorView& y,
                              const LatentNormalizeOptions& options,
                              const ExecutionContext& context) {
  detail::run<OpType::LatentNormalize, Direction::Forward>(
      context, [&] { return detail::latent_normalize_forward_call(z, mean, std, y, options); });
}

void latent_normalize_backward(const ConstTensorView& dy, const ConstTensorView& std,
                               const TensorView& dz, const LatentNormalizeOptions& options,
                               const ExecutionContext& context) {
  detail::run<OpType::LatentNormalize, Direction::Backward>(
      context, [&] { return detail::latent_normalize_backward_call(dy, std, dz, options); });
}

void latent_pack_forward(const ConstTensorView& x, const TensorView& y,
                         const ExecutionContext& context) {
  detail::run<OpType::LatentPack, Direction::Forward>(
      context, [&] { return detail::latent_pack_forward_call(x, y); });
}

void latent_pack_backward(const ConstTensorView& dy, const TensorView& dx,
                          const ExecutionContext& context) {
  detail::run<OpType::LatentPack, Direction::Backward>(
      context, [&] { return detail::latent_pack_backward_call(dy, dx); });
}

}  // namespace kernel_align
