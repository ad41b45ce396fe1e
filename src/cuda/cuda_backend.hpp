// The CUDA backends (builds with KERNEL_ALIGN_CUDA): "cuda", the kernels of
// src/cuda/device/ launched on the caller's stream, and "cuda-host", the opt-in fallback
// that runs the CPU reference on host copies of the tensors (set_host_fallback).
#pragma once

#include <vector>

#include "registry/registry.hpp"

namespace kernel_align::cuda {

std::vector<registry::Backend> cuda_backends();

}  // namespace kernel_align::cuda
