// The AVX-512 intrinsics of src/cpu/isa/avx512.cpp on a CPU without AVX-512: SIMDe's
// portable implementations under the Intel names (SIMDE_ENABLE_NATIVE_ALIASES), plus
// the few that SIMDe 0.7.4 lacks, written here lane by lane from Intel's definitions.
// avx512.cpp includes this instead of <immintrin.h> when compiled with
// KERNEL_ALIGN_AVX512_ON_SIMDE (tests/cpu/CMakeLists.txt), so the path's lane logic
// (index vectors, masks, the tree's halving, the conversions' placement) is byte-tested
// on every machine, not only on those with AVX-512.
#pragma once

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include <cstdint>
#include <cstring>

namespace kernel_align::avx512_on_simde {

template <class To, class From>
To bits_as(const From& from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

struct F32x16 {
  float lane[16];
};
struct I32x16 {
  std::int32_t lane[16];
};
struct U16x16 {
  std::uint16_t lane[16];
};

// vcvtph2ps: 16 fp16 -> fp32, through the native F16C conversion of each half.
inline __m512 cvtph_ps(__m256i h) {
  F32x16 out;
  _mm256_storeu_ps(out.lane, _mm256_cvtph_ps(_mm256_castsi256_si128(h)));
  _mm256_storeu_ps(out.lane + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
  return bits_as<__m512>(out);
}

// vcvtps2ph with an immediate rounding mode: 16 fp32 -> fp16.
#define KA_SIMDE_CVTPS_PH(v, rounding)                                                             \
  [](__m512 value) {                                                                               \
    const auto f =                                                                                 \
        ::kernel_align::avx512_on_simde::bits_as< ::kernel_align::avx512_on_simde::F32x16>(value); \
    return _mm256_set_m128i(_mm256_cvtps_ph(_mm256_loadu_ps(f.lane + 8), (rounding)),              \
                            _mm256_cvtps_ph(_mm256_loadu_ps(f.lane), (rounding)));                 \
  }(v)

// vpmovdw: each 32-bit lane truncated to its low 16 bits.
inline __m256i cvtepi32_epi16(__m512i v) {
  const auto in = bits_as<I32x16>(v);
  U16x16 out;
  for (int i = 0; i < 16; ++i) out.lane[i] = static_cast<std::uint16_t>(in.lane[i]);
  return bits_as<__m256i>(out);
}

// vpmovzxwd: 16 unsigned 16-bit lanes zero-extended to 32 bits.
inline __m512i cvtepu16_epi32(__m256i v) {
  const auto in = bits_as<U16x16>(v);
  I32x16 out;
  for (int i = 0; i < 16; ++i) out.lane[i] = in.lane[i];
  return bits_as<__m512i>(out);
}

// vpermilps with an immediate: within each 128-bit lane, element i takes element
// (imm >> 2i) & 3 of that lane.
inline __m512 permute_ps(__m512 v, int imm) {
  const auto in = bits_as<F32x16>(v);
  F32x16 out;
  for (int i = 0; i < 16; ++i) out.lane[i] = in.lane[(i & ~3) + ((imm >> (2 * (i & 3))) & 3)];
  return bits_as<__m512>(out);
}

// vmovntps, vmovntdq: the stores' values are what matter here.
inline void stream_ps(float* p, __m512 v) {
  _mm512_storeu_ps(p, v);
}
inline void stream_si512(__m512i* p, __m512i v) {
  _mm512_storeu_si512(p, v);
}

}  // namespace kernel_align::avx512_on_simde

// GCC's own declarations of these need AVX-512 to be called; these names take over.
#undef _mm512_cvtph_ps
#undef _mm512_cvtps_ph
#undef _mm512_cvtepi32_epi16
#undef _mm512_cvtepu16_epi32
#undef _mm512_permute_ps
#undef _mm512_stream_ps
#undef _mm512_stream_si512
#define _mm512_cvtph_ps ::kernel_align::avx512_on_simde::cvtph_ps
#define _mm512_cvtps_ph KA_SIMDE_CVTPS_PH
#define _mm512_cvtepi32_epi16 ::kernel_align::avx512_on_simde::cvtepi32_epi16
#define _mm512_cvtepu16_epi32 ::kernel_align::avx512_on_simde::cvtepu16_epi32
#define _mm512_permute_ps ::kernel_align::avx512_on_simde::permute_ps
#define _mm512_stream_ps ::kernel_align::avx512_on_simde::stream_ps
#define _mm512_stream_si512 ::kernel_align::avx512_on_simde::stream_si512
