// The AVX2 path (AVX2 + F16C; this file alone is compiled with -mavx2 -mf16c, and
// never with -mfma: the contract rounds every product before its sum). The 16 tree
// lanes are two 8-lane registers: lo holds lanes 0-7, hi lanes 8-15, so the first
// halving of the tree (lane j += lane j + 8) is lo + hi.
#if !defined(__x86_64__)
#error "avx2.cpp is built for x86-64 only"
#endif

#include <immintrin.h>

#include <cstdint>

#include "cpu/isa/row_kernels.hpp"

namespace kernel_align::cpu {
namespace {

struct Avx2Ops {
  struct F {
    __m256 lo;
    __m256 hi;
  };
  using H = __m256i;  // 16 bf16 or fp16

  template <class Op>
  static F each(F a, const Op& op) {
    return {op(a.lo), op(a.hi)};
  }
  template <class Op>
  static F each(F a, F b, const Op& op) {
    return {op(a.lo, b.lo), op(a.hi, b.hi)};
  }
  static __m256 xor_bits(__m256 v, __m256i bits) {
    return _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(v), bits));
  }

  static F zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static F broadcast(float v) { return {_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
  static F add(F a, F b) {
    return each(a, b, [](__m256 x, __m256 y) { return _mm256_add_ps(x, y); });
  }
  static F sub(F a, F b) {
    return each(a, b, [](__m256 x, __m256 y) { return _mm256_sub_ps(x, y); });
  }
  static F mul(F a, F b) {
    return each(a, b, [](__m256 x, __m256 y) { return _mm256_mul_ps(x, y); });
  }
  static F negate(F v) {
    return each(v, [](__m256 x) { return xor_bits(x, _mm256_set1_epi32(INT32_MIN)); });
  }
  static F negate_even(F v) {
    // The sign bit of each 64-bit pair's low (even) float.
    return each(v, [](__m256 x) { return xor_bits(x, _mm256_set1_epi64x(0x80000000)); });
  }
  static F swap_pairs(F v) {
    return each(v, [](__m256 x) { return _mm256_permute_ps(x, 0xB1); });
  }
  static F dup_pairs(const float* p) {
    const auto dup4 = [](__m128 q) {
      return _mm256_set_m128(_mm_unpackhi_ps(q, q), _mm_unpacklo_ps(q, q));
    };
    return {dup4(_mm_loadu_ps(p)), dup4(_mm_loadu_ps(p + 4))};
  }
  static F keep_first(F v, int count) {
    const __m256i n = _mm256_set1_epi32(count);
    const __m256i lo = _mm256_cmpgt_epi32(n, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i hi = _mm256_cmpgt_epi32(n, _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15));
    return {_mm256_and_ps(v.lo, _mm256_castsi256_ps(lo)),
            _mm256_and_ps(v.hi, _mm256_castsi256_ps(hi))};
  }

  static float tree_reduce(F v) {
    const __m256 by8 = _mm256_add_ps(v.lo, v.hi);
    const __m128 by4 = _mm_add_ps(_mm256_castps256_ps128(by8), _mm256_extractf128_ps(by8, 1));
    const __m128 by2 = _mm_add_ps(by4, _mm_movehl_ps(by4, by4));
    return _mm_cvtss_f32(_mm_add_ss(by2, _mm_shuffle_ps(by2, by2, 1)));
  }

  static F load_f32(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static F load_bf16(const std::uint16_t* p) {
    // A bf16 is the high half of the fp32 with the same value.
    const auto widen8 = [](const std::uint16_t* q) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    };
    return {widen8(p), widen8(p + 8)};
  }
  static F load_f16(const std::uint16_t* p) {
    // vcvtph2ps is exact for every fp16, subnormals included.
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
  }

  static F canonical_nan(F v) {
    const __m256 nan = _mm256_set1_ps(contract::float_of(contract::canonical_nan_bits(DType::F32)));
    return each(
        v, [&](__m256 x) { return _mm256_blendv_ps(x, nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q)); });
  }
  // contract::f32_to_bf16 without its NaN case, in the high half of each lane:
  // add 0x7FFF plus the bit that becomes the lowest kept one (ties to even).
  static __m256i round_bf16_bits(__m256 x) {
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i lowest_kept = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    return _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), lowest_kept);
  }
  static F round_bf16(F v) {
    const __m256i high_half = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
    return each(v, [&](__m256 x) {
      return _mm256_castsi256_ps(_mm256_and_si256(round_bf16_bits(x), high_half));
    });
  }
  // vcvtps2ph with imm 0 rounds to nearest-even, keeps subnormal results and
  // overflows to Inf, as contract::f32_to_f16 does.
  static F round_f16(F v) {
    return each(
        v, [](__m256 x) { return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)); });
  }
  static H to_bf16(F v) {
    const __m256i lo = _mm256_srli_epi32(round_bf16_bits(v.lo), 16);
    const __m256i hi = _mm256_srli_epi32(round_bf16_bits(v.hi), 16);
    // packus interleaves the 128-bit halves (lo0-3 hi0-3 lo4-7 hi4-7); put them back.
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);
  }
  static H to_f16(F v) {
    return _mm256_set_m128i(_mm256_cvtps_ph(v.hi, _MM_FROUND_TO_NEAREST_INT),
                            _mm256_cvtps_ph(v.lo, _MM_FROUND_TO_NEAREST_INT));
  }

  static void store(float* p, F v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
  }
  static void store(std::uint16_t* p, H h) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
  }
  static constexpr bool kNarrowsPairs = false;
  static constexpr bool kStreams = true;
  static void stream(float* p, F v) {
    _mm256_stream_ps(p, v.lo);
    _mm256_stream_ps(p + 8, v.hi);
  }
  static void stream(std::uint16_t* p, H h) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), h);
  }
  static void stream_fence() { _mm_sfence(); }
};

}  // namespace

constinit const RowKernels avx2_row_kernels = row_kernels_of<Avx2Ops>();

}  // namespace kernel_align::cpu
