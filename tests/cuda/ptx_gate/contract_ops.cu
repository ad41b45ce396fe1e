// The library's own contract operations (include/kernel_align/contract/float_ops.hpp)
// on a device: they must pass the gate whatever --fmad says.
#include "kernel_align/contract/float_ops.hpp"

namespace c = kernel_align::contract;

__global__ void contract_ops(const float* a, const float* b, float* out) {
  const int i = static_cast<int>(threadIdx.x);
  const float x = a[i];
  const float y = b[i];
  const float sum = c::add(c::mul(x, y), c::sub(x, y));
  const float r = c::sqrt_rn(c::div(sum, y));
  out[i] = c::is_nan(r) ? c::float_of(0x7FC00000u) : r;
}
