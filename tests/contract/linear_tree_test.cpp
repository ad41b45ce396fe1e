// The linear tree (contract/linear.hpp): its shape against a recursive definition,
// exactness on small integers, the depth bound, and tensor-parallel shard reproduction.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "kernel_align/contract/linear.hpp"

namespace kernel_align::contract {
namespace {

// The tree written recursively, apart from the streaming code: a perfect tree over
// 2^a groups, each the binary-counter sum of q leaves, which is the perfect tree of its
// largest power-of-two prefix plus (add) the counter sum of the rest.
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

float recursive_sum(const std::vector<float>& leaves) {
  if (leaves.empty()) return 0.0f;
  std::size_t q = leaves.size();
  while (q % 2 == 0) q /= 2;
  std::vector<float> groups;
  for (std::size_t g = 0; g < leaves.size(); g += q) groups.push_back(counter(leaves, g, q));
  return perfect(groups, 0, groups.size());
}

float streamed_sum(const std::vector<float>& leaves) {
  LinearTreeAccumulator<float, LinearAddFloats> sum(
      static_cast<std::int64_t>(leaves.size()) * kLinearLeaf, LinearAddFloats{});
  for (float leaf : leaves) sum.push_leaf(leaf);
  return sum.result(0.0f);
}

// Values whose sums round differently in different orders.
std::vector<float> spread_values(std::size_t count, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<float> v(count);
  for (float& x : v) x = std::ldexp(mantissa(rng), exponent(rng)) * (rng() % 2 ? 1.0f : -1.0f);
  return v;
}

TEST(LinearTree, ShapeFunctions) {
  EXPECT_EQ(linear_leaf_count(0), 0);
  EXPECT_EQ(linear_leaf_count(1), 1);
  EXPECT_EQ(linear_leaf_count(32), 1);
  EXPECT_EQ(linear_leaf_count(33), 2);
  EXPECT_EQ(linear_group_leaves(3072), 3);  // 96 leaves = 32 groups of 3
  EXPECT_EQ(linear_group_count(3072), 32);
  EXPECT_EQ(linear_group_leaves(3584), 7);  // 112 = 16 x 7
  EXPECT_EQ(linear_group_count(3584), 16);
  EXPECT_EQ(linear_group_leaves(100), 1);  // 4 leaves, the last of 4 products
  EXPECT_EQ(linear_leaf_end(100, 3), 100);
}

TEST(LinearTree, StreamingEqualsRecursiveDefinition) {
  for (std::size_t leaves = 1; leaves <= 300; ++leaves) {
    const std::vector<float> v = spread_values(leaves, static_cast<std::uint32_t>(leaves));
    const float streamed = streamed_sum(v);
    const float recursive = recursive_sum(v);
    EXPECT_EQ(bits_of(streamed), bits_of(recursive)) << leaves << " leaves";
  }
}

TEST(LinearTree, DepthStaysWithinBound) {
  for (std::int64_t leaves = 1; leaves <= 5000; ++leaves) {
    const std::int64_t r = leaves * kLinearLeaf;
    LinearTreeAccumulator<float, LinearAddFloats> sum(r, LinearAddFloats{});
    int deepest = 0;
    for (std::int64_t j = 0; j < leaves; ++j) {
      sum.push_leaf(1.0f);
      deepest = std::max(deepest, sum.depth());
    }
    ASSERT_LE(deepest, linear_tree_depth(r)) << leaves;
    ASSERT_EQ(sum.depth(), 1) << leaves;
    ASSERT_EQ(sum.result(0.0f), static_cast<float>(leaves));
  }
}

TEST(LinearTree, EmptySumIsPositiveZero) {
  const float s = linear_sum(0, [](std::int64_t) { return std::pair{1.0f, 1.0f}; });
  EXPECT_EQ(bits_of(s), 0u);
}

TEST(LinearTree, LeafStartsFromPositiveZero) {
  // fma(-1, +0, +0) = +0: the leaf's first fma adds +0, so -0 products become +0.
  const float s = linear_sum(5, [](std::int64_t) { return std::pair{-1.0f, 0.0f}; });
  EXPECT_EQ(bits_of(s), 0u);
}

TEST(LinearTree, ExactOnSmallIntegers) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> small(-50, 50);
  for (std::int64_t r : {1, 31, 32, 33, 100, 3072, 3584, 12288}) {
    std::vector<float> a(static_cast<std::size_t>(r)), b(a.size());
    long long exact = 0;
    for (std::size_t k = 0; k < a.size(); ++k) {
      a[k] = static_cast<float>(small(rng));
      b[k] = static_cast<float>(small(rng));
      exact += static_cast<long long>(a[k]) * static_cast<long long>(b[k]);
    }
    const float s = linear_sum(r, [&](std::int64_t k) { return std::pair{a[k], b[k]}; });
    EXPECT_EQ(s, static_cast<float>(exact)) << r;
  }
}

// Products with full-width mantissas, so that any other order or rounding shows.
float sum_of_range(const std::vector<float>& a, const std::vector<float>& b, std::int64_t first,
                   std::int64_t r) {
  return linear_sum(r, [&](std::int64_t k) { return std::pair{a[first + k], b[first + k]}; });
}

TEST(LinearTree, ShardsReproduceTheUnshardedSum) {
  for (std::int64_t r : {64, 256, 3072, 3584, 12288}) {
    const std::vector<float> a = spread_values(static_cast<std::size_t>(r), 1);
    const std::vector<float> b = spread_values(static_cast<std::size_t>(r), 2);
    const float whole = sum_of_range(a, b, 0, r);
    for (int p : {2, 4, 8}) {
      if (!linear_shards_reproduce(r, p)) {
        EXPECT_NE((r / p) % kLinearLeaf, 0) << r << " " << p;  // only refused for a split leaf
        continue;
      }
      std::vector<float> partials;
      for (int s = 0; s < p; ++s) partials.push_back(sum_of_range(a, b, s * (r / p), r / p));
      EXPECT_EQ(bits_of(linear_combine_shards(partials.data(), p)), bits_of(whole))
          << "R " << r << " P " << p;
    }
  }
  EXPECT_TRUE(linear_shards_reproduce(3072, 8));
  EXPECT_TRUE(linear_shards_reproduce(12288, 8));
  EXPECT_TRUE(linear_shards_reproduce(64, 2));
}

TEST(LinearTree, ShardPredicateRefuses) {
  EXPECT_FALSE(linear_shards_reproduce(64, 4));    // 16 per shard: a split leaf
  EXPECT_FALSE(linear_shards_reproduce(96, 2));    // 48 per shard
  EXPECT_FALSE(linear_shards_reproduce(288, 3));   // 9 leaves, q = 9: 3 does not divide 2^0
  EXPECT_FALSE(linear_shards_reproduce(3072, 6));  // not a power of two
  EXPECT_FALSE(linear_shards_reproduce(0, 2));
  EXPECT_FALSE(linear_shards_reproduce(100, 2));
  EXPECT_TRUE(linear_shards_reproduce(3072, 1));
}

TEST(LinearTree, CombineShardsIsAPerfectTree) {
  const std::vector<float> v = spread_values(8, 3);
  EXPECT_EQ(bits_of(linear_combine_shards(v.data(), 8)), bits_of(perfect(v, 0, 8)));
  EXPECT_EQ(bits_of(linear_combine_shards(v.data(), 4)), bits_of(perfect(v, 0, 4)));
  EXPECT_EQ(bits_of(linear_combine_shards(v.data(), 1)), bits_of(v[0]));
}

}  // namespace
}  // namespace kernel_align::contract
