#include "cpu/cpu_backend.hpp"

namespace kernel_align::cpu {

registry::Kernels simd_kernels() {
  registry::Kernels k;
#define KERNEL_ALIGN_ADD_KERNELS(Enumerator, name) add_##name##_kernels(k);
  KERNEL_ALIGN_OPS(KERNEL_ALIGN_ADD_KERNELS)
#undef KERNEL_ALIGN_ADD_KERNELS
  return k;
}

}  // namespace kernel_align::cpu
