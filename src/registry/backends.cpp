// The built-in backends: one registration each (the CUDA ones where the build has them).
// A new backend (Ascend, ...) is one more entry here with its platform, priority,
// capabilities and entry points.
#include "cpu/cpu_backend.hpp"
#if KERNEL_ALIGN_HAS_CUDA
#include "cuda/cuda_backend.hpp"
#endif
#include "kernel_align/fingerprints.hpp"
#include "kernel_align/runtime.hpp"
#include "reference/kernels.hpp"
#include "registry/registry.hpp"

namespace kernel_align::registry {
namespace {

std::string always_available() {
  return "";
}

std::string simd_paths() {
  std::string paths;
  for (Isa i = best_isa();; i = static_cast<Isa>(static_cast<int>(i) - 1)) {
    paths += paths.empty() ? std::string(isa_name(i)) + " (best)" : std::string(", ") + isa_name(i);
    if (i == Isa::Portable) break;
  }
  return paths;
}

std::string scalar_path() {
  return "scalar";
}

}  // namespace

std::vector<Backend> builtin_backends() {
  Backend simd;
  simd.name = "simd";
  simd.platform = Platform::Cpu;
  simd.priority = 0;
  simd.unavailable_reason = always_available;  // the portable path runs on any CPU
  simd.isa_paths = simd_paths;
  simd.fingerprint = fingerprints::kSimd;
  simd.kernels = cpu::simd_kernels();

  Backend reference;
  reference.name = "reference";
  reference.platform = Platform::Cpu;
  reference.priority = 100;
  reference.unavailable_reason = always_available;
  reference.isa_paths = scalar_path;
  reference.fingerprint = fingerprints::kReference;
  reference.kernels = reference::kernels();

  std::vector<Backend> backends{simd, reference};
#if KERNEL_ALIGN_HAS_CUDA
  for (Backend& b : cuda::cuda_backends()) backends.push_back(std::move(b));
#endif
  return backends;
}

}  // namespace kernel_align::registry
