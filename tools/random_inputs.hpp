// Seeded random inputs for the jobs that generate their own tensors (run, verify): the
// same numbers on every platform and standard library (the std:: distributions are
// implementation-defined).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kernel_align/contract/convert.hpp"
#include "npy.hpp"
#include "tensor_io.hpp"

namespace kernel_align::cli {

// splitmix64: a fixed, platform-independent stream.
class Random {
 public:
  explicit Random(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, lo + 2^k) from 24 random bits; every step is exact in fp32.
  float uniform(float lo, float width) {
    return lo + width * (static_cast<float>(next() >> 40) * 0x1p-24f);
  }

 private:
  std::uint64_t state_;
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
