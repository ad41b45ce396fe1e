// Activations of `linear` and the contract's own exp and tanh (docs/contract.md,
// "Linear (GEMM)"; their accuracy: docs/accuracy.md, "Activations"). Only the fp32
// operations of float_ops.hpp, each rounded once, in the order written here: no libm,
// whose results differ between libraries and versions, and no fma, so that a CPU
// without FMA and a vector unit compute the same bits with plain mul and add.
#pragma once

#include <cstdint>

#include "kernel_align/contract/float_ops.hpp"

namespace kernel_align::contract {

enum class Activation : std::uint8_t {
  None,
  GeluTanh,  // torch.nn.functional.gelu(z, approximate="tanh")
  Silu,      // torch.nn.functional.silu(z)
};

namespace exp_constants {
// The smallest fp32 x whose exp rounds to +Inf: exp(x) >= (2 - 2^-24) 2^127 + 2^103,
// the midpoint above the largest finite fp32, for x >= 88.72283902...
inline constexpr float kOverflow = 88.72283935546875f;
// The largest fp32 x whose exp rounds to +0: exp(x) <= 2^-150, half the smallest
// subnormal, for x <= ln 2^-150 = -103.9720770...
inline constexpr float kUnderflow = -103.97208404541015625f;
inline constexpr float kLog2e = 1.44269502162933349609375f;
// 1.5 * 2^23: adding it rounds a value of magnitude < 2^22 to an integer.
inline constexpr float kRoundMagic = 12582912.0f;
// Cody-Waite: ln 2 = kLn2Hi + kLn2Lo; kLn2Hi has 9 significant bits, so k * kLn2Hi is
// exact for |k| <= 150 and x - k * kLn2Hi is exact (Sterbenz-like: both share the
// exponent range of x and the difference needs at most 24 bits).
inline constexpr float kLn2Hi = 0.693359375f;
inline constexpr float kLn2Lo = -2.12194440e-4f;
// exp(r) ~ 1 + r + r^2 (c5 + c4 r + c3 r^2 + c2 r^3 + c1 r^4 + c0 r^5) on
// |r| <= ln(2)/2 (Cephes expf's minimax coefficients).
inline constexpr float kC0 = 1.9875691500e-4f;
inline constexpr float kC1 = 1.3981999507e-3f;
inline constexpr float kC2 = 8.3334519073e-3f;
inline constexpr float kC3 = 4.1665795894e-2f;
inline constexpr float kC4 = 1.6666665459e-1f;
inline constexpr float kC5 = 5.0000001201e-1f;
}  // namespace exp_constants

// 2^k for -126 <= k <= 127, from its bits.
KA_HD static inline float pow2_normal(int k) {
  return float_of(static_cast<std::uint32_t>(k + 127) << 23);
}

// exp(x): k = x log2(e) rounded to an integer (ties to even; |r| stays within
// ln(2)/2 plus a few ulps either way), r = (x - k kLn2Hi) - k kLn2Lo, the polynomial in
// Horner form with mul and add, then times 2^k: one exact multiplication where the
// result is normal, else two (exact to a normal value, then one rounding into the
// subnormal range, or to Inf for k = 128).
KA_HD static inline float exp_f32(float x) {
  using namespace exp_constants;
  if (is_nan(x)) return x;
  if (x >= kOverflow) return float_of(0x7F800000u);
  if (x <= kUnderflow) return 0.0f;
  const float shifted = add(mul(x, kLog2e), kRoundMagic);
  const float kf = sub(shifted, kRoundMagic);
  const int k = static_cast<int>(kf);
  const float r = sub(sub(x, mul(kf, kLn2Hi)), mul(kf, kLn2Lo));
  const float r2 = mul(r, r);
  float p = kC0;
  p = add(mul(p, r), kC1);
  p = add(mul(p, r), kC2);
  p = add(mul(p, r), kC3);
  p = add(mul(p, r), kC4);
  p = add(mul(p, r), kC5);
  const float y = add(add(mul(p, r2), r), 1.0f);
  if (k > 127) return mul(mul(y, pow2_normal(127)), pow2_normal(k - 127));
  if (k < -124) return mul(mul(y, pow2_normal(k + 100)), pow2_normal(-100));
  return mul(y, pow2_normal(k));
}

namespace tanh_constants {
// Below it, the odd polynomial; from it, 1 - 2 / (exp(2a) + 1).
inline constexpr float kPolynomialEnd = 0.625f;
// From here tanh rounds to 1 (1 - tanh(a) < 2^-25 for a > 9.011).
inline constexpr float kSaturation = 9.1f;
// tanh(a) ~ a + a^3 (d4 + d3 a^2 + d2 a^4 + d1 a^6 + d0 a^8) on [0, 0.625]
// (Cephes tanhf's coefficients).
inline constexpr float kD0 = -5.70498872745e-3f;
inline constexpr float kD1 = 2.06390887954e-2f;
inline constexpr float kD2 = -5.37397155531e-2f;
inline constexpr float kD3 = 1.33314422036e-1f;
inline constexpr float kD4 = -3.33332819422e-1f;
}  // namespace tanh_constants

// tanh(x) = sign(x) tanh(|x|): odd symmetry is exact, tanh(-0) = -0, saturates to +-1.
KA_HD static inline float tanh_f32(float x) {
  using namespace tanh_constants;
  if (is_nan(x)) return x;
  const std::uint32_t sign = bits_of(x) & 0x80000000u;
  const float a = float_of(bits_of(x) & 0x7FFFFFFFu);
  float t;
  if (a < kPolynomialEnd) {
    const float z = mul(a, a);
    float p = kD0;
    p = add(mul(p, z), kD1);
    p = add(mul(p, z), kD2);
    p = add(mul(p, z), kD3);
    p = add(mul(p, z), kD4);
    t = add(mul(mul(p, z), a), a);
  } else if (a < kSaturation) {
    t = sub(1.0f, div(2.0f, add(exp_f32(add(a, a)), 1.0f)));
  } else {
    t = 1.0f;
  }
  return float_of(bits_of(t) | sign);
}

// torch's fp32 constants: M_SQRT2 * M_2_SQRTPI * 0.5 and 0.044715, each rounded to fp32.
inline constexpr float kGeluBeta =
    static_cast<float>(1.41421356237309504880 * 1.12837916709551257390 * 0.5);
inline constexpr float kGeluKappa = static_cast<float>(0.044715);

// torch's CPU order (aten/src/ATen/native/cpu/Activation.cpp, GeluKernelImpl, tanh):
// x_cube = x * x * x; inner = kBeta * (x + kKappa * x_cube);
// y = 0.5 * x * (1 + tanh(inner)), products left to right.
KA_HD static inline float gelu_tanh(float z) {
  const float cube = mul(mul(z, z), z);
  const float inner = mul(kGeluBeta, add(z, mul(kGeluKappa, cube)));
  return mul(mul(0.5f, z), add(1.0f, tanh_f32(inner)));
}

// torch's CPU order (GeluBackwardKernelImpl, tanh):
// left = 0.5 x, right = 1 + tanh(inner), left' = 0.5 right,
// tanh' = 1 - tanh(inner)^2, inner' = kBeta * (1 + 3 * kKappa * x^2),
// dz = dy * (left' + left * tanh' * inner').
KA_HD static inline float gelu_tanh_backward(float dy, float z) {
  const float square = mul(z, z);
  const float cube = mul(square, z);
  const float inner = mul(kGeluBeta, add(z, mul(kGeluKappa, cube)));
  const float tanh_inner = tanh_f32(inner);
  const float left = mul(0.5f, z);
  const float right = add(1.0f, tanh_inner);
  const float left_derivative = mul(0.5f, right);
  const float tanh_derivative = sub(1.0f, mul(tanh_inner, tanh_inner));
  const float inner_derivative = mul(kGeluBeta, add(1.0f, mul(mul(3.0f, kGeluKappa), square)));
  const float right_derivative = mul(mul(left, tanh_derivative), inner_derivative);
  return mul(dy, add(left_derivative, right_derivative));
}

// d gelu_tanh / dz: the backward with dy = 1 (1 * v is exact).
KA_HD static inline float gelu_tanh_derivative(float z) {
  return gelu_tanh_backward(1.0f, z);
}

// torch's order (silu_kernel): z / (1 + exp(-z)).
KA_HD static inline float silu(float z) {
  return div(z, add(1.0f, exp_f32(float_of(bits_of(z) ^ 0x80000000u))));
}

// torch's order (silu_backward_kernel): s = 1 / (1 + exp(-z)),
// dz = dy * s * (1 + z * (1 - s)), products left to right.
KA_HD static inline float silu_backward(float dy, float z) {
  const float sigmoid = div(1.0f, add(1.0f, exp_f32(float_of(bits_of(z) ^ 0x80000000u))));
  return mul(mul(dy, sigmoid), add(1.0f, mul(z, sub(1.0f, sigmoid))));
}

KA_HD static inline float silu_derivative(float z) {
  return silu_backward(1.0f, z);
}

KA_HD static inline float activate(Activation activation, float z) {
  switch (activation) {
    case Activation::GeluTanh:
      return gelu_tanh(z);
    case Activation::Silu:
      return silu(z);
    case Activation::None:
      break;
  }
  return z;
}

// The activation's backward at the pre-activation value z: dy times d act/dz, in the
// orders above; dy itself for None.
KA_HD static inline float activate_backward(Activation activation, float dy, float z) {
  switch (activation) {
    case Activation::GeluTanh:
      return gelu_tanh_backward(dy, z);
    case Activation::Silu:
      return silu_backward(dy, z);
    case Activation::None:
      break;
  }
  return dy;
}

}  // namespace kernel_align::contract
