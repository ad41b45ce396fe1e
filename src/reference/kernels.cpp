#include "reference/kernels.hpp"

namespace kernel_align::reference {

registry::Kernels kernels() {
  registry::Kernels k;
#define KERNEL_ALIGN_ADD_KERNELS(Enumerator, name) add_##name##_kernels(k);
  KERNEL_ALIGN_OPS(KERNEL_ALIGN_ADD_KERNELS)
#undef KERNEL_ALIGN_ADD_KERNELS
  return k;
}

void record_scalar(registry::Execution& exec, std::initializer_list<std::int64_t> pass_rows) {
  exec.isa = "scalar";
  exec.threads = 1;
  if (exec.traced) {
    for (const std::int64_t rows : pass_rows) exec.partition.push_back({{0, rows}});
  }
}

}  // namespace kernel_align::reference
