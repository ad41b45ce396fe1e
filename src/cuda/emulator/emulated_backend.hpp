// The CUDA backend's plans and kernels (cuda/plan.hpp, cuda/device/) run by the grid
// emulator on host memory: a registry backend for the tests that stand in for a GPU.
#pragma once

#include "registry/registry.hpp"

namespace kernel_align::cuda::emulation {

// "cuda-emulated": platform cpu (its tensors are in host memory), never chosen unless
// forced (set_backend), every op, launch records and device-side digests like the real
// backend. Register it with registry::ScopedRegistration.
registry::Backend emulated_cuda_backend();

}  // namespace kernel_align::cuda::emulation
