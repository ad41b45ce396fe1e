// The contract's conversions against independent ones: widening against a
// decoder written from the format definitions, narrowing against the oracle's
// rounding of the exact value (oracle::round_to), which shares no code with them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "kernel_align/contract/convert.hpp"
#include "oracle/oracle.hpp"

namespace kernel_align {
namespace {

using contract::bits_of;
using contract::float_of;

// A 16-bit format by its field widths.
struct Half16 {
  DType dtype;
  int exponent_bits;
  int bias;
  std::uint16_t quiet_nan;  // positive canonical quiet NaN
  std::uint16_t max_finite;
};

constexpr Half16 kBf16{DType::BF16, 8, 127, 0x7FC0, 0x7F7F};
constexpr Half16 kF16{DType::F16, 5, 15, 0x7E00, 0x7BFF};

int mantissa_bits(const Half16& f) {
  return 15 - f.exponent_bits;
}

bool is_nan_pattern(const Half16& f, std::uint16_t h) {
  const int exponent_mask = (1 << f.exponent_bits) - 1;
  return ((h >> mantissa_bits(f)) & exponent_mask) == exponent_mask &&
         (h & ((1 << mantissa_bits(f)) - 1)) != 0;
}

// The value of a non-NaN pattern, from the definition of the format.
double decode(const Half16& f, std::uint16_t h) {
  const int m = mantissa_bits(f);
  const int exponent_mask = (1 << f.exponent_bits) - 1;
  const int exponent = (h >> m) & exponent_mask;
  const int mantissa = h & ((1 << m) - 1);
  double magnitude = 0.0;
  if (exponent == exponent_mask) {
    magnitude = std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    magnitude = std::ldexp(mantissa, 1 - f.bias - m);
  } else {
    magnitude = std::ldexp(mantissa + (1 << m), exponent - f.bias - m);
  }
  return (h & 0x8000u) != 0 ? -magnitude : magnitude;
}

std::uint16_t narrow(const Half16& f, float v) {
  return f.dtype == DType::BF16 ? contract::f32_to_bf16(v) : contract::f32_to_f16(v);
}

float widen(const Half16& f, std::uint16_t h) {
  return f.dtype == DType::BF16 ? contract::bf16_to_f32(h) : contract::f16_to_f32(h);
}

// One narrowing judged: NaN -> the quiet NaN with the sign kept; otherwise the
// correctly rounded value with the sign (of zero too) kept.
::testing::AssertionResult narrows_correctly(const Half16& f, std::uint32_t bits) {
  const float v = float_of(bits);
  const std::uint16_t got = narrow(f, v);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  if (std::isnan(v)) {
    if (got == (sign | f.quiet_nan)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << std::hex << "NaN 0x" << bits << " -> 0x" << got;
  }
  const double want = oracle::round_to(f.dtype, v);
  const double have = decode(f, got);
  if (!is_nan_pattern(f, got) && have == want && std::signbit(have) == std::signbit(v)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << std::hex << "0x" << bits << " (" << v << ") -> 0x" << got
                                       << " = " << have << ", want " << want;
}

class Conversions : public ::testing::TestWithParam<Half16> {};

TEST_P(Conversions, WideningIsExactForAllPatterns) {
  const Half16 f = GetParam();
  for (std::uint32_t i = 0; i <= 0xFFFFu; ++i) {
    const auto h = static_cast<std::uint16_t>(i);
    const float v = widen(f, h);
    if (is_nan_pattern(f, h)) {
      // Exact for NaN too: sign and payload kept, the payload moved to the top.
      const std::uint32_t payload = h & ((1u << mantissa_bits(f)) - 1u);
      const std::uint32_t want =
          (std::uint32_t{h & 0x8000u} << 16) | 0x7F800000u | (payload << (23 - mantissa_bits(f)));
      ASSERT_EQ(bits_of(v), want) << std::hex << h;
    } else {
      ASSERT_EQ(static_cast<double>(v), decode(f, h)) << std::hex << h;
      ASSERT_EQ(std::signbit(v), (h & 0x8000u) != 0) << std::hex << h;
    }
  }
}

// 2^24 patterns: every exponent and the top 15 mantissa bits of both signs, with
// scrambled low bits, NaNs and subnormals included.
TEST_P(Conversions, NarrowingMatchesIndependentRoundingOnStridedSweep) {
  const Half16 f = GetParam();
  for (std::uint32_t i = 0; i < (1u << 24); ++i) {
    const std::uint32_t low = (i * 0x9E3779B1u) >> 24;
    ASSERT_TRUE(narrows_correctly(f, (i << 8) | low));
  }
}

// Every value of the format, the midpoint to its upper neighbour (a tie) and the
// fp32 values on either side of that midpoint, for both signs.
TEST_P(Conversions, NarrowingMatchesAtEveryValueAndMidpoint) {
  const Half16 f = GetParam();
  for (std::uint32_t h = 0; h <= f.max_finite; ++h) {
    const double value = decode(f, static_cast<std::uint16_t>(h));
    // Above the largest finite value, the next value would be 2^(emax+1).
    const double next = h == f.max_finite ? std::ldexp(1.0, f.bias + 1)
                                          : decode(f, static_cast<std::uint16_t>(h + 1));
    const std::uint32_t mid = bits_of(static_cast<float>((value + next) / 2));  // exact in fp32
    ASSERT_EQ(static_cast<double>(float_of(mid)), (value + next) / 2);
    for (std::uint32_t sign : {0u, 0x80000000u}) {
      ASSERT_TRUE(narrows_correctly(f, sign | bits_of(static_cast<float>(value))));
      ASSERT_TRUE(narrows_correctly(f, sign | (mid - 1)));
      ASSERT_TRUE(narrows_correctly(f, sign | mid));
      ASSERT_TRUE(narrows_correctly(f, sign | (mid + 1)));
    }
  }
}

TEST_P(Conversions, NaNBecomesQuietNaNKeepingSign) {
  const Half16 f = GetParam();
  for (std::uint32_t nan : {0x7F800001u, 0x7FC00000u, 0x7FFFFFFFu, 0x7FA5A5A5u}) {
    EXPECT_EQ(narrow(f, float_of(nan)), f.quiet_nan) << std::hex << nan;
    EXPECT_EQ(narrow(f, float_of(nan | 0x80000000u)), f.quiet_nan | 0x8000u) << std::hex << nan;
  }
}

TEST_P(Conversions, InfinityStaysInfinity) {
  const Half16 f = GetParam();
  const auto inf = static_cast<std::uint16_t>(f.max_finite + 1);
  const float big = std::numeric_limits<float>::infinity();
  EXPECT_EQ(narrow(f, big), inf);
  EXPECT_EQ(narrow(f, -big), inf | 0x8000u);
  EXPECT_EQ(widen(f, inf), big);
  EXPECT_EQ(widen(f, static_cast<std::uint16_t>(inf | 0x8000u)), -big);
}

INSTANTIATE_TEST_SUITE_P(Formats, Conversions, ::testing::Values(kBf16, kF16),
                         [](const ::testing::TestParamInfo<Half16>& param) {
                           return std::string(dtype_name(param.param.dtype));
                         });

TEST(ConversionsF16, OverflowsAtTheMidpointAbove65504) {
  EXPECT_EQ(contract::f32_to_f16(65504.0f), 0x7BFFu);
  EXPECT_EQ(contract::f32_to_f16(65519.99f), 0x7BFFu);
  EXPECT_EQ(contract::f32_to_f16(std::nextafter(65520.0f, 0.0f)), 0x7BFFu);
  EXPECT_EQ(contract::f32_to_f16(65520.0f), 0x7C00u);  // tie, goes to the even 2^16: Inf
  EXPECT_EQ(contract::f32_to_f16(-65520.0f), 0xFC00u);
  EXPECT_EQ(contract::f32_to_f16(1e30f), 0x7C00u);
}

TEST(ConversionsBf16, OverflowsAtTheMidpointAboveTheLargestFinite) {
  EXPECT_EQ(contract::f32_to_bf16(float_of(0x7F7F7FFFu)), 0x7F7Fu);
  EXPECT_EQ(contract::f32_to_bf16(float_of(0x7F7F8000u)), 0x7F80u);  // tie, to even: Inf
  EXPECT_EQ(contract::f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80u);
  EXPECT_EQ(contract::f32_to_bf16(-std::numeric_limits<float>::max()), 0xFF80u);
}

TEST(ConversionsF16, SubnormalsAreKeptAndTiesGoToEven) {
  EXPECT_EQ(contract::f32_to_f16(0x1p-24f), 0x0001u);  // smallest subnormal
  EXPECT_EQ(contract::f32_to_f16(0x1p-25f), 0x0000u);  // tie between 0 and 2^-24: 0
  EXPECT_EQ(contract::f32_to_f16(0x1.000002p-25f), 0x0001u);
  EXPECT_EQ(contract::f32_to_f16(0x1.8p-24f), 0x0002u);  // tie between 1 and 2 units: 2
  EXPECT_EQ(contract::f32_to_f16(0x1.4p-24f), 0x0001u);
  EXPECT_EQ(contract::f32_to_f16(0x1.FFCp-15f),
            0x0400u);  // tie above the largest subnormal: normal
  EXPECT_EQ(contract::f32_to_f16(-0x1p-24f), 0x8001u);
  EXPECT_EQ(contract::f32_to_f16(-0x1p-26f), 0x8000u);          // negative zero kept
  EXPECT_EQ(contract::f32_to_f16(1.0f + 0x1p-11f), 0x3C00u);    // tie: even 1.0
  EXPECT_EQ(contract::f32_to_f16(1.0f + 0x1.8p-10f), 0x3C02u);  // tie: even 1 + 2^-9
  EXPECT_EQ(contract::f16_to_f32(0x0001u), 0x1p-24f);
  EXPECT_EQ(contract::f16_to_f32(0x03FFu), 0x1.FF8p-15f);
}

TEST(ConversionsBf16, SubnormalsAreKeptAndTiesGoToEven) {
  EXPECT_EQ(contract::f32_to_bf16(float_of(0x00010000u)), 0x0001u);  // 2^-133, smallest
  EXPECT_EQ(contract::f32_to_bf16(float_of(0x00008000u)), 0x0000u);  // tie: 0
  EXPECT_EQ(contract::f32_to_bf16(float_of(0x00018000u)), 0x0002u);  // tie: even 2
  EXPECT_EQ(contract::f32_to_bf16(float_of(0x00000001u)), 0x0000u);
  EXPECT_EQ(contract::f32_to_bf16(float_of(0x80000001u)), 0x8000u);
  EXPECT_EQ(contract::f32_to_bf16(1.0f + 0x1p-8f), 0x3F80u);         // tie: even 1.0
  EXPECT_EQ(contract::f32_to_bf16(1.0f + 0x1.8p-7f), 0x3F82u);       // tie: even 1 + 2^-6
  EXPECT_EQ(contract::f32_to_bf16(float_of(0x3F808001u)), 0x3F81u);  // above the tie
  EXPECT_EQ(contract::bf16_to_f32(0x0001u), 0x1p-133f);
}

TEST(RoundThrough, EqualsTheValueATensorOfThatTypeHolds) {
  for (std::uint32_t i = 0; i < (1u << 16); ++i) {
    const std::uint32_t bits = i * 0x00010001u + (i * 0x9E3779B1u >> 16);
    const float v = float_of(bits);
    EXPECT_EQ(bits_of(contract::round_through(DType::F32, v)), bits);
    if (std::isnan(v)) {
      const std::uint32_t sign = bits & 0x80000000u;
      EXPECT_EQ(bits_of(contract::round_through(DType::BF16, v)), sign | 0x7FC00000u);
      EXPECT_EQ(bits_of(contract::round_through(DType::F16, v)), sign | 0x7FC00000u);
      continue;
    }
    for (DType t : {DType::BF16, DType::F16}) {
      const float r = contract::round_through(t, v);
      ASSERT_EQ(static_cast<double>(r), oracle::round_to(t, v)) << std::hex << bits;
      ASSERT_EQ(std::signbit(r), std::signbit(v)) << std::hex << bits;
    }
  }
}

TEST(StoreOutput, WritesThePositiveCanonicalNaN) {
  for (std::uint32_t nan : {0x7F800001u, 0xFFC00000u, 0xFFFFFFFFu, 0x7FC12345u}) {
    float f32 = 0.0f;
    std::uint16_t b16 = 0;
    std::uint16_t h16 = 0;
    contract::store_output(DType::F32, &f32, 0, float_of(nan));
    contract::store_output(DType::BF16, &b16, 0, float_of(nan));
    contract::store_output(DType::F16, &h16, 0, float_of(nan));
    EXPECT_EQ(bits_of(f32), 0x7FC00000u) << std::hex << nan;
    EXPECT_EQ(b16, 0x7FC0u) << std::hex << nan;
    EXPECT_EQ(h16, 0x7E00u) << std::hex << nan;
  }
}

TEST(StoreOutput, StoresOtherValuesAsTheNarrowingAndLoadsThemBack) {
  std::uint16_t buffer16[3] = {};
  float buffer32[3] = {};
  const float values[] = {-0.0f, 0x1p-140f, -3.14159274f};
  for (int i = 0; i < 3; ++i) {
    contract::store_output(DType::F32, buffer32, i, values[i]);
    contract::store_output(DType::BF16, buffer16, i, values[i]);
    EXPECT_EQ(bits_of(buffer32[i]), bits_of(values[i]));  // subnormal and -0 kept
    EXPECT_EQ(buffer16[i], contract::f32_to_bf16(values[i]));
    EXPECT_EQ(bits_of(contract::load_f32(DType::F32, buffer32, i)), bits_of(values[i]));
    EXPECT_EQ(bits_of(contract::load_f32(DType::BF16, buffer16, i)),
              bits_of(contract::bf16_to_f32(buffer16[i])));
  }
  contract::store_output(DType::F16, buffer16, 1, 65520.0f);
  EXPECT_EQ(buffer16[1], 0x7C00u);
  EXPECT_EQ(contract::load_f32(DType::F16, buffer16, 1), std::numeric_limits<float>::infinity());
}

}  // namespace
}  // namespace kernel_align
