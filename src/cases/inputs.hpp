// Seeded random inputs of verify, `kernel-align run` and the benchmark, drawn from
// splitmix64 (src/core/splitmix64.hpp): the same numbers on every platform.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "core/splitmix64.hpp"
#include "kernel_align/dtype.hpp"

namespace kernel_align::cases {

// Uniform in [lo, lo + width) from the top 24 of 64 random bits; every step is exact in
// fp32 when width is a power of 2.
inline float uniform_of(std::uint64_t bits, float lo, float width) {
  return lo + width * (static_cast<float>(bits >> 40) * 0x1p-24f);
}

class Random : public SplitMix64 {
 public:
  using SplitMix64::SplitMix64;
  float uniform(float lo, float width) { return uniform_of(next(), lo, width); }
};

// Fills `bytes` (elements of `dtype`, contiguous) with the next values of
// random.uniform(lo, width), in order, rounded to the dtype as an op stores its results,
// and moves `random` past them. Large fills are drawn on every core, in ranges that
// skip ahead in the stream: the numbers do not depend on the core count.
void fill_uniform(Random& random, DType dtype, std::span<std::byte> bytes, float lo, float width);

// 64-bit FNV-1a of `name`: the seed of a case's inputs from its name, so that they do
// not depend on which other cases run.
std::uint64_t seed_of(std::string_view name);

}  // namespace kernel_align::cases
