// latent_normalize and latent_pack on the CPU. The normalization: rows (the last dim) in
// ranges over the pool, each unit-stride row through the selected GEMM path's vector row
// (cpu/gemm/latent_simd.hpp), a strided row element by element through the contract's
// scalar function (the same bits). The patchify: a pair of latent rows (2i, 2i + 1) of a
// sample a unit of work, whose tokens i * W/2 .. (i + 1) * W/2 - 1 it fills (or reads)
// whole; where the latents' W and the tokens' features are unit-stride, each token's two
// adjacent elements of a latent row move as one word, and fp32 words by the path's
// register transposes (cpu/gemm/latent_simd.hpp) where it has them.
#include <algorithm>
#include <cstring>

#include "cpu/cpu_backend.hpp"
#include "cpu/gemm/gemm.hpp"
#include "cpu/pool_passes.hpp"
#include "kernel_align/contract/latent.hpp"

namespace kernel_align::cpu {
namespace {

void latent_normalize(const detail::LatentNormalizeProblem& p, registry::Execution& exec) {
  const Isa path = gemm_isa(isa());
  exec.isa = isa_name(path);
  const LatentNormalizeRow vector_row = gemm_latent_normalize_row(path);
  const std::int64_t d = p.in.shape[p.in.rank - 1], channels = p.in.shape[1];
  const std::int64_t per_channel = detail::latent_rows_per_channel(p.in);
  const std::int64_t in_step = p.in.strides[p.in.rank - 1];
  const std::int64_t out_step = p.out.strides[p.out.rank - 1];
  const bool unit = in_step == 1 && out_step == 1;
  // Rows h of a channel's [H, W] plane follow each other in memory, in and out.
  const bool planes = unit && p.in.rank == 4 && p.in.strides[2] == d && p.out.strides[2] == d;
  const detail::RowIndexer in_rows(p.in), out_rows{ConstTensorView(p.out)};
  const auto in_size = static_cast<std::int64_t>(dtype_size(p.in.dtype));
  const auto out_size = static_cast<std::int64_t>(dtype_size(p.out.dtype));
  for_rows(detail::row_count(p.in), static_cast<int>(d), exec, [&](RowRange range) {
    for (std::int64_t r = range.begin; r < range.end;) {
      const std::int64_t c = detail::latent_channel_of_row(r, channels, per_channel);
      const contract::LatentChannel k = detail::latent_channel_of(p, c);
      const std::int64_t in0 = in_rows.offset(r), out0 = out_rows.offset(r);
      if (unit) {
        // A contiguous [H, W] plane's rows from r are one vector row: a row of W alone
        // spent much of its time on its channel's and offsets' integer divisions.
        const std::int64_t plane_end = (r / per_channel + 1) * per_channel;
        const std::int64_t end = planes ? std::min(plane_end, range.end) : r + 1;
        vector_row({static_cast<const char*>(p.in.data) + in0 * in_size,
                    static_cast<char*>(p.out.data) + out0 * out_size, (end - r) * d, k, p.in.dtype,
                    p.out.dtype});
        r = end;
        continue;
      }
      for (std::int64_t i = 0; i < d; ++i) {
        const float z = contract::load_f32(p.in.dtype, p.in.data, in0 + i * in_step);
        contract::store_output(p.out.dtype, p.out.data, out0 + i * out_step,
                               contract::latent_normalized(k, z));
      }
      ++r;
    }
  });
}

// Copies an element (or a word) between a latent's and a token's byte offsets: to the
// token (pack) or to the latent (unpack).
struct Mover {
  const char* from;
  char* to;
  bool to_tokens;
  void move(std::int64_t latent, std::int64_t token, std::size_t bytes) const {
    if (to_tokens) {
      std::memcpy(to + token, from + latent, bytes);
    } else {
      std::memcpy(to + latent, from + token, bytes);
    }
  }
};

// Moves the elements of latent rows 2i and 2i + 1 of every channel of sample b to or from
// their tokens, unit-stride rows and features: a token's two elements of a latent row
// are adjacent in both, one Word.
template <class Word>
void move_row_pair_unit(const ConstTensorView& latents, const ConstTensorView& tokens,
                        std::int64_t b, std::int64_t i, const Mover& mover) {
  constexpr auto kWord = static_cast<std::int64_t>(sizeof(Word));
  constexpr std::int64_t kElement = kWord / 2;
  // A block of tokens whose words of one latent row fill a 64-byte line: each latent
  // line is read (or written) whole while the block's tokens stay in L1. Token by token
  // over the whole row instead, the 2C rows a channel stride apart (a multiple of 4 KiB
  // at 128 x 128) evict each other's lines.
  constexpr std::int64_t kBlock = 64 / kWord;
  const std::int64_t half_width = latents.shape[3] / 2, channels = latents.shape[1];
  const std::int64_t row0 = (b * latents.strides[0] + 2 * i * latents.strides[2]) * kElement;
  const std::int64_t channel_step = latents.strides[1] * kElement;
  const std::int64_t row_step = latents.strides[2] * kElement;
  const std::int64_t token_step = tokens.strides[1] * kElement;
  const std::int64_t token0 =
      (b * tokens.strides[0] + i * half_width * tokens.strides[1]) * kElement;
  for (std::int64_t j0 = 0; j0 < half_width; j0 += kBlock) {
    const std::int64_t j1 = j0 + kBlock < half_width ? j0 + kBlock : half_width;
    for (std::int64_t c = 0; c < channels; ++c) {
      for (std::int64_t di = 0; di < 2; ++di) {
        const std::int64_t row = row0 + c * channel_step + di * row_step;
        const std::int64_t feature = (4 * c + 2 * di) * kElement;
        for (std::int64_t j = j0; j < j1; ++j)
          mover.move(row + j * kWord, token0 + j * token_step + feature, sizeof(Word));
      }
    }
  }
}

// The same for any strides, an element at a time (contract::latent_token_index).
void move_row_pair_strided(const ConstTensorView& latents, const ConstTensorView& tokens,
                           std::int64_t b, std::int64_t i, const Mover& mover) {
  const std::size_t size = dtype_size(latents.dtype);
  const auto bytes = static_cast<std::int64_t>(size);
  const std::int64_t width = latents.shape[3];
  for (std::int64_t c = 0; c < latents.shape[1]; ++c) {
    for (std::int64_t h = 2 * i; h < 2 * i + 2; ++h) {
      for (std::int64_t w = 0; w < width; ++w) {
        const contract::LatentTokenIndex t = contract::latent_token_index(c, h, w, width);
        mover.move(bytes * (b * latents.strides[0] + c * latents.strides[1] +
                            h * latents.strides[2] + w * latents.strides[3]),
                   bytes * (b * tokens.strides[0] + t.token * tokens.strides[1] +
                            t.feature * tokens.strides[2]),
                   size);
      }
    }
  }
}

void move_latents(const ConstTensorView& latents, const ConstTensorView& tokens, const Mover& mover,
                  registry::Execution& exec) {
  const Isa path = gemm_isa(isa());
  exec.isa = isa_name(path);
  const std::int64_t pairs = latents.shape[2] / 2, half_width = latents.shape[3] / 2;
  const bool unit = latents.strides[3] == 1 && tokens.strides[2] == 1;
  const std::size_t size = dtype_size(latents.dtype);
  // fp32 through the path's register transposes where its channel groups divide C.
  const LatentPackPairs& vector_pairs = gemm_latent_pack_pairs(path);
  const bool by_vectors = unit && size == 4 && vector_pairs.run != nullptr &&
                          latents.shape[1] % vector_pairs.channel_group == 0;
  // A unit's elements, 2 C W, as a row for the pool's threshold.
  const int unit_elements = static_cast<int>(2 * latents.shape[1] * latents.shape[3]);
  for_rows(latents.shape[0] * pairs, unit_elements, exec, [&](RowRange range) {
    for (std::int64_t u = range.begin; u < range.end; ++u) {
      const std::int64_t b = u / pairs, i = u % pairs;
      if (by_vectors) {
        constexpr std::int64_t kBytes = 4;
        vector_pairs.run(
            {mover.from, mover.to, kBytes * (b * latents.strides[0] + 2 * i * latents.strides[2]),
             kBytes * (b * tokens.strides[0] + i * half_width * tokens.strides[1]),
             kBytes * latents.strides[1], kBytes * latents.strides[2], kBytes * tokens.strides[1],
             latents.shape[1], half_width, mover.to_tokens});
      } else if (unit && size == 4) {
        move_row_pair_unit<std::uint64_t>(latents, tokens, b, i, mover);
      } else if (unit) {
        move_row_pair_unit<std::uint32_t>(latents, tokens, b, i, mover);
      } else {
        move_row_pair_strided(latents, tokens, b, i, mover);
      }
    }
  });
}

void latent_pack(const detail::LatentPackProblem& p, registry::Execution& exec) {
  move_latents(p.latents, ConstTensorView(p.tokens),
               {static_cast<const char*>(p.latents.data), static_cast<char*>(p.tokens.data), true},
               exec);
}

void latent_unpack(const detail::LatentUnpackProblem& p, registry::Execution& exec) {
  move_latents(ConstTensorView(p.latents), p.tokens,
               {static_cast<const char*>(p.tokens.data), static_cast<char*>(p.latents.data), false},
               exec);
}

}  // namespace

void add_latent_normalize_kernels(registry::Kernels& k) {
  k.set<OpType::LatentNormalize, Direction::Forward>(latent_normalize);
  k.set<OpType::LatentNormalize, Direction::Backward>(latent_normalize);
}

void add_latent_pack_kernels(registry::Kernels& k) {
  k.set<OpType::LatentPack, Direction::Forward>(latent_pack);
  k.set<OpType::LatentPack, Direction::Backward>(latent_unpack);
}

}  // namespace kernel_align::cpu
