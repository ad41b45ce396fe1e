// cos/sin tables of multi-axis RoPE (docs/positions-and-tables.md, "Tables"), the
// timestep embedding, and the SDE step's per-step constants: the host-side constants the
// kernels take.
//
// Every step of diffusers' recipe runs in MPFR at fp32's precision and exponent
// range and is rounded once, to nearest-even with fp32's subnormals: each result is
// the correctly rounded fp32 value of its step. MPFR computes with integers only, so
// the tables do not depend on the machine, the compiler, the libm, or the caller's
// rounding mode and flush-to-zero state.
#include "kernel_align/tables.hpp"

#include <mpfr.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>

#include "kernel_align/contract/float_ops.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"

namespace kernel_align {
namespace {

constexpr std::int64_t kMaxRows = std::numeric_limits<std::int32_t>::max();

// fp32 in MPFR's terms: 24-bit significands; MPFR writes x = 0.1b...b * 2^e, so the
// smallest subnormal 2^-149 has e = -148 and the largest finite value e = 128.
constexpr mpfr_prec_t kFp32Precision = 24;
constexpr mpfr_exp_t kFp32MinExponent = -148;
constexpr mpfr_exp_t kFp32MaxExponent = 128;

// While alive, MPFR's exponent range (per thread) is fp32's, so that results overflow
// and become subnormal where fp32's do. The caller's range and flags come back after.
class Fp32ExponentRange {
 public:
  Fp32ExponentRange()
      : saved_min_(mpfr_get_emin()), saved_max_(mpfr_get_emax()), saved_flags_(mpfr_flags_save()) {
    mpfr_set_emin(kFp32MinExponent);
    mpfr_set_emax(kFp32MaxExponent);
  }
  ~Fp32ExponentRange() {
    mpfr_set_emin(saved_min_);
    mpfr_set_emax(saved_max_);
    mpfr_flags_restore(saved_flags_, MPFR_FLAGS_ALL);
  }
  Fp32ExponentRange(const Fp32ExponentRange&) = delete;
  Fp32ExponentRange& operator=(const Fp32ExponentRange&) = delete;

 private:
  mpfr_exp_t saved_min_;
  mpfr_exp_t saved_max_;
  mpfr_flags_t saved_flags_;
};

// An MPFR variable of `precision` bits, owned.
template <mpfr_prec_t precision>
class MpfrNumber {
 public:
  MpfrNumber() { mpfr_init2(value_, precision); }
  ~MpfrNumber() { mpfr_clear(value_); }
  MpfrNumber(const MpfrNumber&) = delete;
  MpfrNumber& operator=(const MpfrNumber&) = delete;

  mpfr_ptr get() { return value_; }
  mpfr_srcptr get() const { return value_; }

 protected:
  mpfr_t value_;
};

// An MPFR variable holding an fp32 value. Use only while an Fp32ExponentRange lives.
class Fp32Number : public MpfrNumber<kFp32Precision> {
 public:
  // Exact, from the bits: converting through double would meet denormals-are-zero.
  void set_finite(float f) {
    const std::uint32_t bits = contract::bits_of(f);
    const std::uint32_t biased_exponent = (bits >> 23) & 0xFFu;
    const std::uint32_t fraction = bits & 0x7FFFFFu;
    // Subnormals: fraction * 2^-149; normal numbers: (2^23 + fraction) * 2^(biased - 150).
    const std::uint32_t significand = biased_exponent == 0 ? fraction : (fraction | 0x800000u);
    const long exponent = biased_exponent == 0 ? -149L : static_cast<long>(biased_exponent) - 150L;
    mpfr_set_ui_2exp(value_, significand, exponent, MPFR_RNDN);
    if ((bits >> 31) != 0) mpfr_neg(value_, value_, MPFR_RNDN);
  }

  // The value as a float, assembled from its bits (exact: it is an fp32 value).
  // A NaN becomes the positive quiet NaN, so that no sign or payload depends on MPFR.
  float to_float() const {
    if (mpfr_nan_p(value_)) return contract::float_of(0x7FC00000u);
    const std::uint32_t sign = mpfr_signbit(value_) ? 0x80000000u : 0u;
    if (mpfr_inf_p(value_)) return contract::float_of(sign | 0x7F800000u);
    if (mpfr_zero_p(value_)) return contract::float_of(sign);
    // |value| = fraction * 2^exponent, fraction in [0.5, 1) with at most 24 bits: both
    // the double and its scaling by 2^24 are exact.
    long exponent = 0;
    const double fraction = std::fabs(mpfr_get_d_2exp(&exponent, value_, MPFR_RNDN));
    const auto significand = static_cast<std::uint32_t>(fraction * 16777216.0);  // [2^23, 2^24)
    if (exponent >= -125) {  // normal: |value| >= 2^-126
      const auto biased_exponent = static_cast<std::uint32_t>(exponent + 126);
      return contract::float_of(sign | (biased_exponent << 23) | (significand - 0x800000u));
    }
    // Subnormal: |value| = (significand >> (-125 - exponent)) * 2^-149, the shifted-out
    // bits being zero after mpfr_subnormalize.
    return contract::float_of(sign | (significand >> (-125 - exponent)));
  }
};

// `ternary` is MPFR's sign of (rounded - exact) for the 24-bit rounding just done;
// mpfr_subnormalize uses it to round a result in the subnormal range once more
// without double rounding. The two together are IEEE fp32's round-to-nearest-even.
void round_to_fp32(Fp32Number& x, int ternary) {
  mpfr_subnormalize(x.get(), ternary, MPFR_RNDN);
}

void set_fp32_of_int(Fp32Number& result, long value) {
  round_to_fp32(result, mpfr_set_si(result.get(), value, MPFR_RNDN));
}

void fp32_div(Fp32Number& result, const Fp32Number& a, const Fp32Number& b) {
  round_to_fp32(result, mpfr_div(result.get(), a.get(), b.get(), MPFR_RNDN));
}

void fp32_mul(Fp32Number& result, const Fp32Number& a, const Fp32Number& b) {
  round_to_fp32(result, mpfr_mul(result.get(), a.get(), b.get(), MPFR_RNDN));
}

void fp32_pow(Fp32Number& result, const Fp32Number& base, const Fp32Number& exponent) {
  round_to_fp32(result, mpfr_pow(result.get(), base.get(), exponent.get(), MPFR_RNDN));
}

void fp32_reciprocal(Fp32Number& result, const Fp32Number& a) {
  round_to_fp32(result, mpfr_ui_div(result.get(), 1, a.get(), MPFR_RNDN));
}

// mpfr_sin_cos returns s + 4c, s (c) being 0 when the sine (cosine) is exact, 1 when
// it was rounded up and 2 when rounded down.
int ternary_of_sin_cos_code(int code) {
  return code == 0 ? 0 : (code == 1 ? 1 : -1);
}

void fp32_sin_cos(Fp32Number& sine, Fp32Number& cosine, const Fp32Number& angle) {
  const int code = mpfr_sin_cos(sine.get(), cosine.get(), angle.get(), MPFR_RNDN);
  round_to_fp32(sine, ternary_of_sin_cos_code(code & 3));
  round_to_fp32(cosine, ternary_of_sin_cos_code(code >> 2));
}

// e = fp32(2i) / fp32(dim); p = theta^e; inverse = 1 / p.
void compute_inverse_frequency(Fp32Number& inverse, int i, int dim, const Fp32Number& theta) {
  Fp32Number exponent;
  Fp32Number denominator;
  Fp32Number power;
  set_fp32_of_int(exponent, 2 * i);
  set_fp32_of_int(denominator, dim);
  fp32_div(exponent, exponent, denominator);
  fp32_pow(power, theta, exponent);
  fp32_reciprocal(inverse, power);
}

// Writes columns [first_column, first_column + dim/2) of every row of `tables`, the
// columns of `axis`. Positions repeat across rows (an 83x83 image has 83 distinct
// heights for 6889 tokens), so each distinct position's half-row is computed once and
// then copied to the rows that hold it; the values do not depend on the row.
void fill_axis_columns(const std::int32_t* positions, std::size_t axes, std::size_t axis, int dim,
                       const Fp32Number& theta, std::size_t first_column, RopeTables& tables) {
  const auto rows = static_cast<std::size_t>(tables.rows);
  const auto columns = static_cast<std::size_t>(tables.columns);
  const auto half = static_cast<std::size_t>(dim / 2);

  std::vector<Fp32Number> inverse_frequencies(half);
  for (std::size_t i = 0; i < half; ++i) {
    compute_inverse_frequency(inverse_frequencies[i], static_cast<int>(i), dim, theta);
  }

  std::vector<std::int32_t> distinct(rows);
  for (std::size_t r = 0; r < rows; ++r) distinct[r] = positions[r * axes + axis];
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());

  std::vector<float> distinct_cos(distinct.size() * half);
  std::vector<float> distinct_sin(distinct.size() * half);
  Fp32Number position;
  Fp32Number angle;
  Fp32Number sine;
  Fp32Number cosine;
  for (std::size_t d = 0; d < distinct.size(); ++d) {
    set_fp32_of_int(position, distinct[d]);
    for (std::size_t i = 0; i < half; ++i) {
      fp32_mul(angle, position, inverse_frequencies[i]);
      fp32_sin_cos(sine, cosine, angle);
      distinct_cos[d * half + i] = cosine.to_float();
      distinct_sin[d * half + i] = sine.to_float();
    }
  }

  for (std::size_t r = 0; r < rows; ++r) {
    const auto found =
        std::lower_bound(distinct.begin(), distinct.end(), positions[r * axes + axis]);
    const auto source = static_cast<std::size_t>(found - distinct.begin()) * half;
    const std::size_t target = r * columns + first_column;
    std::copy_n(distinct_cos.begin() + source, half, tables.cos.begin() + target);
    std::copy_n(distinct_sin.begin() + source, half, tables.sin.begin() + target);
  }
}

std::string float_text(float f) {
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, f);
  return std::string(buffer, result.ptr);
}

void check_theta(const char* argument, float theta) {
  if (!std::isfinite(theta) || !(theta > 0.0f)) {
    throw Error(argument, "finite and > 0", float_text(theta));
  }
}

void check_axis_dim(const std::string& argument, int dim) {
  if (dim <= 0 || dim % 2 != 0 || dim > kMaxHeadDim) {
    throw Error(argument, "even and in [2, 4096]", std::to_string(dim));
  }
}

// Returns the head dimension D, the sum of the axes' dimensions.
int check_spec(const RopeTableSpec& spec) {
  if (spec.axes_dim.empty()) throw Error("spec.axes_dim", "at least one axis", "none");
  int head_dim = 0;
  for (std::size_t a = 0; a < spec.axes_dim.size(); ++a) {
    check_axis_dim("spec.axes_dim[" + std::to_string(a) + "]", spec.axes_dim[a]);
    head_dim += spec.axes_dim[a];
    if (head_dim > kMaxHeadDim) {
      throw Error("spec.axes_dim", "dimensions summing to at most 4096",
                  "a sum of " + std::to_string(head_dim) + " up to axis " + std::to_string(a));
    }
  }
  check_theta("spec.theta", spec.theta);
  return head_dim;
}

// The timestep embedding's frequencies f_i, i < h (build_timestep_embedding).
std::vector<Fp32Number> timestep_frequencies(const TimestepEmbeddingSpec& spec, int half) {
  // ln(max_period) as Python's math.log gives it (a double), then as torch converts that
  // scalar for an fp32 tensor.
  mpfr_t log_double;
  mpfr_init2(log_double, 53);
  Fp32Number max_period;
  max_period.set_finite(spec.max_period);
  mpfr_log(log_double, max_period.get(), MPFR_RNDN);
  Fp32Number log_period;
  round_to_fp32(log_period, mpfr_set(log_period.get(), log_double, MPFR_RNDN));
  mpfr_clear(log_double);
  mpfr_neg(log_period.get(), log_period.get(), MPFR_RNDN);  // exact
  Fp32Number divisor;
  round_to_fp32(divisor, mpfr_set_d(divisor.get(),
                                    static_cast<double>(half) -
                                        static_cast<double>(spec.downscale_freq_shift),
                                    MPFR_RNDN));
  std::vector<Fp32Number> frequencies(static_cast<std::size_t>(half));
  Fp32Number index;
  Fp32Number exponent;
  for (int i = 0; i < half; ++i) {
    set_fp32_of_int(index, i);
    fp32_mul(exponent, log_period, index);
    fp32_div(exponent, exponent, divisor);
    Fp32Number& f = frequencies[static_cast<std::size_t>(i)];
    round_to_fp32(f, mpfr_exp(f.get(), exponent.get(), MPFR_RNDN));
  }
  return frequencies;
}

void check_timestep_spec(const TimestepEmbeddingSpec& spec) {
  if (spec.channels < 2 || spec.channels > kMaxHeadDim || spec.channels % 2 != 0) {
    throw Error("spec.channels", "even and in [2, 4096]", std::to_string(spec.channels));
  }
  if (!std::isfinite(spec.downscale_freq_shift) ||
      !(static_cast<double>(spec.channels) / 2.0 - spec.downscale_freq_shift > 0.0)) {
    throw Error("spec.downscale_freq_shift",
                "a finite number below channels/2 = " + std::to_string(spec.channels / 2),
                float_text(spec.downscale_freq_shift));
  }
  if (!std::isfinite(spec.scale)) throw Error("spec.scale", "finite", float_text(spec.scale));
  check_theta("spec.max_period", spec.max_period);
}

}  // namespace

RopeTables build_rope_tables(const std::int32_t* positions, std::int64_t rows,
                             const RopeTableSpec& spec) {
  const int head_dim = check_spec(spec);
  if (rows < 1 || rows > kMaxRows) {
    throw Error("rows", "between 1 and 2147483647", std::to_string(rows));
  }
  if (positions == nullptr) throw Error("positions", "a non-null pointer", "null");

  RopeTables tables;
  tables.rows = rows;
  tables.columns = head_dim / 2;
  tables.cos.resize(static_cast<std::size_t>(rows * tables.columns));
  tables.sin.resize(tables.cos.size());

  const Fp32ExponentRange fp32_range;
  Fp32Number theta;
  theta.set_finite(spec.theta);
  std::size_t first_column = 0;
  for (std::size_t a = 0; a < spec.axes_dim.size(); ++a) {
    fill_axis_columns(positions, spec.axes_dim.size(), a, spec.axes_dim[a], theta, first_column,
                      tables);
    first_column += static_cast<std::size_t>(spec.axes_dim[a] / 2);
  }
  return tables;
}

float rope_inverse_frequency(int i, int dim, float theta) {
  check_axis_dim("dim", dim);
  if (i < 0 || i >= dim / 2) {
    throw Error("i", "in [0, dim/2) = [0, " + std::to_string(dim / 2) + ")", std::to_string(i));
  }
  check_theta("theta", theta);

  const Fp32ExponentRange fp32_range;
  Fp32Number theta_value;
  theta_value.set_finite(theta);
  Fp32Number inverse;
  compute_inverse_frequency(inverse, i, dim, theta_value);
  return inverse.to_float();
}

std::vector<float> build_timestep_embedding(const float* timesteps, std::int64_t n,
                                            const TimestepEmbeddingSpec& spec) {
  check_timestep_spec(spec);
  if (n < 1 || n > kMaxRows) throw Error("n", "between 1 and 2147483647", std::to_string(n));
  if (timesteps == nullptr) throw Error("timesteps", "a non-null pointer", "null");
  for (std::int64_t r = 0; r < n; ++r) {
    if (!std::isfinite(timesteps[r])) {
      throw Error("timesteps[" + std::to_string(r) + "]", "a finite number",
                  float_text(timesteps[r]));
    }
  }
  const int half = spec.channels / 2;
  const auto columns = static_cast<std::size_t>(spec.channels);
  std::vector<float> embedding(static_cast<std::size_t>(n) * columns);

  const Fp32ExponentRange fp32_range;
  const std::vector<Fp32Number> frequencies = timestep_frequencies(spec, half);
  Fp32Number scale;
  scale.set_finite(spec.scale);
  Fp32Number t;
  Fp32Number angle;
  Fp32Number sine;
  Fp32Number cosine;
  // Offsets of the two halves in a row.
  const std::size_t sin_at = spec.flip_sin_to_cos ? static_cast<std::size_t>(half) : 0;
  const std::size_t cos_at = spec.flip_sin_to_cos ? 0 : static_cast<std::size_t>(half);
  for (std::int64_t r = 0; r < n; ++r) {
    t.set_finite(timesteps[r]);
    float* row = embedding.data() + static_cast<std::size_t>(r) * columns;
    for (int i = 0; i < half; ++i) {
      fp32_mul(angle, t, frequencies[static_cast<std::size_t>(i)]);
      fp32_mul(angle, scale, angle);
      fp32_sin_cos(sine, cosine, angle);
      row[sin_at + static_cast<std::size_t>(i)] = sine.to_float();
      row[cos_at + static_cast<std::size_t>(i)] = cosine.to_float();
    }
  }
  return embedding;
}

namespace {

// A real number carried at 256 bits: the SDE constants' exact expressions, each result
// then rounded once to fp32.
using WideNumber = MpfrNumber<256>;

// `exact` (256 bits) rounded once to fp32, nearest-even, fp32's subnormals, overflow to
// infinity. The rounding to 24 bits happens in MPFR's wide exponent range, where `exact`
// lives (an MPFR input outside the current range is undefined: an fp32 range set first
// turned 6e39 into -5.4e-38); then the fp32 range, its overflow and underflow
// (mpfr_check_range) and subnormals (mpfr_subnormalize), both told which way the first
// rounding went, so nothing is rounded twice.
float rounded_to_fp32(const WideNumber& exact) {
  Fp32Number result;
  const int ternary = mpfr_set(result.get(), exact.get(), MPFR_RNDN);
  const Fp32ExponentRange fp32_range;
  round_to_fp32(result, mpfr_check_range(result.get(), ternary, MPFR_RNDN));
  return result.to_float();
}

void set_wide(WideNumber& x, float f) {
  const Fp32ExponentRange fp32_range;
  Fp32Number exact;
  exact.set_finite(f);
  mpfr_set(x.get(), exact.get(), MPFR_RNDN);  // exact: 24 bits into 256
}

}  // namespace

FlowSdeCoefficients flow_sde_coefficients(float sigma, float sigma_prev, float noise_level,
                                          float sigma_max) {
  if (!(sigma > 0.0f && sigma <= 1.0f)) throw Error("sigma", "in (0, 1]", float_text(sigma));
  if (!(sigma_prev >= 0.0f && sigma_prev < sigma)) {
    throw Error("sigma_prev", "in [0, sigma) = [0, " + float_text(sigma) + ")",
                float_text(sigma_prev));
  }
  if (!(std::isfinite(noise_level) && noise_level > 0.0f)) {
    throw Error("noise_level", "finite and > 0", float_text(noise_level));
  }
  if (!(sigma_max > 0.0f && sigma_max < 1.0f)) {
    throw Error("sigma_max", "in (0, 1)", float_text(sigma_max));
  }
  WideNumber s, s_prev, level, denominator, dt, variance, t, u, result;
  set_wide(s, sigma);
  set_wide(s_prev, sigma_prev);
  set_wide(level, noise_level);
  set_wide(denominator, sigma == 1.0f ? sigma_max : sigma);
  mpfr_sub(dt.get(), s_prev.get(), s.get(), MPFR_RNDN);  // exact at 256 bits
  // std^2 = sigma / (1 - s') * noise_level^2
  mpfr_ui_sub(t.get(), 1, denominator.get(), MPFR_RNDN);
  mpfr_div(variance.get(), s.get(), t.get(), MPFR_RNDN);
  mpfr_sqr(t.get(), level.get(), MPFR_RNDN);
  mpfr_mul(variance.get(), variance.get(), t.get(), MPFR_RNDN);
  FlowSdeCoefficients c{};
  // x_scale = 1 + std^2 dt / (2 sigma)
  mpfr_mul(t.get(), variance.get(), dt.get(), MPFR_RNDN);
  mpfr_div(t.get(), t.get(), s.get(), MPFR_RNDN);
  mpfr_div_2ui(t.get(), t.get(), 1, MPFR_RNDN);
  mpfr_add_ui(result.get(), t.get(), 1, MPFR_RNDN);
  c.x_scale = rounded_to_fp32(result);
  // v_scale = (1 + std^2 (1 - sigma) / (2 sigma)) dt
  mpfr_ui_sub(t.get(), 1, s.get(), MPFR_RNDN);
  mpfr_mul(t.get(), t.get(), variance.get(), MPFR_RNDN);
  mpfr_div(t.get(), t.get(), s.get(), MPFR_RNDN);
  mpfr_div_2ui(t.get(), t.get(), 1, MPFR_RNDN);
  mpfr_add_ui(t.get(), t.get(), 1, MPFR_RNDN);
  mpfr_mul(result.get(), t.get(), dt.get(), MPFR_RNDN);
  c.v_scale = rounded_to_fp32(result);
  // The variance of a step's noise, std^2 (-dt), and its square root.
  mpfr_neg(u.get(), dt.get(), MPFR_RNDN);
  mpfr_mul(u.get(), u.get(), variance.get(), MPFR_RNDN);
  mpfr_sqrt(result.get(), u.get(), MPFR_RNDN);
  c.noise_scale = rounded_to_fp32(result);
  mpfr_mul_2ui(t.get(), u.get(), 1, MPFR_RNDN);
  mpfr_ui_div(result.get(), 1, t.get(), MPFR_RNDN);
  c.inverse_two_variance = rounded_to_fp32(result);
  // -ln(sqrt(u)) - ln(sqrt(2 pi)) = -(ln(u) + ln(2 pi)) / 2
  mpfr_log(t.get(), u.get(), MPFR_RNDN);
  mpfr_const_pi(result.get(), MPFR_RNDN);
  mpfr_mul_2ui(result.get(), result.get(), 1, MPFR_RNDN);
  mpfr_log(result.get(), result.get(), MPFR_RNDN);
  mpfr_add(result.get(), t.get(), result.get(), MPFR_RNDN);
  mpfr_div_2ui(result.get(), result.get(), 1, MPFR_RNDN);
  mpfr_neg(result.get(), result.get(), MPFR_RNDN);
  c.log_normalizer = rounded_to_fp32(result);
  // pi and log 2 are cached per thread by MPFR, and a thread of a pool that ends (verify's
  // workers) would leak them: freed here, at the cost of recomputing them next call.
  mpfr_free_cache2(MPFR_FREE_LOCAL_CACHE);
  return c;
}

}  // namespace kernel_align
