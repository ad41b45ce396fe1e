// latent_normalize's row over vectors of fp32 lanes (docs/contract.md section 16), one
// template for every GEMM path (portable: one lane): each lane the contract's sub, div
// and add (correctly rounded, as contract::latent_normalized's), the tail one lane at a
// time through the scalar function.
#pragma once

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

}  // namespace
}  // namespace kernel_align::cpu
