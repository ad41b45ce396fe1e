// The reference backend's kernel table. Each op's file (src/reference/<op>.cpp) adds its
// kernels by the function declared here from op_list.hpp (a missing one is a link error);
// the "reference" backend and the CUDA host fallback, which runs these kernels on host
// copies of device tensors, both hold this table.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "kernel_align/op_list.hpp"
#include "registry/registry.hpp"

namespace kernel_align::reference {

#define KERNEL_ALIGN_DECLARE_ADD_KERNELS(Enumerator, name) \
  void add_##name##_kernels(registry::Kernels& k);
KERNEL_ALIGN_OPS(KERNEL_ALIGN_DECLARE_ADD_KERNELS)
#undef KERNEL_ALIGN_DECLARE_ADD_KERNELS

// Every op's reference kernels.
registry::Kernels kernels();

// The reference runs every pass on the calling thread, as one range of rows (recorded
// when the call is traced).
void record_scalar(registry::Execution& exec, std::initializer_list<std::int64_t> pass_rows);

}  // namespace kernel_align::reference
