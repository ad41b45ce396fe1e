// The only fp32 operations contract code may use. Each rounds its result once,
// to nearest-even, and never fuses with a neighbour: on the host the library is
// compiled with -ffp-contract=off, on a CUDA device the __f*_rn intrinsics are
// never contracted into FMA whatever nvcc's --fmad says.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

// Contract functions are `KA_HD static inline`: callable on host and CUDA device, and
// of internal linkage, so that a copy compiled in an AVX-512 file is never merged by
// the linker into code that runs on a CPU without AVX-512.
#if defined(__CUDACC__)
#define KA_HD __host__ __device__
#else
#define KA_HD
#endif

// x87 or other excess-precision evaluation would round twice.
static_assert(FLT_EVAL_METHOD == 0, "contract code needs fp32 evaluated in fp32 (SSE/AVX/NEON)");

namespace kernel_align::contract {

KA_HD static inline float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

KA_HD static inline float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

KA_HD static inline float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

KA_HD static inline float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// IEEE 754 requires sqrt to be correctly rounded; sqrtss/vsqrtps and __fsqrt_rn are.
// The builtin, not std::sqrt: an inline std::sqrt compiled in an AVX-512 file would be
// a weak symbol the linker could hand to baseline code.
KA_HD static inline float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return __builtin_sqrtf(a);
#endif
}

KA_HD static inline std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

KA_HD static inline float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

KA_HD static inline bool is_nan(float f) {
  return (bits_of(f) & 0x7FFFFFFFu) > 0x7F800000u;
}

}  // namespace kernel_align::contract
