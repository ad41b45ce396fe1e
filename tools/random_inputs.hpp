// Seeded random arrays for the jobs that generate their own tensors (run, verify), from
// the cases' generator (src/cases/inputs.hpp): the same numbers on every platform.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "cases/inputs.hpp"
#include "npy.hpp"
#include "tensor_io.hpp"

namespace kernel_align::cli {

using cases::Random;

// An array of `dtype` and `shape` whose values are uniform in [lo, lo + width), rounded
// to the dtype as an op stores its results.
inline NpyArray random_tensor(Random& random, DType dtype, std::vector<std::int64_t> shape,
                              float lo, float width) {
  NpyArray a = make_npy_array(npy_type_of(dtype), std::move(shape));
  cases::fill_uniform(random, dtype, a.data, lo, width);
  return a;
}

}  // namespace kernel_align::cli
