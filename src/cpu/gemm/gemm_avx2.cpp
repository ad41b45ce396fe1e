// The AVX2 GEMM path: 6 x 16 tiles (12 ymm accumulators, two B vectors, one broadcast
// of A). Compiled with -mavx2 -mfma -mf16c (kernels.cmake): unlike the row kernels'
// avx2.cpp, this file needs FMA, and the driver takes it only where the CPU has FMA.
#include <immintrin.h>

#include "cpu/gemm/micro_kernel.hpp"

namespace kernel_align::cpu {
namespace {

struct Avx2GemmOps {
  using F = __m256;
  static constexpr int kWidth = 8;
  static F zero() { return _mm256_setzero_ps(); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static F broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static void store_f32_output(float* p, F v) {
    const F nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    const F canonical = _mm256_castsi256_ps(
        _mm256_set1_epi32(static_cast<int>(contract::canonical_nan_bits(DType::F32))));
    _mm256_storeu_ps(p, _mm256_blendv_ps(v, canonical, nan));
  }
};

constexpr int kMr = 6;
constexpr int kNv = 2;

}  // namespace

const GemmKernel& gemm_kernel_avx2() {
  static const GemmKernel kernel{kMr, kNv * Avx2GemmOps::kWidth,
                                 &run_gemm_tile<Avx2GemmOps, kMr, kNv>};
  return kernel;
}

}  // namespace kernel_align::cpu
