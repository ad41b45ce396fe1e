// Seeded random inputs for the jobs that generate their own tensors (run, verify), drawn
// from splitmix64 (src/core/splitmix64.hpp): the same numbers on every platform.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/splitmix64.hpp"
#include "kernel_align/contract/convert.hpp"
#include "npy.hpp"
#include "tensor_io.hpp"

namespace kernel_align::cli {

class Random : public SplitMix64 {
 public:
  using SplitMix64::SplitMix64;
  // Uniform in [lo, lo + 2^k) from 24 random bits; every step is exact in fp32.
  float uniform(float lo, float width) {
    return lo + width * (static_cast<float>(next() >> 40) * 0x1p-24f);
  }
};

// An array of `dtype` and `shape` whose values are uniform in [lo, lo + width), rounded
// to the dtype as an op stores its results.
inline NpyArray random_tensor(Random& random, DType dtype, std::vector<std::int64_t> shape,
                              float lo, float width) {
  NpyArray a = make_npy_array(npy_type_of(dtype), std::move(shape));
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    contract::store_output(dtype, a.data.data(), i, random.uniform(lo, width));
  }
  return a;
}

}  // namespace kernel_align::cli
