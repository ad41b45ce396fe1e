// The AVX-512 path (F, BW, VL with AVX2 and F16C; this file alone is compiled with
// those flags). One 512-bit register holds the contract's 16 tree lanes, lane j in
// element j. No FMA instruction is used: products and sums are separate intrinsics,
// and -ffp-contract=off keeps the compiler from fusing them.
//
// bf16 narrowing uses integer rounding rather than vcvtneps2bf16 (AVX512_BF16), which
// treats subnormal inputs as zero: the contract keeps them, and integer rounding also
// needs no CPU beyond AVX-512 F/BW/VL.
#if !defined(__x86_64__)
#error "avx512.cpp is built for x86-64 only"
#endif

#if defined(KERNEL_ALIGN_AVX512_ON_SIMDE)
// A test build of this file (tests/cpu/CMakeLists.txt): the same policy on SIMDe's
// portable AVX-512 (tests/cpu/avx512_on_simde.hpp), so that its bytes are checked on
// CPUs without AVX-512.
#include "cpu/avx512_on_simde.hpp"
#define KA_AVX512_ROW_KERNELS avx512_on_simde_row_kernels
#else
// GCC 12's AVX-512 headers initialise their "undefined" registers from themselves
// (GCC bug 105593), which -Wuninitialized reports at each use of those intrinsics.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#define KA_AVX512_ROW_KERNELS avx512_row_kernels
#endif

#include <cstdint>

#include "cpu/isa/row_kernels.hpp"

namespace kernel_align::cpu {
namespace {

struct Avx512Ops {
  using F = __m512;
  using H = __m256i;  // 16 bf16 or fp16
  using W = __m512i;  // 32 bf16

  static F xor_bits(F v, __m512i bits) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), bits));
  }

  static F zero() { return _mm512_setzero_ps(); }
  static F broadcast(float v) { return _mm512_set1_ps(v); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F negate(F v) { return xor_bits(v, _mm512_set1_epi32(INT32_MIN)); }
  static F negate_even(F v) {
    // The sign bit of each 64-bit pair's low (even) float.
    return xor_bits(v, _mm512_set1_epi64(0x80000000));
  }
  static F swap_pairs(F v) { return _mm512_permute_ps(v, 0xB1); }
  static F dup_pairs(const float* p) {
    const __m512i index = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    return _mm512_permutexvar_ps(index, _mm512_castps256_ps512(_mm256_loadu_ps(p)));
  }
  static F keep_first(F v, int count) {
    return _mm512_maskz_mov_ps(static_cast<__mmask16>((1u << count) - 1u), v);
  }

  static float tree_reduce(F v) {
    const __m256 hi8 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    const __m256 by8 = _mm256_add_ps(_mm512_castps512_ps256(v), hi8);
    const __m128 by4 = _mm_add_ps(_mm256_castps256_ps128(by8), _mm256_extractf128_ps(by8, 1));
    const __m128 by2 = _mm_add_ps(by4, _mm_movehl_ps(by4, by4));
    return _mm_cvtss_f32(_mm_add_ss(by2, _mm_shuffle_ps(by2, by2, 1)));
  }

  static F load_f32(const float* p) { return _mm512_loadu_ps(p); }
  static F load_bf16(const std::uint16_t* p) {
    // A bf16 is the high half of the fp32 with the same value.
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static F load_f16(const std::uint16_t* p) {
    // vcvtph2ps is exact for every fp16, subnormals included.
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }

  static F canonical_nan(F v) {
    const F nan = _mm512_set1_ps(contract::float_of(contract::canonical_nan_bits(DType::F32)));
    return _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), nan);
  }
  // contract::f32_to_bf16 without its NaN case, in the high half of each lane:
  // add 0x7FFF plus the bit that becomes the lowest kept one (ties to even). That bit
  // is tested into a mask and added by a masked add: 3 instructions where shifting and
  // masking it out takes 4 (vector instructions are what bounds the bf16 kernels).
  static __m512i round_bf16_bits(F v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i biased = _mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF));
    const __mmask16 lowest_kept = _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x10000));
    return _mm512_mask_add_epi32(biased, lowest_kept, biased, _mm512_set1_epi32(1));
  }
  static F round_bf16(F v) {
    const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    return _mm512_castsi512_ps(_mm512_and_si512(round_bf16_bits(v), high_half));
  }
  // vcvtps2ph with imm 0 rounds to nearest-even, keeps subnormal results and
  // overflows to Inf, as contract::f32_to_f16 does.
  static F round_f16(F v) { return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)); }
  static H to_bf16(F v) { return _mm512_cvtepi32_epi16(_mm512_srli_epi32(round_bf16_bits(v), 16)); }
  static H to_f16(F v) { return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT); }
  // Two bf16 chunks narrowed into one register (put_chunk): one vpermt2w takes the high
  // halves of both chunks' rounded bits (the 16-bit elements at odd indices, lo's then
  // hi's) where to_bf16 shifts and narrows each.
  static constexpr bool kNarrowsPairs = true;
  static W to_bf16_pair(F lo, F hi) {
    const __m512i high_halves =
        _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27,
                         25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_permutex2var_epi16(round_bf16_bits(lo), high_halves, round_bf16_bits(hi));
  }

  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static void store(std::uint16_t* p, H h) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
  }
  static void store(std::uint16_t* p, W w) { _mm512_storeu_si512(p, w); }
  static constexpr bool kStreams = true;
  static void stream(float* p, F v) { _mm512_stream_ps(p, v); }
  static void stream(std::uint16_t* p, H h) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), h);
  }
  static void stream(std::uint16_t* p, W w) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(p), w);
  }
  static void stream_fence() { _mm_sfence(); }
};

}  // namespace

constinit const RowKernels KA_AVX512_ROW_KERNELS = row_kernels_of<Avx512Ops>();

}  // namespace kernel_align::cpu
