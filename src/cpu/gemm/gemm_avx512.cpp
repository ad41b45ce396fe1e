// The AVX-512 GEMM path: 12 x 32 tiles (24 zmm accumulators, two B vectors, one
// broadcast of A). Compiled with the AVX-512 and FMA flags (kernels.cmake).
#include <immintrin.h>

#include "cpu/gemm/micro_kernel.hpp"

namespace kernel_align::cpu {
namespace {

struct Avx512GemmOps {
  using F = __m512;
  static constexpr int kWidth = 16;
  static F zero() { return _mm512_setzero_ps(); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static void store_f32_output(float* p, F v) {
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    const F canonical = _mm512_castsi512_ps(
        _mm512_set1_epi32(static_cast<int>(contract::canonical_nan_bits(DType::F32))));
    _mm512_storeu_ps(p, _mm512_mask_blend_ps(nan, v, canonical));
  }
};

constexpr int kMr = 12;
constexpr int kNv = 2;

}  // namespace

const GemmKernel& gemm_kernel_avx512() {
  static const GemmKernel kernel{kMr, kNv * Avx512GemmOps::kWidth,
                                 &run_gemm_tile<Avx512GemmOps, kMr, kNv>};
  return kernel;
}

}  // namespace kernel_align::cpu
