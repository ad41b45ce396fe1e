// The GEMM reference (reference/gemm.hpp) against the linear tree written out
// independently here, on random shapes, strides and dtypes; rows are independent.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "api/gemm_problem.hpp"
#include "kernel_align/contract/convert.hpp"
#include "reference/gemm.hpp"

namespace kernel_align {
namespace {

using contract::add;

// The tree from docs/contract.md: leaves of 32 fma's from +0, n_leaves = 2^a q, groups
// of q leaves summed by the binary counter (perfect trees of the bits of q, largest
// first, folded from the smallest), a perfect tree over the groups.
float perfect(const std::vector<float>& v, std::size_t first, std::size_t count) {
  if (count == 1) return v[first];
  return add(perfect(v, first, count / 2), perfect(v, first + count / 2, count / 2));
}

float counter(const std::vector<float>& v, std::size_t first, std::size_t count) {
  std::size_t power = 1;
  while (power * 2 <= count) power *= 2;
  if (power == count) return perfect(v, first, count);
  return add(perfect(v, first, power), counter(v, first + power, count - power));
}

float dot(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> leaves;
  for (std::size_t begin = 0; begin < a.size(); begin += 32) {
    float acc = 0.0f;
    for (std::size_t k = begin; k < std::min(a.size(), begin + 32); ++k)
      acc = std::fma(a[k], b[k], acc);
    leaves.push_back(acc);
  }
  if (leaves.empty()) return 0.0f;
  std::size_t q = leaves.size();
  while (q % 2 == 0) q /= 2;
  std::vector<float> groups;
  for (std::size_t g = 0; g < leaves.size(); g += q) groups.push_back(counter(leaves, g, q));
  return perfect(groups, 0, groups.size());
}

struct Case {
  std::int64_t m, n, r;
  bool b_transposed;  // b[r][n] = w[n][r] (forward) or row-major (dx)
  std::int64_t pad;   // extra elements per row of every matrix
};

TEST(GemmReference, MatchesIndependentTree) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  for (const Case& c : {Case{1, 1, 1, false, 0}, Case{3, 5, 31, true, 0}, Case{4, 7, 33, true, 3},
                        Case{2, 9, 100, false, 1}, Case{5, 3, 256, true, 0},
                        Case{2, 4, 3072, true, 5}, Case{1, 2, 3584, false, 0}}) {
    const std::int64_t lda = c.r + c.pad;
    std::vector<float> a(static_cast<std::size_t>(c.m * lda));
    const std::int64_t b_rows = c.b_transposed ? c.n : c.r;
    const std::int64_t b_cols = c.b_transposed ? c.r : c.n;
    const std::int64_t ldb = b_cols + c.pad;
    std::vector<float> b(static_cast<std::size_t>(b_rows * ldb));
    for (float& v : a) v = normal(rng);
    for (float& v : b) v = normal(rng);
    const std::int64_t ldc = c.n + c.pad;
    std::vector<float> out(static_cast<std::size_t>(c.m * ldc), 7.0f);
    const detail::GemmMatrix bm = c.b_transposed ? detail::GemmMatrix{b.data(), DType::F32, 1, ldb}
                                                 : detail::GemmMatrix{b.data(), DType::F32, ldb, 1};
    reference::gemm({c.m,
                     c.n,
                     c.r,
                     {a.data(), DType::F32, lda, 1},
                     bm,
                     std::nullopt,
                     contract::Activation::None,
                     std::nullopt,
                     out.data(),
                     DType::F32,
                     ldc,
                     1});
    for (std::int64_t i = 0; i < c.m; ++i) {
      for (std::int64_t j = 0; j < c.n; ++j) {
        std::vector<float> row(static_cast<std::size_t>(c.r)), col(row.size());
        for (std::int64_t k = 0; k < c.r; ++k) {
          row[k] = a[i * lda + k];
          col[k] = c.b_transposed ? b[j * ldb + k] : b[k * ldb + j];
        }
        const float want = dot(row, col);
        ASSERT_EQ(contract::bits_of(out[i * ldc + j]), contract::bits_of(want))
            << c.m << "x" << c.n << "x" << c.r << " at " << i << "," << j;
      }
      for (std::int64_t j = c.n; j < ldc; ++j)
        ASSERT_EQ(out[i * ldc + j], 7.0f);  // padding untouched
    }
  }
}

TEST(GemmReference, BiasActivationAndRounding) {
  const std::vector<float> a = {1.5f, -2.0f, 0.25f};
  const std::vector<float> w = {2.0f, 1.0f, 4.0f, -1.0f, 0.5f, 3.0f};  // 2 x 3
  const std::vector<std::uint16_t> bias = {contract::f32_to_bf16(0.5f),
                                           contract::f32_to_bf16(-1.0f)};
  std::vector<std::uint16_t> out(2);
  reference::gemm({1,
                   2,
                   3,
                   {a.data(), DType::F32, 3, 1},
                   {w.data(), DType::F32, 1, 3},
                   detail::GemmMatrix{bias.data(), DType::BF16, 0, 1},
                   contract::Activation::Silu,
                   std::nullopt,
                   out.data(),
                   DType::F16,
                   2,
                   1});
  const float s0 = 1.5f * 2.0f - 2.0f * 1.0f + 0.25f * 4.0f + 0.5f;  // 2.5
  const float s1 = -1.5f - 1.0f + 0.75f - 1.0f;                      // -2.75
  EXPECT_EQ(out[0], contract::f32_to_f16(contract::silu(s0)));
  EXPECT_EQ(out[1], contract::f32_to_f16(contract::silu(s1)));
}

TEST(GemmReference, NegativeZeroKeptWithoutBias) {
  // R = 0: S = +0; with a bias of -0 the sum is +0 + -0 = +0.
  const float bias = -0.0f;
  float out[2] = {1.0f, 1.0f};
  reference::gemm({1,
                   1,
                   0,
                   {nullptr, DType::F32, 0, 1},
                   {nullptr, DType::F32, 0, 1},
                   std::nullopt,
                   contract::Activation::None,
                   std::nullopt,
                   out,
                   DType::F32,
                   1,
                   1});
  reference::gemm({1,
                   1,
                   0,
                   {nullptr, DType::F32, 0, 1},
                   {nullptr, DType::F32, 0, 1},
                   detail::GemmMatrix{&bias, DType::F32, 0, 1},
                   contract::Activation::None,
                   std::nullopt,
                   out + 1,
                   DType::F32,
                   1,
                   1});
  EXPECT_EQ(contract::bits_of(out[0]), 0u);
  EXPECT_EQ(contract::bits_of(out[1]), 0u);
}

TEST(GemmReference, RowsAreIndependent) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  const std::int64_t m = 9, n = 13, r = 200;
  std::vector<float> a(static_cast<std::size_t>(m * r)), w(static_cast<std::size_t>(n * r));
  for (float& v : a) v = normal(rng);
  for (float& v : w) v = normal(rng);
  std::vector<std::uint16_t> all(static_cast<std::size_t>(m * n)), one(static_cast<std::size_t>(n));
  const detail::GemmMatrix b{w.data(), DType::F32, 1, r};
  reference::gemm({m,
                   n,
                   r,
                   {a.data(), DType::F32, r, 1},
                   b,
                   std::nullopt,
                   contract::Activation::GeluTanh,
                   std::nullopt,
                   all.data(),
                   DType::BF16,
                   n,
                   1});
  for (std::int64_t i = 0; i < m; ++i) {
    reference::gemm({1,
                     n,
                     r,
                     {a.data() + i * r, DType::F32, r, 1},
                     b,
                     std::nullopt,
                     contract::Activation::GeluTanh,
                     std::nullopt,
                     one.data(),
                     DType::BF16,
                     n,
                     1});
    EXPECT_EQ(std::memcmp(one.data(), all.data() + i * n, one.size() * 2), 0) << i;
  }
}

}  // namespace
}  // namespace kernel_align
