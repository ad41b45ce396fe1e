// The fp64 oracle. Values are the plain formulas evaluated in fp64; bounds follow
// the contract's fp32 steps one by one (docs/accuracy.md): each step's bound is
// the propagated bound of its operands plus the error of its own rounding.
#include "oracle/oracle.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace kernel_align::oracle {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
constexpr double kUnit32 = 0x1p-24;        // unit roundoff of fp32
constexpr double kUnderflow32 = 0x1p-150;  // largest error of a result rounded to an fp32 subnormal
constexpr double kFloat32Max = 0x1.FFFFFEp127;
// The contract's row tree (16 lanes, then halvings by 8, 4, 2, 1) and dw
// partition (docs/contract.md), restated: the oracle does not include the contract.
constexpr int kTreeLanes = 16;
constexpr int kTreeLevels = 4;
constexpr std::int64_t kDwBlockRows = 256;
// The oracle's own fp64 error on any quantity is below 2^-16 of the contract's
// bound on it (docs/accuracy.md, "The oracle's own error"); this covers it.
constexpr double kOracleMargin = 1.0 + 0x1p-12;

// A binary format: significand bits (with the implicit one), smallest normal
// exponent, largest finite value.
struct Format {
  int precision;
  int min_exponent;
  double max_finite;
};

Format format_of(DType t) {
  switch (t) {
    case DType::BF16:
      return {8, -126, 0x1.FEp127};
    case DType::F16:
      return {11, -14, 65504.0};
    case DType::F32:
    case DType::Bool:  // never computed with (validation)
      break;
  }
  return {24, -126, kFloat32Max};
}

// 2^n, for the exponents of normal doubles.
double power_of_two(int n) {
  return std::bit_cast<double>(static_cast<std::uint64_t>(n + 1023) << 52);
}

// Distance between neighbouring values of `f` around `magnitude` (>= 0): the
// spacing of its binade, or of the subnormals below the smallest normal.
double spacing(const Format& f, double magnitude) {
  const int binade =
      static_cast<int>((std::bit_cast<std::uint64_t>(magnitude) >> 52) & 0x7FF) - 1023;
  return power_of_two(std::max(binade, f.min_exponent) - f.precision + 1);
}

// gamma_k of Higham: k roundings of relative error u compound to at most this.
double gamma(double k) {
  return k * kUnit32 / (1.0 - k * kUnit32);
}

// Bound on |RN32(v^) - v| when |v^ - v| <= error and |v| = magnitude; infinite
// (no claim) where the result may overflow.
double rounded(double magnitude, double error) {
  const double reach = magnitude + error;
  if (!(reach < kFloat32Max)) {
    return kInfinity;
  }
  return error + kUnit32 * reach + kUnderflow32;
}

// Additions a term of a row of `n` goes through in the contract's tree: the
// first addition to a lane is to +0 (exact), then ceil(n/16)-1 more and the levels.
int tree_path(std::int64_t n) {
  return static_cast<int>((n + kTreeLanes - 1) / kTreeLanes) - 1 + kTreeLevels;
}

// The same for dw: within its block (at most min(rows, 256) rows, the first
// exact) and then through the ceil(rows/256) block sums added in order from +0
// (the first exact). No rows: no addition.
int dw_path(std::int64_t rows) {
  if (rows <= 0) {
    return 0;
  }
  const std::int64_t blocks = (rows + kDwBlockRows - 1) / kDwBlockRows;
  return static_cast<int>(std::min(rows, kDwBlockRows) - 1 + blocks - 1);
}

// Bound on the error of a sum in `path` rounded additions of terms t^_i with
// sum |t_i| = sum_abs and sum |t^_i - t_i| <= term_error.
double sum_error(int path, double sum_abs, double term_error) {
  const double reach = sum_abs + term_error;
  if (!(reach < kFloat32Max)) {
    return kInfinity;
  }
  return term_error + gamma(path) * reach;
}

// An exact value and a bound on the contract's error on it.
struct Bounded {
  double value;
  double error;
};

// `b` rounded through dtype `t`, as diffusers' `.to(weight.dtype)`: the contract
// rounds some value within b.error of b.value, and rounding is monotone, so its
// result lies between the roundings of the interval's ends.
Bounded through(DType t, const Bounded& b) {
  const double r = round_to(t, b.value);
  if (!std::isfinite(b.error)) {
    return {r, kInfinity};
  }
  const double reach = b.error * kOracleMargin;
  return {r, std::max(round_to(t, b.value + reach) - r, r - round_to(t, b.value - reach))};
}

// The Expected of a result the contract computes in fp32 within b.error of
// b.value and then stores as `out`: plus half a spacing of `out` where it narrows.
Expected stored_as(DType out, const Bounded& b) {
  if (!std::isfinite(b.value)) {
    return {b.value, 0.0};  // IEEE specials propagate alike
  }
  const double error = b.error * kOracleMargin;
  if (!std::isfinite(error)) {
    return {b.value, kInfinity};
  }
  const Format f = format_of(out);
  // From here on, values round to Inf (the tie goes to the even 2^(emax+1)).
  const double overflow = f.max_finite + spacing(f, f.max_finite) / 2;
  const double magnitude = std::fabs(b.value);
  if (magnitude - error >= overflow) {
    return {std::copysign(kInfinity, b.value), 0.0};
  }
  if (magnitude + error >= overflow) {
    return {b.value, kInfinity};
  }
  const double narrowing = out == DType::F32 ? 0.0 : spacing(f, magnitude + error) / 2;
  return {b.value, error + narrowing};
}

// rstd = 1 / sqrt(mean(x^2) + eps) of one row, with the bound of the contract's
// steps: RN(x*x) terms, the row tree, RN(ss/D), RN(mean+eps), RN(sqrt), RN(1/r).
Bounded row_rstd(std::span<const double> x, double eps) {
  const auto d = static_cast<double>(x.size());
  double sum_squares = 0.0;
  for (double v : x) {
    sum_squares += v * v;
  }
  const double mean = sum_squares / d;
  const double shifted = mean + eps;
  const double root = std::sqrt(shifted);
  const double rstd = 1.0 / root;

  const double square_errors = kUnit32 * sum_squares + d * kUnderflow32;
  const double sum_bound = sum_error(tree_path(std::ssize(x)), sum_squares, square_errors);
  const double mean_bound = rounded(mean, sum_bound / d);
  const double shifted_bound = rounded(std::fabs(shifted), mean_bound);
  if (!(shifted_bound < shifted)) {
    return {rstd, kInfinity};
  }
  // |sqrt(a^) - sqrt(a)| = |a^ - a| / (sqrt(a^) + sqrt(a)).
  const double root_bound =
      rounded(root, shifted_bound / (std::sqrt(shifted - shifted_bound) + root));
  if (!(root_bound < root)) {
    return {rstd, kInfinity};
  }
  // |1/r^ - 1/r| = |r^ - r| / (r^ r).
  return {rstd, rounded(rstd, root_bound / ((root - root_bound) * root))};
}

// The value the weight multiplies: x * rstd, rounded through the weight's dtype
// in diffusers mode.
Bounded normalized(double x, const Bounded& rstd, NormMode mode, DType weight_dtype) {
  const double z = x * rstd.value;
  const Bounded product{z, rounded(std::fabs(z), std::fabs(x) * rstd.error)};
  return mode == NormMode::Diffusers ? through(weight_dtype, product) : product;
}

// Bound on the error of RN(a^ * b^) given bounds on both operands.
Bounded product(const Bounded& a, const Bounded& b) {
  const double p = a.value * b.value;
  const double propagated =
      std::fabs(a.value) * b.error + std::fabs(b.value) * a.error + a.error * b.error;
  return {p, rounded(std::fabs(p), propagated)};
}

double weight_at(std::span<const double> weight, int i) {
  return weight.empty() ? 1.0 : weight[static_cast<std::size_t>(i)];
}

}  // namespace

double round_to(DType t, double v) {
  if (!std::isfinite(v) || v == 0.0) {
    return v;
  }
  const Format f = format_of(t);
  const double quantum = spacing(f, std::fabs(v));
  // Exact: a power-of-two scaling to an integer part below 2^precision.
  const double scaled = std::fabs(v) / quantum;
  const double floor = std::floor(scaled);
  const double fraction = scaled - floor;
  const bool odd = std::floor(floor / 2) != floor / 2;
  const bool up = fraction > 0.5 || (fraction == 0.5 && odd);
  const double magnitude = (up ? floor + 1.0 : floor) * quantum;
  return std::copysign(magnitude > f.max_finite ? kInfinity : magnitude, v);
}

bool within(const Expected& e, double stored) {
  if (std::isnan(e.value)) {
    return std::isnan(stored);
  }
  if (std::isinf(e.value)) {
    return stored == e.value;
  }
  if (std::isinf(e.bound)) {
    return true;
  }
  return std::fabs(stored - e.value) <= e.bound;
}

std::vector<Expected> rmsnorm_forward(std::span<const double> x, int d,
                                      std::span<const double> weight, double eps, NormMode mode,
                                      DType weight_dtype, DType out_dtype) {
  std::vector<Expected> y;
  y.reserve(x.size());
  for (std::size_t begin = 0; begin < x.size(); begin += static_cast<std::size_t>(d)) {
    const auto row = x.subspan(begin, static_cast<std::size_t>(d));
    const Bounded rstd = row_rstd(row, eps);
    for (int i = 0; i < d; ++i) {
      const Bounded w{weight_at(weight, i), 0.0};
      y.push_back(stored_as(out_dtype, product(normalized(row[i], rstd, mode, weight_dtype), w)));
    }
  }
  return y;
}

RmsNormGradients rmsnorm_backward(std::span<const double> x, std::span<const double> dy, int d,
                                  std::span<const double> weight, double eps, NormMode mode,
                                  DType weight_dtype, DType dx_dtype, DType dw_dtype) {
  const auto width = static_cast<std::size_t>(d);
  const auto rows = static_cast<std::int64_t>(x.size() / width);
  RmsNormGradients out;
  out.dx.reserve(x.size());
  // Per column of dw: sum of dy * normalized, of |dy * normalized|, and of the
  // bounds on the contract's rounded products.
  std::vector<double> dw_sum(width, 0.0);
  std::vector<double> dw_sum_abs(width, 0.0);
  std::vector<double> dw_term_error(width, 0.0);

  const int path = tree_path(d);
  for (std::size_t begin = 0; begin < x.size(); begin += width) {
    const auto xr = x.subspan(begin, width);
    const auto dyr = dy.subspan(begin, width);
    const Bounded rstd = row_rstd(xr, eps);

    // g = RN(dy * w); dot = tree sum of RN(g * x).
    std::vector<Bounded> g(width);
    double dot = 0.0;
    double dot_abs = 0.0;
    double dot_term_error = 0.0;
    for (std::size_t i = 0; i < width; ++i) {
      g[i] = product({dyr[i], 0.0}, {weight_at(weight, static_cast<int>(i)), 0.0});
      const Bounded term = product(g[i], {xr[i], 0.0});
      dot += term.value;
      dot_abs += std::fabs(term.value);
      dot_term_error += term.error;
    }
    const double dot_error = sum_error(path, dot_abs, dot_term_error);

    // coef = RN(RN(RN(rstd * rstd) * rstd) * RN(dot / D)).
    const Bounded rstd3 = product(product(rstd, rstd), rstd);
    const Bounded dot_over_d{dot / d, rounded(std::fabs(dot / d), dot_error / d)};
    const Bounded coef = product(rstd3, dot_over_d);

    for (std::size_t i = 0; i < width; ++i) {
      const Bounded scaled_g = product(rstd, g[i]);
      const Bounded correction = product({xr[i], 0.0}, coef);
      const double v = scaled_g.value - correction.value;
      out.dx.push_back(
          stored_as(dx_dtype, {v, rounded(std::fabs(v), scaled_g.error + correction.error)}));

      if (!weight.empty()) {
        const Bounded n = normalized(xr[i], rstd, mode, weight_dtype);
        const Bounded term = product({dyr[i], 0.0}, n);
        dw_sum[i] += term.value;
        dw_sum_abs[i] += std::fabs(term.value);
        dw_term_error[i] += term.error;
      }
    }
  }
  if (!weight.empty()) {
    out.dw.reserve(width);
    for (std::size_t i = 0; i < width; ++i) {
      out.dw.push_back(stored_as(
          dw_dtype, {dw_sum[i], sum_error(dw_path(rows), dw_sum_abs[i], dw_term_error[i])}));
    }
  }
  return out;
}

std::vector<Expected> rope(std::span<const double> x, std::int64_t batch, std::int64_t seq,
                           std::int64_t heads, int d, std::span<const double> cos,
                           std::span<const double> sin, Pairing pairing, bool transpose,
                           DType out_dtype) {
  const int pairs = d / 2;
  std::vector<Expected> y(x.size());
  // first = a*c - b*s', second = a*s' + b*c, s' = -s for the transpose. The
  // products of two fp32 values are exact in fp64; the contract rounds each
  // product, then the sum.
  const auto rotated = [](double p, double q) {
    const double v = p + q;
    return Bounded{v,
                   rounded(std::fabs(v), rounded(std::fabs(p), 0.0) + rounded(std::fabs(q), 0.0))};
  };
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t s = 0; s < seq; ++s) {
      for (std::int64_t h = 0; h < heads; ++h) {
        const std::int64_t base = ((b * seq + s) * heads + h) * d;
        for (int i = 0; i < pairs; ++i) {
          const std::int64_t ia = base + (pairing == Pairing::Half ? i : 2 * i);
          const std::int64_t ib = base + (pairing == Pairing::Half ? i + pairs : 2 * i + 1);
          const double a = x[static_cast<std::size_t>(ia)];
          const double bv = x[static_cast<std::size_t>(ib)];
          const double c = cos[static_cast<std::size_t>(s * pairs + i)];
          const double sn = (transpose ? -1.0 : 1.0) * sin[static_cast<std::size_t>(s * pairs + i)];
          y[static_cast<std::size_t>(ia)] = stored_as(out_dtype, rotated(a * c, -(bv * sn)));
          y[static_cast<std::size_t>(ib)] = stored_as(out_dtype, rotated(a * sn, bv * c));
        }
      }
    }
  }
  return y;
}

}  // namespace kernel_align::oracle
