// The CPU backend ("simd"): the kernels of the selected instruction-set path, rows split
// across the thread pool (cpu/pool_passes.hpp). Each op's kernels are in its own file,
// cpu/ops/<op>.cpp, which adds them to the backend's table by the function declared here
// from op_list.hpp (a missing one is a link error). Every row is computed whole by one
// thread, and the dw sums follow the contract's fixed block partition, so no result
// depends on the thread count or the path.
#pragma once

#include "kernel_align/op_list.hpp"
#include "registry/registry.hpp"

namespace kernel_align::cpu {

// add_<op>_kernels(k): the op's kernels, keyed by (op, direction); each records the
// path, thread count and row partition it used in its Execution.
#define KERNEL_ALIGN_DECLARE_ADD_KERNELS(Enumerator, name) \
  void add_##name##_kernels(registry::Kernels& k);
KERNEL_ALIGN_OPS(KERNEL_ALIGN_DECLARE_ADD_KERNELS)
#undef KERNEL_ALIGN_DECLARE_ADD_KERNELS

// The backend's kernels, every op's, as the registry holds them.
registry::Kernels simd_kernels();

}  // namespace kernel_align::cpu
