// Everything the contract allows on a device: the __f*_rn intrinsics, a / b and sqrtf
// (div.rn.f32 and sqrt.rn.f32 under -prec-div=true -prec-sqrt=true), integer
// arithmetic, conversions between float and bf16/fp16 by bit manipulation, and a
// __shfl_xor_sync of a float. The gate must pass it.
#include <cstdint>

namespace {

__device__ std::uint32_t bits(float f) {
  return __float_as_uint(f);
}

// fp32 -> bf16, round to nearest even, NaN quieted with its sign kept.
__device__ std::uint16_t to_bf16(float f) {
  const std::uint32_t u = bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  const std::uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}

__device__ float from_bf16(std::uint16_t h) {
  return __uint_as_float(static_cast<std::uint32_t>(h) << 16);
}

// fp16 -> fp32, exact, subnormals included.
__device__ float from_fp16(std::uint16_t h) {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1Fu;
  std::uint32_t man = h & 0x3FFu;
  if (exp == 0x1Fu) return __uint_as_float(sign | 0x7F800000u | (man << 13));
  if (exp == 0) {
    if (man == 0) return __uint_as_float(sign);
    exp = 113;  // 127 - 15 + 1
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --exp;
    }
    man &= 0x3FFu;
    return __uint_as_float(sign | (exp << 23) | (man << 13));
  }
  return __uint_as_float(sign | ((exp + 112) << 23) | (man << 13));
}

}  // namespace

__global__ void clean_ops(const float* a, const float* b, const std::uint16_t* h,
                          std::uint16_t* out16, float* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  const float x = a[i];
  const float y = b[i];
  float r = __fmul_rn(x, y);
  r = __fadd_rn(r, x);
  r = __fsub_rn(r, y);
  r = __fdiv_rn(r, y);
  r = __fsqrt_rn(r);
  r = __fadd_rn(r, x / y);
  r = __fadd_rn(r, sqrtf(y));
  r = __fadd_rn(r, from_bf16(to_bf16(x)));
  r = __fadd_rn(r, from_fp16(h[i]));
  for (int offset = 8; offset > 0; offset >>= 1) {
    r = __fadd_rn(r, __shfl_xor_sync(0xFFFFFFFFu, r, offset, 16));
  }
  const int k = i * 3 + n;
  out16[i] = to_bf16(r);
  out[k % n] = fminf(fabsf(r), -r);
}
