// RoPE cos/sin tables: agreement with an fp64 oracle, golden digests, independence
// from deduplication and from the floating-point environment, and rejected inputs.
#include "kernel_align/tables.hpp"

#include <gtest/gtest.h>
#include <mpfr.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <string>

#include "kernel_align/error.hpp"
#include "kernel_align/positions.hpp"
#include "support/errors.hpp"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace kernel_align {
namespace {

std::vector<std::int32_t> flatten(const std::vector<Position>& positions) {
  std::vector<std::int32_t> flat;
  flat.reserve(positions.size() * kPositionAxes);
  for (const Position& p : positions) flat.insert(flat.end(), p.begin(), p.end());
  return flat;
}

// Every axis of every row at the same position, as the seed's and diffusers' text tokens.
std::vector<std::int32_t> diagonal_rows(const std::vector<std::int32_t>& values) {
  std::vector<std::int32_t> flat;
  for (const std::int32_t v : values) flat.insert(flat.end(), {v, v, v});
  return flat;
}

RopeTables tables_of(const std::vector<std::int32_t>& flat, const RopeTableSpec& spec = {}) {
  return build_rope_tables(flat.data(),
                           static_cast<std::int64_t>(flat.size() / spec.axes_dim.size()), spec);
}

PositionRequest request_of(PositionLayout layout, std::int64_t width_px, std::int64_t height_px) {
  PositionRequest request;
  request.layout = layout;
  request.text_len = 256;
  request.images = {ImageGrid::from_pixels(width_px, height_px)};
  return request;
}

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Distance in representable fp32 values (both operands finite).
std::int64_t ulp_distance(float a, float b) {
  const auto ordered = [](float f) {
    const std::uint32_t u = bits_of(f);
    const std::int64_t magnitude = u & 0x7FFFFFFFu;
    return (u >> 31) != 0 ? -magnitude : magnitude;
  };
  return std::abs(ordered(a) - ordered(b));
}

// The oracle: the same recipe, the transcendental steps in fp64 with the platform's
// libm, each rounded to fp32 afterwards; the fp32 steps as plain fp32 operations.
float oracle_inverse_frequency(int i, int dim, float theta) {
  const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
  const auto power = static_cast<float>(std::pow(static_cast<double>(theta), exponent));
  return 1.0f / power;
}

float oracle_angle(std::int32_t position, float inverse_frequency) {
  return static_cast<float>(position) * inverse_frequency;
}

struct OracleAgreement {
  std::int64_t entries = 0;
  std::int64_t bitwise_equal = 0;
};

// `table` agrees with the oracle's fp64 value `exact`: within 1 ulp, and where they differ
// the fp64 value lies so close to the midpoint between the two fp32 values (a few
// fp64 ulps) that only fp64's own error can have decided the rounding: the table's
// value is then the correctly rounded one as far as fp64 can tell.
void expect_agreement(float table, double exact, OracleAgreement& agreement,
                      const std::string& where) {
  ++agreement.entries;
  const auto oracle = static_cast<float>(exact);
  if (bits_of(table) == bits_of(oracle)) {
    ++agreement.bitwise_equal;
    return;
  }
  ASSERT_LE(ulp_distance(table, oracle), 1) << where << ": " << table << " vs " << oracle;
  const double midpoint = (static_cast<double>(table) + static_cast<double>(oracle)) / 2;
  const double fp64_ulp =
      std::nextafter(std::fabs(exact), std::numeric_limits<double>::infinity()) - std::fabs(exact);
  EXPECT_LE(std::fabs(exact - midpoint), 4 * fp64_ulp) << where;
}

// Compares every entry of `tables` (built from `flat` with `spec`) with the oracle.
OracleAgreement compare_with_oracle(const RopeTables& tables, const std::vector<std::int32_t>& flat,
                                    const RopeTableSpec& spec) {
  OracleAgreement agreement;
  const std::size_t axes = spec.axes_dim.size();
  for (std::int64_t r = 0; r < tables.rows; ++r) {
    std::int64_t column = 0;
    for (std::size_t a = 0; a < axes; ++a) {
      for (int i = 0; i < spec.axes_dim[a] / 2; ++i, ++column) {
        const std::int32_t position = flat[static_cast<std::size_t>(r) * axes + a];
        const float angle =
            oracle_angle(position, oracle_inverse_frequency(i, spec.axes_dim[a], spec.theta));
        const auto index = static_cast<std::size_t>(r * tables.columns + column);
        const std::string where = "row " + std::to_string(r) + " column " + std::to_string(column);
        expect_agreement(tables.cos[index], std::cos(static_cast<double>(angle)), agreement,
                         "cos " + where);
        expect_agreement(tables.sin[index], std::sin(static_cast<double>(angle)), agreement,
                         "sin " + where);
        if (::testing::Test::HasFailure()) return agreement;  // one failure is enough to read
      }
    }
  }
  return agreement;
}

void report(const char* name, const OracleAgreement& agreement) {
  std::cout << name << ": " << agreement.bitwise_equal << " of " << agreement.entries
            << " cos/sin entries bitwise equal to the fp64 oracle ("
            << 100.0 * static_cast<double>(agreement.bitwise_equal) /
                   static_cast<double>(agreement.entries)
            << "%)\n";
}

TEST(RopeTablesOracleTest, InverseFrequenciesEqualTheOracleBitwise) {
  for (const float theta : {10000.0f, 500000.0f, 2.0f, 0.5f, 1e-30f, 3e38f}) {
    for (const int dim : {2, 16, 56, 64, 128, 4096}) {
      for (int i = 0; i < dim / 2; ++i) {
        ASSERT_EQ(bits_of(rope_inverse_frequency(i, dim, theta)),
                  bits_of(oracle_inverse_frequency(i, dim, theta)))
            << "theta " << theta << " dim " << dim << " i " << i;
      }
    }
  }
}

TEST(RopeTablesOracleTest, TableColumnsUseTheAxisInverseFrequency) {
  // Position 1 on every axis: the angle is the inverse frequency itself.
  const RopeTables tables = tables_of(diagonal_rows({1}));
  const RopeTables angle_table = tables_of(diagonal_rows({0}));
  std::int64_t column = 0;
  for (const int dim : {16, 56, 56}) {
    for (int i = 0; i < dim / 2; ++i, ++column) {
      const double inverse = rope_inverse_frequency(i, dim, 10000.0f);
      const auto c = static_cast<std::size_t>(column);
      EXPECT_EQ(bits_of(tables.cos[c]), bits_of(static_cast<float>(std::cos(inverse))));
      EXPECT_EQ(bits_of(angle_table.cos[c]), bits_of(1.0f));
      EXPECT_EQ(bits_of(angle_table.sin[c]), bits_of(0.0f));
    }
  }
}

TEST(RopeTablesOracleTest, IssueShapesAgreeWithTheFp64Oracle) {
  const RopeTableSpec spec;
  for (const auto& [name, request] :
       {std::pair{"diffusers 1024x1024", request_of(PositionLayout::Diffusers, 1024, 1024)},
        std::pair{"diffusers 1328x1328", request_of(PositionLayout::Diffusers, 1328, 1328)},
        std::pair{"diffusers 1664x928", request_of(PositionLayout::Diffusers, 1664, 928)},
        std::pair{"seed 1328x1328", request_of(PositionLayout::Seed, 1328, 1328)}}) {
    const std::vector<std::int32_t> flat = flatten(build_positions(request));
    const OracleAgreement agreement = compare_with_oracle(tables_of(flat, spec), flat, spec);
    report(name, agreement);
    EXPECT_GE(agreement.bitwise_equal * 10000, agreement.entries * 9999) << name;
  }
}

// Huge theta makes the last inverse frequencies and the angles subnormal, and their
// sines too: MPFR's subnormal rounding must give IEEE fp32's values.
TEST(RopeTablesOracleTest, SubnormalAnglesAgreeWithTheOracle) {
  const RopeTableSpec spec{.axes_dim = {4096}, .theta = 3e38f};
  const std::vector<std::int32_t> positions = {0, 1, 2, 3, -7, 1000, 1000000, -2147483647 - 1};
  const RopeTables tables = tables_of(positions, spec);
  const float smallest_normal = std::numeric_limits<float>::min();
  EXPECT_TRUE(std::any_of(tables.sin.begin(), tables.sin.end(),
                          [&](float s) { return s != 0.0f && std::fabs(s) < smallest_normal; }));
  report("theta 3e38, dim 4096", compare_with_oracle(tables, positions, spec));
}

// FNV-1a, 64-bit, over the bytes of the cos table and then of the sin table, in
// memory order (little-endian fp32).
std::uint64_t table_digest(const RopeTables& tables) {
  std::uint64_t hash = 0xcbf29ce484222325u;
  for (const std::vector<float>* values : {&tables.cos, &tables.sin}) {
    for (const std::byte byte : std::as_bytes(std::span(*values))) {
      hash ^= std::to_integer<std::uint64_t>(byte);
      hash *= 0x100000001b3u;
    }
  }
  return hash;
}

// Golden digests of the issue shapes (text_len 256, axes (16, 56, 56), theta 10000).
// Obtained once from this implementation, by reading the digests this test prints on
// failure, after the oracle tests above had passed with every entry bitwise equal;
// g++ 12 and clang 14 builds (Release and Debug) both produce them. A change here
// means that the tables changed.
TEST(RopeTablesDigestTest, IssueShapesMatchTheGoldenDigests) {
  const struct {
    PositionLayout layout;
    std::int64_t width_px;
    std::int64_t height_px;
    std::uint64_t digest;
  } cases[] = {
      {PositionLayout::Diffusers, 1024, 1024, 0x6fa1b5b2c1b62ba9u},
      {PositionLayout::Diffusers, 1328, 1328, 0xbc18302b2058a16eu},
      {PositionLayout::Diffusers, 1664, 928, 0xe6eb6ccc6d04d8dfu},
      {PositionLayout::Seed, 1328, 1328, 0xa71d519e55854ba4u},
  };
  for (const auto& c : cases) {
    const std::vector<std::int32_t> flat =
        flatten(build_positions(request_of(c.layout, c.width_px, c.height_px)));
    const RopeTables tables = tables_of(flat);
    EXPECT_EQ(tables.rows * kPositionAxes, static_cast<std::int64_t>(flat.size()));
    EXPECT_EQ(tables.columns, 64);
    EXPECT_EQ(table_digest(tables), c.digest)
        << position_layout_name(c.layout) << " " << c.width_px << "x" << c.height_px << std::hex
        << ": 0x" << table_digest(tables);
  }
}

// Deduplication computes each distinct position once; the rows must not depend on
// which other rows share the table or in what order.
TEST(RopeTablesDedupTest, PermutedPositionsGivePermutedRows) {
  PositionRequest request = request_of(PositionLayout::Diffusers, 1024, 1024);
  request.images.push_back(ImageGrid::from_pixels(1664, 928));
  const std::vector<Position> positions = build_positions(request);
  const RopeTables tables = tables_of(flatten(positions));

  std::vector<std::size_t> order(positions.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(7));
  std::vector<Position> permuted;
  for (const std::size_t r : order) permuted.push_back(positions[r]);
  const RopeTables permuted_tables = tables_of(flatten(permuted));

  const auto columns = static_cast<std::size_t>(tables.columns);
  for (std::size_t k = 0; k < order.size(); ++k) {
    const auto row = [&](const std::vector<float>& table, std::size_t r) {
      return std::vector<float>(table.begin() + r * columns, table.begin() + (r + 1) * columns);
    };
    ASSERT_EQ(row(permuted_tables.cos, k), row(tables.cos, order[k])) << "row " << k;
    ASSERT_EQ(row(permuted_tables.sin, k), row(tables.sin, order[k])) << "row " << k;
  }

  // A row built alone equals the same row built among thousands.
  const std::size_t last = positions.size() - 1;
  const RopeTables alone = tables_of(flatten({positions[last]}));
  EXPECT_TRUE(std::equal(alone.cos.begin(), alone.cos.end(), tables.cos.begin() + last * columns));
  EXPECT_TRUE(std::equal(alone.sin.begin(), alone.sin.end(), tables.sin.begin() + last * columns));
}

// Caller positions beyond 2^24 are rounded to fp32 (nearest-even) before the multiply.
TEST(RopeTablesPositionTest, LargePositionsRoundToFp32First) {
  constexpr std::int32_t k2To24 = 1 << 24;
  constexpr std::int32_t kMin = std::numeric_limits<std::int32_t>::min();
  constexpr std::int32_t kMax = std::numeric_limits<std::int32_t>::max();
  const std::vector<std::int32_t> values = {k2To24,  k2To24 + 1, k2To24 + 2, k2To24 + 3, k2To24 + 4,
                                            1 << 20, -(1 << 20), kMax,       kMin};
  const RopeTableSpec spec;
  const std::vector<std::int32_t> flat = diagonal_rows(values);
  const RopeTables tables = tables_of(flat, spec);
  const auto columns = static_cast<std::size_t>(tables.columns);
  const auto row = [&](const std::vector<float>& table, std::size_t r) {
    return std::vector<float>(table.begin() + r * columns, table.begin() + (r + 1) * columns);
  };
  const auto negated = [](std::vector<float> v) {
    for (float& x : v) x = -x;
    return v;
  };
  // 2^24 + 1 is a tie between 2^24 and 2^24 + 2: to even, 2^24. 2^24 + 3 ties to 2^24 + 4.
  EXPECT_EQ(row(tables.cos, 1), row(tables.cos, 0));
  EXPECT_EQ(row(tables.sin, 1), row(tables.sin, 0));
  EXPECT_NE(row(tables.sin, 2), row(tables.sin, 0));
  EXPECT_EQ(row(tables.cos, 3), row(tables.cos, 4));
  EXPECT_EQ(row(tables.sin, 3), row(tables.sin, 4));
  // Round-to-nearest is symmetric: -p gives the same cos and the negated sin.
  EXPECT_EQ(row(tables.cos, 6), row(tables.cos, 5));
  EXPECT_EQ(row(tables.sin, 6), negated(row(tables.sin, 5)));
  // 2^31 - 1 rounds to 2^31, the negation of -2^31.
  EXPECT_EQ(row(tables.cos, 8), row(tables.cos, 7));
  EXPECT_EQ(row(tables.sin, 8), negated(row(tables.sin, 7)));
  report("large positions", compare_with_oracle(tables, flat, spec));
}

// The tables do not depend on the caller's rounding mode, flush-to-zero state or
// MPFR state, and leave the latter as they found it.
TEST(RopeTablesEnvironmentTest, IndependentOfTheCallersFloatingPointState) {
  const RopeTableSpec spec{.axes_dim = {16, 4000}, .theta = 3e38f};  // subnormal values
  const std::vector<std::int32_t> flat = {0, 0, 1, 1, -3, 5, 1 << 20, 1 << 25};
  const RopeTables reference = tables_of(flat, spec);

  ASSERT_EQ(std::fesetround(FE_UPWARD), 0);
  const RopeTables upward = tables_of(flat, spec);
  std::fesetround(FE_TONEAREST);
  EXPECT_EQ(table_digest(upward), table_digest(reference));

#if defined(__SSE__)
  const unsigned int saved_csr = _mm_getcsr();
  _mm_setcsr(saved_csr | 0x8040u);  // flush-to-zero and denormals-are-zero
  const RopeTables flushed = tables_of(flat, spec);
  _mm_setcsr(saved_csr);
  EXPECT_EQ(table_digest(flushed), table_digest(reference));
#endif

  const mpfr_exp_t saved_min = mpfr_get_emin();
  const mpfr_exp_t saved_max = mpfr_get_emax();
  mpfr_set_emin(-1000);
  mpfr_set_emax(1000);
  mpfr_clear_flags();
  tables_of(flat, spec);
  EXPECT_EQ(rope_inverse_frequency(3, 16, 10000.0f), oracle_inverse_frequency(3, 16, 10000.0f));
  EXPECT_EQ(mpfr_get_emin(), -1000);
  EXPECT_EQ(mpfr_get_emax(), 1000);
  EXPECT_EQ(mpfr_flags_save(), 0u);
  mpfr_set_emin(saved_min);
  mpfr_set_emax(saved_max);
}

TEST(RopeTablesErrorTest, RejectsInvalidInputs) {
  const std::vector<std::int32_t> flat = {0, 1, 2};
  const auto build = [&](std::int64_t rows, RopeTableSpec spec, const std::int32_t* positions) {
    return test::rejected_argument([&] { build_rope_tables(positions, rows, spec); });
  };
  const RopeTableSpec valid;
  EXPECT_EQ(build(1, valid, flat.data()), "(accepted)");
  EXPECT_EQ(build(1, valid, nullptr), "positions");
  EXPECT_EQ(build(0, valid, flat.data()), "rows");
  EXPECT_EQ(build(-1, valid, flat.data()), "rows");
  EXPECT_EQ(build(std::int64_t{1} << 31, valid, flat.data()), "rows");
  EXPECT_EQ(build(1, {.axes_dim = {}}, flat.data()), "spec.axes_dim");
  EXPECT_EQ(build(1, {.axes_dim = {16, 55, 56}}, flat.data()), "spec.axes_dim[1]");
  EXPECT_EQ(build(1, {.axes_dim = {0}}, flat.data()), "spec.axes_dim[0]");
  EXPECT_EQ(build(1, {.axes_dim = {-2}}, flat.data()), "spec.axes_dim[0]");
  EXPECT_EQ(build(1, {.axes_dim = {4096, 2}}, flat.data()), "spec.axes_dim");
  EXPECT_EQ(build(1, {.axes_dim = {4096}}, flat.data()), "(accepted)");
  for (const float theta : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(build(1, {.theta = theta}, flat.data()), "spec.theta") << theta;
    EXPECT_EQ(test::rejected_argument([&] { rope_inverse_frequency(0, 16, theta); }), "theta");
  }

  EXPECT_EQ(test::rejected_argument([] { rope_inverse_frequency(-1, 16, 10000.0f); }), "i");
  EXPECT_EQ(test::rejected_argument([] { rope_inverse_frequency(8, 16, 10000.0f); }), "i");
  EXPECT_EQ(test::rejected_argument([] { rope_inverse_frequency(0, 15, 10000.0f); }), "dim");
  EXPECT_EQ(test::rejected_argument([] { rope_inverse_frequency(0, 0, 10000.0f); }), "dim");
}

TEST(RopeTablesErrorTest, ErrorSaysWhatWasFound) {
  try {
    build_rope_tables(nullptr, 1, {.axes_dim = {16, 55, 56}});
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "spec.axes_dim[1]");
    EXPECT_EQ(e.found(), "55");
  }
  try {
    build_rope_tables(nullptr, 1, {.theta = -2.5f});
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.found(), "-2.5");
  }
}

// ---- The timestep embedding -------------------------------------------------------

// The oracle of build_timestep_embedding: its fp32 steps as plain fp32 operations, exp,
// sin and cos in fp64 with the platform's libm.
float oracle_timestep_angle(float t, int i, const TimestepEmbeddingSpec& spec) {
  const auto log_period = static_cast<float>(-std::log(static_cast<double>(spec.max_period)));
  const auto divisor = static_cast<float>(static_cast<double>(spec.channels / 2) -
                                          static_cast<double>(spec.downscale_freq_shift));
  const float exponent = log_period * static_cast<float>(i) / divisor;
  const auto frequency = static_cast<float>(std::exp(static_cast<double>(exponent)));
  return spec.scale * (t * frequency);
}

OracleAgreement compare_timesteps_with_oracle(const std::vector<float>& timesteps,
                                              const TimestepEmbeddingSpec& spec) {
  const std::vector<float> rows =
      build_timestep_embedding(timesteps.data(), static_cast<std::int64_t>(timesteps.size()), spec);
  const int half = spec.channels / 2;
  EXPECT_EQ(rows.size(), timesteps.size() * static_cast<std::size_t>(spec.channels));
  const int sin_at = spec.flip_sin_to_cos ? half : 0;
  const int cos_at = spec.flip_sin_to_cos ? 0 : half;
  OracleAgreement agreement;
  for (std::size_t r = 0; r < timesteps.size(); ++r) {
    for (int i = 0; i < half; ++i) {
      const auto angle = static_cast<double>(oracle_timestep_angle(timesteps[r], i, spec));
      const std::size_t row = r * static_cast<std::size_t>(spec.channels);
      const std::string where = "timestep " + std::to_string(r) + " column " + std::to_string(i);
      expect_agreement(rows[row + static_cast<std::size_t>(sin_at + i)], std::sin(angle), agreement,
                       "sin " + where);
      expect_agreement(rows[row + static_cast<std::size_t>(cos_at + i)], std::cos(angle), agreement,
                       "cos " + where);
      if (::testing::Test::HasFailure()) return agreement;
    }
  }
  return agreement;
}

std::vector<float> random_timesteps(std::size_t n, float high, unsigned seed) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> uniform(0.0f, high);
  std::vector<float> t(n);
  for (float& v : t) v = uniform(random);
  t.front() = 0.0f;
  t.back() = high;
  return t;
}

TEST(TimestepEmbeddingTest, QwenImageSpecAgreesWithTheFp64Oracle) {
  const OracleAgreement agreement =
      compare_timesteps_with_oracle(random_timesteps(300, 1.0f, 1), {});
  report("timestep embedding, Qwen-Image's", agreement);
}

TEST(TimestepEmbeddingTest, OtherSpecsAgreeWithTheFp64Oracle) {
  // diffusers' defaults elsewhere: sin first, a shift of 1, scale 1, timesteps to 1000.
  const TimestepEmbeddingSpec spec{.channels = 320,
                                   .flip_sin_to_cos = false,
                                   .downscale_freq_shift = 1.0f,
                                   .scale = 1.0f,
                                   .max_period = 10000.0f};
  report("timestep embedding, 320 channels",
         compare_timesteps_with_oracle(random_timesteps(100, 1000.0f, 2), spec));
}

TEST(TimestepEmbeddingTest, ARowDependsOnItsTimestepAlone) {
  const std::vector<float> timesteps = random_timesteps(50, 1.0f, 3);
  const std::vector<float> all = build_timestep_embedding(timesteps.data(), 50);
  for (std::size_t r = 0; r < timesteps.size(); ++r) {
    const std::vector<float> alone = build_timestep_embedding(&timesteps[r], 1);
    ASSERT_EQ(std::memcmp(alone.data(), all.data() + r * 256, 256 * sizeof(float)), 0) << r;
  }
}

TEST(TimestepEmbeddingTest, RejectsInvalidInputs) {
  const float t[] = {0.5f, std::numeric_limits<float>::quiet_NaN()};
  const auto build = [&](std::int64_t n, const TimestepEmbeddingSpec& spec, const float* data) {
    return test::rejected_argument([&] { build_timestep_embedding(data, n, spec); });
  };
  EXPECT_EQ(build(1, {}, t), "(accepted)");
  EXPECT_EQ(build(0, {}, t), "n");
  EXPECT_EQ(build(1, {}, nullptr), "timesteps");
  EXPECT_EQ(build(2, {}, t), "timesteps[1]");
  EXPECT_EQ(build(1, {.channels = 255}, t), "spec.channels");
  EXPECT_EQ(build(1, {.channels = 4098}, t), "spec.channels");
  EXPECT_EQ(build(1, {.downscale_freq_shift = 128.0f}, t), "spec.downscale_freq_shift");
  EXPECT_EQ(build(1, {.scale = std::numeric_limits<float>::infinity()}, t), "spec.scale");
  EXPECT_EQ(build(1, {.max_period = 0.0f}, t), "spec.max_period");
}

// flow_sde_coefficients against the same expressions written literally (std = sqrt(...)
// first, then each constant as Flow-GRPO writes it) in MPFR at 512 bits, rounded by
// mpfr_get_flt: equal, bit for bit, on a grid of steps with sigma = 1 among them, and at
// noise levels whose inverse variance overflows fp32 (1e-20: +inf) or is subnormal (1e19).
TEST(FlowSdeCoefficientsTest, EqualTheExpressionsEvaluatedAt512Bits) {
  struct Wide {
    mpfr_t v;
    Wide() { mpfr_init2(v, 512); }
    explicit Wide(float f) : Wide() { mpfr_set_flt(v, f, MPFR_RNDN); }
    ~Wide() { mpfr_clear(v); }
    Wide(const Wide&) = delete;
    Wide& operator=(const Wide&) = delete;
  };
  const auto round = [](const Wide& w) { return mpfr_get_flt(w.v, MPFR_RNDN); };
  for (const float noise_level : {0.7f, 1.0f, 0.3f, 1e-20f, 1e19f}) {
    const float sigmas[] = {1.0f, 0.9464f, 0.8f, 0.6f, 0.35f, 0.1f, 0.02f, 0.0f};
    for (std::size_t i = 0; i + 1 < std::size(sigmas); ++i) {
      const float sigma = sigmas[i], sigma_prev = sigmas[i + 1], sigma_max = sigmas[1];
      SCOPED_TRACE(std::to_string(sigma) + " -> " + std::to_string(sigma_prev));
      const FlowSdeCoefficients c =
          flow_sde_coefficients(sigma, sigma_prev, noise_level, sigma_max);
      Wide s(sigma), sp(sigma_prev), a(noise_level), d(sigma == 1.0f ? sigma_max : sigma);
      Wide dt, std_dev, t, x_scale, v_scale, noise, inverse, log_norm;
      mpfr_sub(dt.v, sp.v, s.v, MPFR_RNDN);
      mpfr_ui_sub(t.v, 1, d.v, MPFR_RNDN);
      mpfr_div(std_dev.v, s.v, t.v, MPFR_RNDN);
      mpfr_sqrt(std_dev.v, std_dev.v, MPFR_RNDN);
      mpfr_mul(std_dev.v, std_dev.v, a.v, MPFR_RNDN);
      mpfr_sqr(t.v, std_dev.v, MPFR_RNDN);  // std^2
      mpfr_mul(x_scale.v, t.v, dt.v, MPFR_RNDN);
      mpfr_div(x_scale.v, x_scale.v, s.v, MPFR_RNDN);
      mpfr_div_ui(x_scale.v, x_scale.v, 2, MPFR_RNDN);
      mpfr_add_ui(x_scale.v, x_scale.v, 1, MPFR_RNDN);
      mpfr_ui_sub(v_scale.v, 1, s.v, MPFR_RNDN);
      mpfr_mul(v_scale.v, v_scale.v, t.v, MPFR_RNDN);
      mpfr_div(v_scale.v, v_scale.v, s.v, MPFR_RNDN);
      mpfr_div_ui(v_scale.v, v_scale.v, 2, MPFR_RNDN);
      mpfr_add_ui(v_scale.v, v_scale.v, 1, MPFR_RNDN);
      mpfr_mul(v_scale.v, v_scale.v, dt.v, MPFR_RNDN);
      mpfr_neg(noise.v, dt.v, MPFR_RNDN);
      mpfr_sqrt(noise.v, noise.v, MPFR_RNDN);
      mpfr_mul(noise.v, noise.v, std_dev.v, MPFR_RNDN);  // std sqrt(-dt)
      mpfr_sqr(inverse.v, noise.v, MPFR_RNDN);
      mpfr_mul_ui(inverse.v, inverse.v, 2, MPFR_RNDN);
      mpfr_ui_div(inverse.v, 1, inverse.v, MPFR_RNDN);
      mpfr_log(log_norm.v, noise.v, MPFR_RNDN);
      mpfr_const_pi(t.v, MPFR_RNDN);
      mpfr_mul_ui(t.v, t.v, 2, MPFR_RNDN);
      mpfr_sqrt(t.v, t.v, MPFR_RNDN);
      mpfr_log(t.v, t.v, MPFR_RNDN);
      mpfr_add(log_norm.v, log_norm.v, t.v, MPFR_RNDN);
      mpfr_neg(log_norm.v, log_norm.v, MPFR_RNDN);
      EXPECT_EQ(c.x_scale, round(x_scale));
      EXPECT_EQ(c.v_scale, round(v_scale));
      EXPECT_EQ(c.noise_scale, round(noise));
      EXPECT_EQ(c.inverse_two_variance, round(inverse));
      EXPECT_EQ(c.log_normalizer, round(log_norm));
    }
  }
  // sigma = 1 takes sigma_max where 1 - sigma would divide by zero.
  EXPECT_NE(flow_sde_coefficients(1.0f, 0.8f, 0.7f, 0.8f).noise_scale,
            flow_sde_coefficients(1.0f, 0.8f, 0.7f, 0.9f).noise_scale);
}

TEST(FlowSdeCoefficientsTest, RejectsStepsOutsideTheSchedule) {
  const auto coefficients = [](float sigma, float sigma_prev, float noise_level, float sigma_max) {
    return test::rejected_argument(
        [&] { flow_sde_coefficients(sigma, sigma_prev, noise_level, sigma_max); });
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(coefficients(0.8f, 0.6f, 0.7f, 0.9f), "(accepted)");
  EXPECT_EQ(coefficients(0.0f, 0.0f, 0.7f, 0.9f), "sigma");
  EXPECT_EQ(coefficients(1.5f, 0.6f, 0.7f, 0.9f), "sigma");
  EXPECT_EQ(coefficients(nan, 0.6f, 0.7f, 0.9f), "sigma");
  EXPECT_EQ(coefficients(0.8f, 0.8f, 0.7f, 0.9f), "sigma_prev");  // dt must be negative
  EXPECT_EQ(coefficients(0.8f, -0.1f, 0.7f, 0.9f), "sigma_prev");
  EXPECT_EQ(coefficients(0.8f, 0.6f, inf, 0.9f), "noise_level");
  EXPECT_EQ(coefficients(0.8f, 0.6f, 0.0f, 0.9f), "noise_level");
  EXPECT_EQ(coefficients(0.8f, 0.6f, 0.7f, 1.0f), "sigma_max");
}

}  // namespace
}  // namespace kernel_align
