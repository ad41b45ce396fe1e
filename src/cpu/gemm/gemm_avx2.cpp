// The AVX2 GEMM path: 6 x 16 tiles (12 ymm accumulators, two B vectors, one broadcast
// of A), and 1, 2 and 4 x 16 tiles for calls of a few rows. Compiled with -mavx2 -mfma
// -mf16c (kernels.cmake): unlike the row kernels' avx2.cpp, this file needs FMA, and the
// driver takes it only where the CPU has FMA. Packing of lines contiguous along r by 8 x 8
// register transposes.
#include <immintrin.h>

#include "cpu/gemm/activation_simd.hpp"
#include "cpu/gemm/attention_simd.hpp"
#include "cpu/gemm/flow_sde_simd.hpp"
#include "cpu/gemm/latent_simd.hpp"
#include "cpu/gemm/micro_kernel.hpp"

namespace kernel_align::cpu {
namespace {

struct Avx2GemmOps {
  using F = __m256;
  using M = __m256;  // all-ones lanes
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

  // The epilogue.
  static F load_widened(DType t, const void* base, std::int64_t index) {
    const auto* h = static_cast<const std::uint16_t*>(base) + index;
    switch (t) {
      case DType::BF16: {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
      }
      case DType::F16:
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
      case DType::F32:
      case DType::Bool:  // never computed with (validation)
        break;
    }
    return _mm256_loadu_ps(static_cast<const float*>(base) + index);
  }
  static void store_output(DType t, void* base, std::int64_t index, F v) {
    if (t == DType::F32) {
      store_f32_output(static_cast<float*>(base) + index, v);
      return;
    }
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    __m128i h;
    if (t == DType::BF16) {
      const __m256i bits = _mm256_castps_si256(v);
      const __m256i lowest_kept =
          _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
      const __m256i rounded =
          _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), lowest_kept);
      __m256i high = _mm256_srli_epi32(rounded, 16);
      high = _mm256_blendv_epi8(high, _mm256_set1_epi32(0x7FC0), nan);
      const __m256i packed = _mm256_packus_epi32(high, high);  // lanes 0-3 | 0-3, 4-7 | 4-7
      h = _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
    } else {
      h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
      const __m128i nan16 =
          _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
      h = _mm_blendv_epi8(h, _mm_set1_epi16(0x7E00), nan16);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(base) + index), h);
  }

  // SimdActivation's operations.
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }

  // latent_pack's pairs (latent_simd.hpp): 4 of 8 bytes a vector.
  using Pairs = __m256i;
  static constexpr int kPairs = 4;
  static Pairs load_pairs(const char* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static void store_pairs(char* p, Pairs v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  }
  // rows[k][m] -> rows[m][k]: pairs of rows, then 128-bit lanes.
  static void transpose_pairs(Pairs (&r)[4]) {
    const Pairs t0 = _mm256_unpacklo_epi64(r[0], r[1]), t1 = _mm256_unpackhi_epi64(r[0], r[1]);
    const Pairs t2 = _mm256_unpacklo_epi64(r[2], r[3]), t3 = _mm256_unpackhi_epi64(r[2], r[3]);
    r[0] = _mm256_permute2x128_si256(t0, t2, 0x20);
    r[2] = _mm256_permute2x128_si256(t0, t2, 0x31);
    r[1] = _mm256_permute2x128_si256(t1, t3, 0x20);
    r[3] = _mm256_permute2x128_si256(t1, t3, 0x31);
  }
  static M lt(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static M le(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_LE_OQ); }
  static M gt(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
  static M ge(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
  static M is_nan(F a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
  static F select(M m, F if_true, F if_false) { return _mm256_blendv_ps(if_false, if_true, m); }
  static F and_bits(F a, std::uint32_t bits) {
    return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(bits))));
  }
  static F xor_bits(F a, std::uint32_t bits) {
    return _mm256_xor_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(bits))));
  }
  static F or_bits(F a, F b) { return _mm256_or_ps(a, b); }
  static F pow2(F kf) {
    const __m256i k = _mm256_cvtps_epi32(kf);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
  }
  // Lanes p[32 l]: element j of 8 consecutive leaves of linear's tree.
  static F load_leaf_column(const float* p) {
    const __m256i stride = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                              _mm256_set1_epi32(contract::kLinearLeaf));
    return _mm256_i32gather_ps(p, stride, 4);
  }
  static F activate(contract::Activation a, F z) {
    return SimdActivation<Avx2GemmOps>::activate(a, z);
  }
  static F activate_backward(contract::Activation a, F dy, F z) {
    return SimdActivation<Avx2GemmOps>::activate_backward(a, dy, z);
  }
};

// pack_lines_by_transposes' operations: 8 x 8 blocks.
struct Avx2Transposer {
  using F = __m256;
  static constexpr int kWidth = 8;
  static F zero() { return _mm256_setzero_ps(); }
  // Line l at r in [k, k + count) of a GemmPackLines job (job.offset is line 0's
  // k_begin), widened, +0 past `count`.
  static F load_line(const GemmPackLines& job, int l, std::int64_t k, int count) {
    const std::int64_t index = job.offset + l * job.line_stride + (k - job.k_begin);
    if (count == 8) {
      const auto* h = static_cast<const std::uint16_t*>(job.data) + index;
      switch (job.dtype) {
        case DType::BF16:
          return _mm256_castsi256_ps(_mm256_slli_epi32(
              _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h))), 16));
        case DType::F16:
          return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
        case DType::F32:
        case DType::Bool:  // never computed with (validation)
          break;
      }
      return _mm256_loadu_ps(static_cast<const float*>(job.data) + index);
    }
    alignas(32) float tail[8] = {};
    for (int c = 0; c < count; ++c) tail[c] = contract::load_f32(job.dtype, job.data, index + c);
    return _mm256_load_ps(tail);
  }
  // In place: row i of the 8 x 8 block becomes its column i.
  static void transpose(F r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 2; ++g) {
      u[4 * g + 0] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
      u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
      u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
      u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int c = 0; c < 4; ++c) {
      r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
      r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
  }
  static __m256i store_mask(int lanes) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static void store(float* dst, __m256i mask, F v) { _mm256_maskstore_ps(dst, mask, v); }
};

constexpr int kNv = 2;

const GemmKernel kKernels[] = {
    {1, kNv * 8, &run_gemm_tile<Avx2GemmOps, 1, kNv>},
    {2, kNv * 8, &run_gemm_tile<Avx2GemmOps, 2, kNv>},
    {4, kNv * 8, &run_gemm_tile<Avx2GemmOps, 4, kNv>},
    {6, kNv * 8, &run_gemm_tile<Avx2GemmOps, 6, kNv>},
};

}  // namespace

const GemmPath& gemm_path_avx2() {
  static const GemmPath path{kKernels,
                             static_cast<int>(sizeof kKernels / sizeof kKernels[0]),
                             &pack_lines_by_transposes<Avx2Transposer>,
                             &run_activation<Avx2GemmOps>,
                             &run_attention_probabilities<Avx2GemmOps>,
                             flow_sde_kernels<Avx2GemmOps>(),
                             &run_latent_normalize_row<Avx2GemmOps>,
                             latent_pack_pairs<Avx2GemmOps>()};
  return path;
}

}  // namespace kernel_align::cpu
