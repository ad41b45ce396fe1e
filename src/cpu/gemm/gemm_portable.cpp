// The portable GEMM path: plain C++ on single floats, compiled without instruction-set
// flags, so it runs on any CPU. Each lane operation is the contract's scalar function
// (contract::fma_rn is the C library's correctly rounded fmaf where the CPU lacks FMA).
#include "cpu/gemm/attention_simd.hpp"
#include "cpu/gemm/flow_sde_simd.hpp"
#include "cpu/gemm/latent_simd.hpp"
#include "cpu/gemm/micro_kernel.hpp"

namespace kernel_align::cpu {
namespace {

struct PortableGemmOps {
  using F = float;
  static constexpr int kWidth = 1;
  static F zero() { return 0.0f; }
  static F load(const float* p) { return *p; }
  static F broadcast(const float* p) { return *p; }
  static F fma(F a, F b, F c) { return contract::fma_rn(a, b, c); }
  static F add(F a, F b) { return contract::add(a, b); }
  static void store(float* p, F v) { *p = v; }
  static void store_f32_output(float* p, F v) { *p = contract::stored_f32(v); }
  static F load_widened(DType t, const void* base, std::int64_t index) {
    return contract::load_f32(t, base, index);
  }
  static void store_output(DType t, void* base, std::int64_t index, F v) {
    contract::store_output(t, base, index, v);
  }
  static F set1(float v) { return v; }
  static F sub(F a, F b) { return contract::sub(a, b); }
  static F mul(F a, F b) { return contract::mul(a, b); }
  static F div(F a, F b) { return contract::div(a, b); }
  static F load_leaf_column(const float* p) { return *p; }
  static F activate(contract::Activation a, F z) { return contract::activate(a, z); }
  static F activate_backward(contract::Activation a, F dy, F z) {
    return contract::activate_backward(a, dy, z);
  }
};

constexpr int kMr = 4;
constexpr int kNv = 8;

const GemmKernel kKernels[] = {
    {1, kNv, &run_gemm_tile<PortableGemmOps, 1, kNv>},
    {kMr, kNv, &run_gemm_tile<PortableGemmOps, kMr, kNv>},
};

}  // namespace

const GemmPath& gemm_path_portable() {
  static const GemmPath path{kKernels,
                             static_cast<int>(sizeof kKernels / sizeof kKernels[0]),
                             nullptr,
                             &run_activation<PortableGemmOps>,
                             &run_attention_probabilities_scalar,
                             flow_sde_kernels<PortableGemmOps>(),
                             &run_latent_normalize_row<PortableGemmOps>,
                             {}};
  return path;
}

}  // namespace kernel_align::cpu
