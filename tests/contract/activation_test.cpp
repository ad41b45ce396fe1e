// The contract's exp, tanh, gelu_tanh and silu (contract/activation.hpp) against fp64
// over every fp32 input of their ranges (a stride of bit patterns by default; set
// KA_EXHAUSTIVE=1 for all of them, as docs/accuracy.md's bounds were measured), and their
// special values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>

#include "kernel_align/contract/activation.hpp"

namespace kernel_align::contract {
namespace {

const float kInf = std::numeric_limits<float>::infinity();

std::uint32_t pattern_stride() {
  const char* all = std::getenv("KA_EXHAUSTIVE");
  return all != nullptr && all[0] == '1' ? 1u : 61u;
}

// The spacing of fp32 at |v| (subnormal spacing at least).
double ulp_at(double v) {
  const double a = std::fabs(v);
  if (a < 0x1p-126) return 0x1p-149;
  return std::ldexp(1.0, std::ilogb(a) - 23);
}

struct Errors {
  double max_ulps = 0;    // |f - exact| / ulp(exact)
  double max_scaled = 0;  // |f - exact| / (2^-24 |x|), normal x
  float worst_ulp_input = 0;
};

// Every fp32 x with lo <= x <= hi (both of one sign), `stride` bit patterns apart.
void measure_range(float lo, float hi, const std::function<float(float)>& f,
                   const std::function<double(double)>& exact, Errors& e) {
  const std::uint32_t stride = pattern_stride();
  const bool negative = hi <= 0 && lo < 0;
  const float start = negative ? hi : lo;
  const float end = negative ? lo : hi;
  for (std::uint32_t bits = bits_of(start); bits <= bits_of(end); bits += stride) {
    const float x = float_of(bits);
    const double want = exact(static_cast<double>(x));
    const double got = static_cast<double>(f(x));
    const double error = std::fabs(got - want);
    const double ulps = error / ulp_at(want);
    if (ulps > e.max_ulps) {
      e.max_ulps = ulps;
      e.worst_ulp_input = x;
    }
    if (std::fabs(x) >= 0x1p-126f)
      e.max_scaled = std::max(e.max_scaled, error / (0x1p-24 * std::fabs(x)));
    if (bits > 0xFFFFFFFFu - stride) break;
  }
}

Errors measure(float lo, float hi, const std::function<float(float)>& f,
               const std::function<double(double)>& exact) {
  Errors e;
  if (lo < 0) measure_range(lo, std::min(hi, -0.0f), f, exact, e);
  if (hi >= 0) measure_range(std::max(lo, 0.0f), hi, f, exact, e);
  return e;
}

const double kBeta = static_cast<double>(kGeluBeta);
const double kKappa = static_cast<double>(kGeluKappa);

double exact_gelu_tanh(double z) {
  return 0.5 * z * (1 + std::tanh(kBeta * (z + kKappa * z * z * z)));
}

double exact_silu(double z) {
  return z / (1 + std::exp(-z));
}

TEST(Activation, ExpUlps) {
  const Errors e = measure(-103.97f, 88.72f, exp_f32, [](double x) { return std::exp(x); });
  EXPECT_LE(e.max_ulps, 2.0) << "at " << e.worst_ulp_input;
  std::printf("exp: max %.3f ulp (at %.9g)\n", e.max_ulps, static_cast<double>(e.worst_ulp_input));
}

TEST(Activation, TanhUlps) {
  const Errors e = measure(-20.0f, 20.0f, tanh_f32, [](double x) { return std::tanh(x); });
  EXPECT_LE(e.max_ulps, 3.0) << "at " << e.worst_ulp_input;
  std::printf("tanh: max %.3f ulp (at %.9g)\n", e.max_ulps, static_cast<double>(e.worst_ulp_input));
}

TEST(Activation, GeluTanhErrors) {
  // z >= 0: an ulp bound; for negative z the cancellation in 1 + tanh(inner) (torch's
  // formula) leaves a bound by a multiple of u |z| instead.
  const Errors right = measure(0.0f, 100.0f, gelu_tanh, exact_gelu_tanh);
  const Errors all = measure(-100.0f, 100.0f, gelu_tanh, exact_gelu_tanh);
  EXPECT_LE(right.max_ulps, 3.0) << "at " << right.worst_ulp_input;
  EXPECT_LE(all.max_scaled, 2.5);
  std::printf("gelu_tanh: z >= 0 max %.3f ulp (at %.9g); all z max %.3f u|z|\n", right.max_ulps,
              static_cast<double>(right.worst_ulp_input), all.max_scaled);
}

TEST(Activation, SiluUlps) {
  const Errors e = measure(-88.7f, 100.0f, silu, exact_silu);
  EXPECT_LE(e.max_ulps, 4.0) << "at " << e.worst_ulp_input;
  std::printf("silu: max %.3f ulp (at %.9g)\n", e.max_ulps, static_cast<double>(e.worst_ulp_input));
}

TEST(Activation, DerivativesMatchFp64) {
  for (float z = -8.0f; z <= 8.0f; z += 0.001953125f) {
    const double zd = z;
    const double t = std::tanh(kBeta * (zd + kKappa * zd * zd * zd));
    const double gelu_d =
        0.5 * (1 + t) + 0.5 * zd * (1 - t * t) * kBeta * (1 + 3 * kKappa * zd * zd);
    EXPECT_NEAR(gelu_tanh_derivative(z), gelu_d, 1e-6) << z;
    const double s = 1 / (1 + std::exp(-zd));
    EXPECT_NEAR(silu_derivative(z), s * (1 + zd * (1 - s)), 1e-6) << z;
    EXPECT_EQ(bits_of(gelu_tanh_backward(1.0f, z)), bits_of(gelu_tanh_derivative(z)));
  }
}

TEST(Activation, SpecialValues) {
  EXPECT_EQ(bits_of(exp_f32(0.0f)), bits_of(1.0f));
  EXPECT_EQ(bits_of(exp_f32(-0.0f)), bits_of(1.0f));
  EXPECT_EQ(exp_f32(kInf), kInf);
  EXPECT_EQ(bits_of(exp_f32(-kInf)), 0u);
  EXPECT_TRUE(is_nan(exp_f32(std::nanf(""))));
  // Overflow: the largest x below 88.72283935546875 is finite, that one is Inf.
  EXPECT_EQ(exp_f32(88.72283935546875f), kInf);
  EXPECT_LT(exp_f32(std::nextafter(88.72283935546875f, 0.0f)), kInf);
  EXPECT_EQ(
      exp_f32(std::nextafter(88.72283935546875f, 0.0f)),
      static_cast<float>(std::exp(static_cast<double>(std::nextafter(88.72283935546875f, 0.0f)))));
  // Underflow: at most 2^-150 rounds to +0, the next fp32 above to the smallest subnormal.
  EXPECT_EQ(bits_of(exp_f32(exp_constants::kUnderflow)), 0u);
  EXPECT_EQ(bits_of(exp_f32(std::nextafter(exp_constants::kUnderflow, 0.0f))), 1u);
  EXPECT_LT(std::exp(static_cast<double>(exp_constants::kUnderflow)), 0x1p-150);
  EXPECT_GT(std::exp(static_cast<double>(std::nextafter(exp_constants::kUnderflow, 0.0f))),
            0x1p-150);
  EXPECT_EQ(bits_of(exp_f32(-200.0f)), 0u);

  EXPECT_EQ(bits_of(tanh_f32(0.0f)), 0u);
  EXPECT_EQ(bits_of(tanh_f32(-0.0f)), 0x80000000u);
  EXPECT_EQ(tanh_f32(kInf), 1.0f);
  EXPECT_EQ(tanh_f32(-kInf), -1.0f);
  EXPECT_EQ(tanh_f32(9.5f), 1.0f);
  EXPECT_TRUE(is_nan(tanh_f32(std::nanf(""))));
  EXPECT_EQ(tanh_f32(0x1p-140f), 0x1p-140f);  // subnormal: tanh(x) rounds to x
  for (float x = 0.001f; x < 12.0f; x *= 1.01f) {
    EXPECT_EQ(bits_of(tanh_f32(-x)), bits_of(tanh_f32(x)) ^ 0x80000000u) << x;
  }

  EXPECT_EQ(bits_of(gelu_tanh(0.0f)), 0u);
  EXPECT_EQ(gelu_tanh(kInf), kInf);
  EXPECT_TRUE(is_nan(gelu_tanh(-kInf)));  // 0.5 (-Inf) (1 + -1), as torch
  EXPECT_TRUE(is_nan(gelu_tanh(std::nanf(""))));
  EXPECT_EQ(gelu_tanh(1e30f), 1e30f);
  EXPECT_EQ(bits_of(silu(0.0f)), 0u);
  EXPECT_EQ(silu(kInf), kInf);
  EXPECT_TRUE(is_nan(silu(-kInf)));  // -Inf / Inf, as torch
  EXPECT_EQ(bits_of(silu(-100.0f)), 0x80000000u);
  EXPECT_TRUE(is_nan(silu(std::nanf(""))));
}

TEST(Activation, TorchConstants) {
  EXPECT_EQ(kGeluBeta, static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5));
  EXPECT_EQ(kGeluKappa, 0.044715f);
  EXPECT_EQ(activate(Activation::None, -0.0f), -0.0f);
}

}  // namespace
}  // namespace kernel_align::contract
