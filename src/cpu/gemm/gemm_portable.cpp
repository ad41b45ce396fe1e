// The portable GEMM path: plain C++ on single floats, compiled without instruction-set
// flags, so it runs on any CPU. Each lane operation is the contract's scalar function
// (contract::fma_rn is the C library's correctly rounded fmaf where the CPU lacks FMA).
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
};

constexpr int kMr = 4;
constexpr int kNv = 8;

}  // namespace

const GemmKernel& gemm_kernel_portable() {
  static const GemmKernel kernel{kMr, kNv * PortableGemmOps::kWidth,
                                 &run_gemm_tile<PortableGemmOps, kMr, kNv>};
  return kernel;
}

}  // namespace kernel_align::cpu
