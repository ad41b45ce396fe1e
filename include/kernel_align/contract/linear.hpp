// The reduction of `linear` (y = x w^T + b): the order in which the R products of one
// output element are summed (docs/contract.md, "Linear (GEMM)"), tree id
// "linear-tree-v1".
//
// - Leaves: 32 consecutive r. Leaf j covers r in [32j, min(32j + 32, R)); its value is
//   acc = +0, then acc = fma(A[m,r], B[r,n], acc) for each of its r in increasing order,
//   one correctly rounded fma each (the one place the contract uses fma: it is what
//   every GEMM instruction set computes at full speed).
// - n_leaves = ceil(R/32) = 2^a * q, q odd. Leaves form 2^a groups of q consecutive
//   leaves; a group is the binary-counter pairwise sum of its leaves (push each leaf;
//   while the two newest entries have the same size, replace them by add(older,
//   newer); after its last leaf fold the entries from the newest: acc = newest, then
//   acc = add(entry below, acc)). S is the perfect binary tree over the 2^a groups.
//
// The shape depends on R alone (never on M, N, threads or ISA). A tensor-parallel
// shard of R/P consecutive r (P a power of two dividing 2^a, R/P a multiple of 32) has
// the same q and 2^a/P groups, exactly a subtree: combining the P shard sums in a
// perfect binary tree gives the unsharded S (linear_shards_reproduce,
// linear_combine_shards). Streaming needs one entry per set bit of two binary counters,
// at most linear_tree_depth(R) partial values at once.
#pragma once

#include <cstdint>

#include "kernel_align/contract/activation.hpp"
#include "kernel_align/contract/float_ops.hpp"

namespace kernel_align::contract {

inline constexpr int kLinearLeaf = 32;
inline constexpr const char* kLinearTreeId = "linear-tree-v1";

// One correctly rounded fused multiply-add, a * b + c: the same operation as the FMA
// instructions of x86 (vfmadd*), ARM and CUDA.
KA_HD static inline float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}

KA_HD static constexpr std::int64_t linear_leaf_count(std::int64_t r) {
  return (r + kLinearLeaf - 1) / kLinearLeaf;
}

KA_HD static constexpr std::int64_t linear_leaf_begin(std::int64_t leaf) {
  return leaf * kLinearLeaf;
}

KA_HD static constexpr std::int64_t linear_leaf_end(std::int64_t r, std::int64_t leaf) {
  const std::int64_t end = (leaf + 1) * kLinearLeaf;
  return end < r ? end : r;
}

// q: the odd part of the leaf count (1 for R = 0).
KA_HD static constexpr std::int64_t linear_group_leaves(std::int64_t r) {
  std::int64_t leaves = linear_leaf_count(r);
  if (leaves == 0) return 1;
  while (leaves % 2 == 0) leaves /= 2;
  return leaves;
}

// 2^a: the number of groups (0 for R = 0).
KA_HD static constexpr std::int64_t linear_group_count(std::int64_t r) {
  return linear_leaf_count(r) / linear_group_leaves(r);
}

KA_HD static constexpr int linear_bit_width(std::int64_t v) {
  int width = 0;
  for (; v > 0; v /= 2) ++width;
  return width;
}

// The most partial values the streaming sum holds at once: at most bit_width(q) within
// the current group plus bit_width(2^a) completed groups, and bit_width(q) +
// bit_width(2^a) <= bit_width(n_leaves) + 1.
KA_HD static constexpr int linear_tree_depth(std::int64_t r) {
  return linear_bit_width(linear_leaf_count(r)) + 1;
}

KA_HD static constexpr int linear_trailing_zeros(std::int64_t v) {
  int zeros = 0;
  for (; v > 0 && v % 2 == 0; v /= 2) ++zeros;
  return zeros;
}

KA_HD static constexpr int linear_popcount(std::int64_t v) {
  int ones = 0;
  for (; v > 0; v /= 2) ones += static_cast<int>(v % 2);
  return ones;
}

// The tree as a schedule over one stack of partial values. After leaf j's value v is
// computed, `merges_after_leaf` entries are popped one by one, newest first, each as
// v = add(entry, v); then v is pushed. After the last leaf the stack holds S alone.
// Every merge of the tree (binary counter inside a group, the fold at a group's end,
// binary counter over groups) is such an add(older, newer), in this order; group
// entries (sizes q 2^i) never meet leaf entries (sizes 2^i < q) of the open group.
class LinearTreeSchedule {
 public:
  KA_HD explicit constexpr LinearTreeSchedule(std::int64_t r)
      : group_leaves_(linear_group_leaves(r)) {}

  // Pops after the next leaf; call once per leaf, in leaf order.
  KA_HD constexpr int merges_after_leaf() {
    ++leaves_in_group_;
    int merges = linear_trailing_zeros(leaves_in_group_);
    if (leaves_in_group_ == group_leaves_) {
      // Fold the group's popcount(q) entries into one, then count one more group.
      merges += linear_popcount(group_leaves_) - 1;
      ++groups_;
      merges += linear_trailing_zeros(groups_);
      leaves_in_group_ = 0;
    }
    return merges;
  }

 private:
  std::int64_t group_leaves_;
  std::int64_t leaves_in_group_ = 0;
  std::int64_t groups_ = 0;
};

// The streaming sum over any value type: Value is float for scalar code, or a tile of
// lanes; `Add(older, newer)` returns their lane-wise contract add. Holds at most
// kMaxDepth values (linear_tree_depth(R) <= kMaxDepth; 34 covers R < 2^36).
template <class Value, class Add, int kMaxDepth = 34>
class LinearTreeAccumulator {
 public:
  KA_HD LinearTreeAccumulator(std::int64_t r, const Add& add_values)
      : schedule_(r), add_(add_values) {}

  KA_HD void push_leaf(Value leaf) {
    for (int merges = schedule_.merges_after_leaf(); merges > 0; --merges) {
      // The schedule pops only entries pushed before (the analyzer cannot follow it).
      leaf = add_(stack_[--depth_], leaf);  // NOLINT(clang-analyzer-core.CallAndMessage)
    }
    stack_[depth_++] = leaf;
  }

  // S after the last leaf; `empty` (the +0 of Value) for R = 0.
  KA_HD Value result(Value empty) const { return depth_ == 0 ? empty : stack_[0]; }

  KA_HD int depth() const { return depth_; }

 private:
  LinearTreeSchedule schedule_;
  Add add_;
  Value stack_[kMaxDepth];
  int depth_ = 0;
};

// One leaf of one output element: term(r) returns the pair (A[m,r], B[r,n]).
template <class Operands>
KA_HD static inline float linear_leaf(std::int64_t r, std::int64_t leaf, const Operands& operands) {
  float acc = 0.0f;
  for (std::int64_t k = linear_leaf_begin(leaf); k < linear_leaf_end(r, leaf); ++k) {
    const auto [a, b] = operands(k);
    acc = fma_rn(a, b, acc);
  }
  return acc;
}

struct LinearAddFloats {
  KA_HD float operator()(float older, float newer) const { return add(older, newer); }
};

// S of one output element over r in [0, R).
template <class Operands>
KA_HD static inline float linear_sum(std::int64_t r, const Operands& operands) {
  LinearTreeAccumulator<float, LinearAddFloats> sum(r, LinearAddFloats{});
  for (std::int64_t leaf = 0; leaf < linear_leaf_count(r); ++leaf) {
    sum.push_leaf(linear_leaf(r, leaf, operands));
  }
  return sum.result(0.0f);
}

// Whether P shards of R/P consecutive r, each summed by this tree with R' = R/P and
// combined by linear_combine_shards, give the unsharded S bit for bit: P a power of
// two dividing 2^a (the group count), and R/P a multiple of the leaf.
KA_HD static constexpr bool linear_shards_reproduce(std::int64_t r, std::int64_t p) {
  if (r <= 0 || p <= 0 || (p & (p - 1)) != 0 || r % p != 0) return false;
  if ((r / p) % kLinearLeaf != 0) return false;
  return linear_group_count(r) % p == 0;
}

inline constexpr int kLinearMaxShards = 64;

// The perfect binary tree over P = 1, 2, 4, ..., 64 shard sums, shard 0 first: the top
// log2(P) levels of the unsharded tree.
KA_HD static inline float linear_combine_shards(const float* partials, int p) {
  float level[kLinearMaxShards];
  for (int i = 0; i < p; ++i) level[i] = partials[i];
  for (int width = 1; width < p; width *= 2) {
    for (int i = 0; i + width < p; i += 2 * width) level[i] = add(level[i], level[i + width]);
  }
  return level[0];
}

// The output element before its rounding to C's dtype: S, plus the bias (already
// widened to fp32) when there is one (without one S is kept as it is, -0 included), then
// the activation.
KA_HD static inline float linear_output(float sum, const float* bias, Activation activation) {
  return activate(activation, bias != nullptr ? add(sum, *bias) : sum);
}

// The backward epilogue (linear_backward's dz): the activation's backward of grad_out at
// the pre-activation value S (+ bias), recomputed by the same tree as the forward's.
KA_HD static inline float linear_activation_grad(float sum, const float* bias,
                                                 Activation activation, float grad_out) {
  return activate_backward(activation, grad_out, bias != nullptr ? add(sum, *bias) : sum);
}

}  // namespace kernel_align::contract
