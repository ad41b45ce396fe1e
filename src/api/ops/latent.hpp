// The validators of latent_normalize and latent_pack: they check every argument of a
// call (kernel_align::Error names the first bad one) and return the call the backends run
// (api/call.hpp). Defined, with the ops' public functions, in api/ops/latent.cpp.
#pragma once

#include "api/call.hpp"

namespace kernel_align::detail {

Call<LatentNormalizeProblem> latent_normalize_forward_call(const ConstTensorView& z,
                                                           const ConstTensorView& mean,
                                                           const ConstTensorView& std,
                                                           const TensorView& y,
                                                           const LatentNormalizeOptions& options);

Call<LatentNormalizeProblem> latent_normalize_backward_call(const ConstTensorView& dy,
                                                            const ConstTensorView& std,
                                                            const TensorView& dz,
                                                            const LatentNormalizeOptions& options);

Call<LatentPackProblem> latent_pack_forward_call(const ConstTensorView& x, const TensorView& y);

Call<LatentUnpackProblem> latent_pack_backward_call(const ConstTensorView& dy,
                                                    const TensorView& dx);

}  // namespace kernel_align::detail
