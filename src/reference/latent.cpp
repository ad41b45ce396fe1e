// latent_normalize and latent_pack under the contract (docs/contract.md section 16),
// applied literally: every element through contract::latent_normalized with its channel's
// constants, every latent element's bytes copied to the token and feature
// contract::latent_token_index names (or back).
#include <cstdint>
#include <cstring>

#include "api/problems.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/latent.hpp"
#include "reference/kernels.hpp"

namespace kernel_align::reference {
namespace {

void normalize(const detail::LatentNormalizeProblem& p, registry::Execution& exec) {
  const std::int64_t rows = detail::row_count(p.in);
  record_scalar(exec, {rows});
  const detail::RowIndexer in_rows(p.in), out_rows{ConstTensorView(p.out)};
  const std::int64_t d = p.in.shape[p.in.rank - 1], channels = p.in.shape[1];
  const std::int64_t per_channel = detail::latent_rows_per_channel(p.in);
  const std::int64_t in_step = p.in.strides[p.in.rank - 1];
  const std::int64_t out_step = p.out.strides[p.out.rank - 1];
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t c = detail::latent_channel_of_row(r, channels, per_channel);
    const contract::LatentChannel k = detail::latent_channel_of(p, c);
    for (std::int64_t i = 0; i < d; ++i) {
      const float z = contract::load_f32(p.in.dtype, p.in.data, in_rows.offset(r) + i * in_step);
      contract::store_output(p.out.dtype, p.out.data, out_rows.offset(r) + i * out_step,
                             contract::latent_normalized(k, z));
    }
  }
}

// Each latent element's offset and its token element's, in elements, to `copy`.
template <class Copy>
void for_latent_elements(const ConstTensorView& latents, const ConstTensorView& tokens,
                         const Copy& copy) {
  const std::int64_t width = latents.shape[3];
  for (std::int64_t b = 0; b < latents.shape[0]; ++b) {
    for (std::int64_t c = 0; c < latents.shape[1]; ++c) {
      for (std::int64_t h = 0; h < latents.shape[2]; ++h) {
        for (std::int64_t w = 0; w < width; ++w) {
          const contract::LatentTokenIndex t = contract::latent_token_index(c, h, w, width);
          copy(b * latents.strides[0] + c * latents.strides[1] + h * latents.strides[2] +
                   w * latents.strides[3],
               b * tokens.strides[0] + t.token * tokens.strides[1] + t.feature * tokens.strides[2]);
        }
      }
    }
  }
}

void pack(const detail::LatentPackProblem& p, registry::Execution& exec) {
  record_scalar(exec, {detail::row_count(p.latents)});
  const std::size_t size = dtype_size(p.latents.dtype);
  for_latent_elements(p.latents, ConstTensorView(p.tokens),
                      [&](std::int64_t latent, std::int64_t token) {
                        std::memcpy(static_cast<char*>(p.tokens.data) + token * size,
                                    static_cast<const char*>(p.latents.data) + latent * size, size);
                      });
}

void unpack(const detail::LatentUnpackProblem& p, registry::Execution& exec) {
  record_scalar(exec, {detail::row_count(ConstTensorView(p.latents))});
  const std::size_t size = dtype_size(p.tokens.dtype);
  for_latent_elements(ConstTensorView(p.latents), p.tokens,
                      [&](std::int64_t latent, std::int64_t token) {
                        std::memcpy(static_cast<char*>(p.latents.data) + latent * size,
                                    static_cast<const char*>(p.tokens.data) + token * size, size);
                      });
}

}  // namespace

void add_latent_normalize_kernels(registry::Kernels& k) {
  k.set<OpType::LatentNormalize, Direction::Forward>(normalize);
  k.set<OpType::LatentNormalize, Direction::Backward>(normalize);
}

void add_latent_pack_kernels(registry::Kernels& k) {
  k.set<OpType::LatentPack, Direction::Forward>(pack);
  k.set<OpType::LatentPack, Direction::Backward>(unpack);
}

}  // namespace kernel_align::reference
