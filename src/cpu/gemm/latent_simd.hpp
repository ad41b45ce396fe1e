// latent_normalize's row over vectors of fp32 lanes (docs/contract.md section 16), one
// template for every GEMM path (portable: one lane): each lane the contract's sub, div
// and add (correctly rounded, as contract::latent_normalized's), the tail one lane at a
// time through the scalar function.
#pragma once

#include <cstring>

#include "cpu/gemm/flow_sde_simd.hpp"  // over_row
#include "cpu/gemm/latent_row.hpp"

namespace kernel_align::cpu {
namespace {

template <class V>
void run_latent_normalize_row(const LatentRow& r) {
  const contract::LatentChannel& k = r.channel;
  const auto mean = V::set1(k.mean), divisor = V::set1(k.divisor);
  over_row<V>(
      r.count,
      [&](std::int64_t i) {
        auto z = V::load_widened(r.in_dtype, r.in, i);
        if (k.subtract_first) z = V::sub(z, mean);
        z = V::div(z, divisor);
        if (k.add_last) z = V::add(z, mean);
        V::store_output(r.out_dtype, r.out, i, z);
      },
      [&](std::int64_t i) {
        contract::store_output(
            r.out_dtype, r.out, i,
            contract::latent_normalized(k, contract::load_f32(r.in_dtype, r.in, i)));
      });
}

// The pairs of rows 2i and 2i + 1 of `channel_group` = kPairs / 2 channels and kPairs
// tokens form a kPairs x kPairs matrix of 8-byte pairs: row k of it is latent row (c0 + k/2,
// 2i + k%2) at tokens j0.., column k token j0 + k's features 4 c0.. (the same pairs in the
// order (c, di)). The block is loaded by rows from one side, transposed in registers
// (V::transpose_pairs, its own inverse), and stored by rows to the other: whole vectors
// each way where a pair at a time moved 8 bytes. Tokens past the last whole block move
// a pair at a time.
template <class V>
void run_latent_pack_pairs(const LatentPairRows& r) {
  constexpr int kPairs = V::kPairs;
  constexpr std::int64_t kPairBytes = 8, kElementBytes = 4;
  const auto latent_at = [&](std::int64_t c0, int k, std::int64_t j) {
    return r.latent0 + (c0 + k / 2) * r.channel_step + (k % 2) * r.row_step + j * kPairBytes;
  };
  const auto token_at = [&](std::int64_t c0, int k, std::int64_t j) {
    return r.token0 + j * r.token_step + (4 * c0 + 2 * k) * kElementBytes;
  };
  const std::int64_t blocks = r.half_width / kPairs * kPairs;
  for (std::int64_t c0 = 0; c0 < r.channels; c0 += kPairs / 2) {
    for (std::int64_t j0 = 0; j0 < blocks; j0 += kPairs) {
      typename V::Pairs rows[kPairs];
      for (int k = 0; k < kPairs; ++k) {
        rows[k] =
            V::load_pairs(r.from + (r.to_tokens ? latent_at(c0, k, j0) : token_at(c0, 0, j0 + k)));
      }
      V::transpose_pairs(rows);
      for (int k = 0; k < kPairs; ++k) {
        V::store_pairs(r.to + (r.to_tokens ? token_at(c0, 0, j0 + k) : latent_at(c0, k, j0)),
                       rows[k]);
      }
    }
    for (std::int64_t j = blocks; j < r.half_width; ++j) {
      for (int k = 0; k < kPairs; ++k) {
        const std::int64_t latent = latent_at(c0, k, j), token = token_at(c0, k, j);
        std::memcpy(r.to + (r.to_tokens ? token : latent), r.from + (r.to_tokens ? latent : token),
                    kPairBytes);
      }
    }
  }
}

template <class V>
constexpr LatentPackPairs latent_pack_pairs() {
  return {&run_latent_pack_pairs<V>, V::kPairs / 2};
}

}  // namespace
}  // namespace kernel_align::cpu
