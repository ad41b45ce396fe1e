// The AVX-512 GEMM path: 12 x 32 tiles (24 zmm accumulators, two B vectors, one
// broadcast of A), and 1, 2, 4 and 8 x 32 tiles for calls of a few rows. Packing of lines
// contiguous along r (forward A and B) by 16 x 16 register transposes. Compiled with the
// AVX-512 and FMA flags (kernels.cmake).
// GCC 12's AVX-512 headers initialise their "undefined" registers from themselves
// (GCC bug 105593), which -Wuninitialized reports at each use of those intrinsics
// (as in isa/avx512.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include "cpu/gemm/activation_simd.hpp"
#include "cpu/gemm/attention_simd.hpp"
#include "cpu/gemm/flow_sde_simd.hpp"
#include "cpu/gemm/latent_simd.hpp"
#include "cpu/gemm/micro_kernel.hpp"

namespace kernel_align::cpu {
namespace {

struct Avx512GemmOps {
  using F = __m512;
  using M = __mmask16;
  static constexpr int kWidth = 16;
  static F zero() { return _mm512_setzero_ps(); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F canonical_nan(F v) {
    const F canonical = _mm512_castsi512_ps(
        _mm512_set1_epi32(static_cast<int>(contract::canonical_nan_bits(DType::F32))));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v, canonical);
  }
  static void store_f32_output(float* p, F v) { _mm512_storeu_ps(p, canonical_nan(v)); }

  // The epilogue.
  static F load_widened(DType t, const void* base, std::int64_t index) {
    switch (t) {
      case DType::BF16: {
        const __m256i h = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(base) + index));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      }
      case DType::F16:
        // vcvtph2ps is exact for every fp16, subnormals included.
        return _mm512_cvtph_ps(_mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(base) + index)));
      case DType::F32:
      case DType::Bool:  // never computed with (validation)
        break;
    }
    return _mm512_loadu_ps(static_cast<const float*>(base) + index);
  }
  static void store_output(DType t, void* base, std::int64_t index, F v) {
    if (t == DType::F32) {
      store_f32_output(static_cast<float*>(base) + index, v);
      return;
    }
    const M nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    __m256i h;
    if (t == DType::BF16) {
      // contract::f32_to_bf16: add 0x7FFF plus the lowest kept bit, keep the high half.
      const __m512i bits = _mm512_castps_si512(v);
      const __m512i lowest_kept =
          _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
      const __m512i rounded =
          _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), lowest_kept);
      h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
    } else {
      // vcvtps2ph with imm 0 rounds to nearest-even, keeps subnormal results and
      // overflows to Inf, as contract::f32_to_f16 does.
      h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    }
    h = _mm256_mask_mov_epi16(
        h, nan, _mm256_set1_epi16(static_cast<short>(contract::canonical_nan_bits(t))));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<std::uint16_t*>(base) + index), h);
  }

  // SimdActivation's operations.
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }

  // latent_pack's pairs (latent_simd.hpp): 8 of 8 bytes a vector.
  using Pairs = __m512i;
  static constexpr int kPairs = 8;
  static Pairs load_pairs(const char* p) { return _mm512_loadu_si512(p); }
  static void store_pairs(char* p, Pairs v) { _mm512_storeu_si512(p, v); }
  // rows[k][m] -> rows[m][k]: pairs of rows, then 128-bit lanes twice.
  static void transpose_pairs(Pairs (&r)[8]) {
    const Pairs t0 = _mm512_unpacklo_epi64(r[0], r[1]), t1 = _mm512_unpackhi_epi64(r[0], r[1]);
    const Pairs t2 = _mm512_unpacklo_epi64(r[2], r[3]), t3 = _mm512_unpackhi_epi64(r[2], r[3]);
    const Pairs t4 = _mm512_unpacklo_epi64(r[4], r[5]), t5 = _mm512_unpackhi_epi64(r[4], r[5]);
    const Pairs t6 = _mm512_unpacklo_epi64(r[6], r[7]), t7 = _mm512_unpackhi_epi64(r[6], r[7]);
    const Pairs u0 = _mm512_shuffle_i64x2(t0, t2, 0x88), u1 = _mm512_shuffle_i64x2(t0, t2, 0xDD);
    const Pairs u2 = _mm512_shuffle_i64x2(t1, t3, 0x88), u3 = _mm512_shuffle_i64x2(t1, t3, 0xDD);
    const Pairs u4 = _mm512_shuffle_i64x2(t4, t6, 0x88), u5 = _mm512_shuffle_i64x2(t4, t6, 0xDD);
    const Pairs u6 = _mm512_shuffle_i64x2(t5, t7, 0x88), u7 = _mm512_shuffle_i64x2(t5, t7, 0xDD);
    r[0] = _mm512_shuffle_i64x2(u0, u4, 0x88);
    r[4] = _mm512_shuffle_i64x2(u0, u4, 0xDD);
    r[2] = _mm512_shuffle_i64x2(u1, u5, 0x88);
    r[6] = _mm512_shuffle_i64x2(u1, u5, 0xDD);
    r[1] = _mm512_shuffle_i64x2(u2, u6, 0x88);
    r[5] = _mm512_shuffle_i64x2(u2, u6, 0xDD);
    r[3] = _mm512_shuffle_i64x2(u3, u7, 0x88);
    r[7] = _mm512_shuffle_i64x2(u3, u7, 0xDD);
  }
  static M lt(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static M le(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_LE_OQ); }
  static M gt(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static M ge(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
  static M is_nan(F a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
  static F select(M m, F if_true, F if_false) { return _mm512_mask_blend_ps(m, if_false, if_true); }
  static F and_bits(F a, std::uint32_t bits) {
    return _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(static_cast<int>(bits))));
  }
  static F xor_bits(F a, std::uint32_t bits) {
    return _mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(static_cast<int>(bits))));
  }
  static F or_bits(F a, F b) {
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(a), _mm512_castps_si512(b)));
  }
  static F pow2(F kf) {
    const __m512i k = _mm512_cvtps_epi32(kf);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k, _mm512_set1_epi32(127)), 23));
  }
  // Lanes p[32 l]: element j of 16 consecutive leaves of linear's tree.
  static F load_leaf_column(const float* p) {
    const __m512i stride =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(contract::kLinearLeaf));
    return _mm512_i32gather_ps(stride, p, 4);
  }
  static F activate(contract::Activation a, F z) {
    return SimdActivation<Avx512GemmOps>::activate(a, z);
  }
  static F activate_backward(contract::Activation a, F dy, F z) {
    return SimdActivation<Avx512GemmOps>::activate_backward(a, dy, z);
  }
};

// pack_lines_by_transposes' operations: 16 x 16 blocks.
struct Avx512Transposer {
  using F = __m512;
  static constexpr int kWidth = 16;
  static F zero() { return _mm512_setzero_ps(); }
  // Line l at r in [k, k + count) of a GemmPackLines job (job.offset is line 0's
  // k_begin), widened, +0 past `count`.
  static F load_line(const GemmPackLines& job, int l, std::int64_t k, int count) {
    const __mmask16 mask = static_cast<__mmask16>(count >= 16 ? 0xFFFF : (1u << count) - 1);
    const std::int64_t index = job.offset + l * job.line_stride + (k - job.k_begin);
    switch (job.dtype) {
      case DType::BF16: {
        const __m256i h =
            _mm256_maskz_loadu_epi16(mask, static_cast<const std::uint16_t*>(job.data) + index);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      }
      case DType::F16:
        return _mm512_cvtph_ps(
            _mm256_maskz_loadu_epi16(mask, static_cast<const std::uint16_t*>(job.data) + index));
      case DType::F32:
      case DType::Bool:  // never computed with (validation)
        break;
    }
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(job.data) + index);
  }
  // In place: row i of the 16 x 16 block becomes its column i.
  static void transpose(F r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // u[4 g + c]: in 128-bit lane L, rows 4g .. 4g + 3 of column 4 L + c.
    __m512 u[16];
    for (int g = 0; g < 4; ++g) {
      u[4 * g + 0] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
      u[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
      u[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
      u[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int c = 0; c < 4; ++c) {
      const __m512 even01 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);
      const __m512 even23 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
      const __m512 odd01 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
      const __m512 odd23 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
      r[c] = _mm512_shuffle_f32x4(even01, even23, 0x88);
      r[8 + c] = _mm512_shuffle_f32x4(even01, even23, 0xDD);
      r[4 + c] = _mm512_shuffle_f32x4(odd01, odd23, 0x88);
      r[12 + c] = _mm512_shuffle_f32x4(odd01, odd23, 0xDD);
    }
  }
  static __mmask16 store_mask(int lanes) {
    return static_cast<__mmask16>(lanes == 16 ? 0xFFFF : (1u << lanes) - 1);
  }
  static void store(float* dst, __mmask16 mask, F v) { _mm512_mask_storeu_ps(dst, mask, v); }
};

constexpr int kNv = 2;

const GemmKernel kKernels[] = {
    {1, kNv * 16, &run_gemm_tile<Avx512GemmOps, 1, kNv>},
    {2, kNv * 16, &run_gemm_tile<Avx512GemmOps, 2, kNv>},
    {4, kNv * 16, &run_gemm_tile<Avx512GemmOps, 4, kNv>},
    {8, kNv * 16, &run_gemm_tile<Avx512GemmOps, 8, kNv>},
    {12, kNv * 16, &run_gemm_tile<Avx512GemmOps, 12, kNv>},
};

}  // namespace

const GemmPath& gemm_path_avx512() {
  static const GemmPath path{kKernels,
                             static_cast<int>(sizeof kKernels / sizeof kKernels[0]),
                             &pack_lines_by_transposes<Avx512Transposer>,
                             &run_activation<Avx512GemmOps>,
                             &run_attention_probabilities<Avx512GemmOps>,
                             flow_sde_kernels<Avx512GemmOps>(),
                             &run_latent_normalize_row<Avx512GemmOps>,
                             latent_pack_pairs<Avx512GemmOps>()};
  return path;
}

}  // namespace kernel_align::cpu
