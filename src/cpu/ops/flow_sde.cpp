// Flow-GRPO's SDE step and its log-probability on the CPU: rows through the selected GEMM
// path's vector kernels (cpu/gemm/flow_sde_simd.hpp); the elementwise passes split over
// the pool by rows, the log-probability's by samples (each sample's tree summed by one
// thread: its distances streamed through a chunk buffer, whole leaves summed a leaf per
// lane, the leaves pushed into linear's tree in order; where the samples are fewer than the
// threads, each in parts that are subtrees of its tree, combined in the tree's order). A row
// with a non-unit stride goes element by element through the same kernels.
#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "cpu/cpu_backend.hpp"
#include "cpu/gemm/gemm.hpp"
#include "cpu/pool_passes.hpp"
#include "kernel_align/contract/flow_sde.hpp"

namespace kernel_align::cpu {
namespace {

// The rows of one tensor argument (absent: never read or written).
class RowSource {
 public:
  RowSource() = default;
  explicit RowSource(const ConstTensorView& v)
      : data_(static_cast<const char*>(v.data)),
        rows_(v),
        step_(v.strides[v.rank - 1]),
        size_(static_cast<std::int64_t>(dtype_size(v.dtype))),
        dtype_(v.dtype),
        dense_(row_major(v)) {}
  bool unit() const { return data_ == nullptr || step_ == 1; }
  // Whether consecutive rows follow each other in memory (row-major, unit stride).
  bool dense() const { return data_ == nullptr || dense_; }
  DType dtype() const { return dtype_; }
  const void* at(std::int64_t r, std::int64_t i) const {
    if (data_ == nullptr) return nullptr;
    return data_ + (rows_.offset(r) + i * step_) * size_;
  }

 private:
  static bool row_major(const ConstTensorView& v) {
    std::int64_t expected = 1;
    for (int i = v.rank - 1; i >= 0; --i) {
      if (v.shape[i] != 1 && v.strides[i] != expected) return false;
      expected *= v.shape[i];
    }
    return true;
  }

  const char* data_ = nullptr;
  detail::RowIndexer rows_;
  std::int64_t step_ = 1, size_ = 4;
  DType dtype_ = DType::F32;
  bool dense_ = false;
};

RowSource source(const TensorView& v) {
  return v.data != nullptr ? RowSource(ConstTensorView(v)) : RowSource();
}

// The five roles of a FlowSdeRow: x, v, the third input, out0, out1.
struct RowSources {
  RowSource x, v, third, out0, out1;

  bool unit() const { return x.unit() && v.unit() && third.unit() && out0.unit() && out1.unit(); }
  bool dense() const {
    return x.dense() && v.dense() && third.dense() && out0.dense() && out1.dense();
  }
  // The row's elements [i, i + count).
  FlowSdeRow row(FlowSdeRow r, std::int64_t row_index, std::int64_t i, std::int64_t count) const {
    r.x = x.at(row_index, i);
    r.v = v.at(row_index, i);
    r.third = third.at(row_index, i);
    r.out0 = const_cast<void*>(out0.at(row_index, i));
    r.out1 = const_cast<void*>(out1.at(row_index, i));
    r.count = count;
    r.x_dtype = x.dtype();
    r.v_dtype = v.dtype();
    r.third_dtype = third.dtype();
    r.out0_dtype = out0.dtype();
    r.out1_dtype = out1.dtype();
    return r;
  }
  // Calls kernel(segment) over row `r` of length d: whole, or element by element when a
  // tensor's row is strided.
  template <class Kernel>
  void for_row(const FlowSdeRow& constants, std::int64_t r, std::int64_t d,
               const Kernel& kernel) const {
    if (unit()) {
      kernel(row(constants, r, 0, d));
      return;
    }
    for (std::int64_t i = 0; i < d; ++i) kernel(row(constants, r, i, 1));
  }
  // The same over rows [begin, end): one segment where every tensor is dense (no row
  // addressing per row: its divisions cost more than the row's arithmetic).
  template <class Kernel>
  void for_rows(const FlowSdeRow& constants, std::int64_t begin, std::int64_t end, std::int64_t d,
                const Kernel& kernel) const {
    if (dense()) {
      if (end > begin) kernel(row(constants, begin, 0, (end - begin) * d));
      return;
    }
    for (std::int64_t r = begin; r < end; ++r) for_row(constants, r, d, kernel);
  }
};

FlowSdeRow constants_of(const FlowSdeCoefficients& c) {
  FlowSdeRow r;
  r.x_scale = c.x_scale;
  r.v_scale = c.v_scale;
  r.noise_scale = c.noise_scale;
  return r;
}

int row_length(const ConstTensorView& v) {
  return static_cast<int>(v.shape[v.rank - 1]);
}

std::int64_t rows_per_sample(const ConstTensorView& v) {
  return detail::row_count(v) / v.shape[0];
}

// The selected path's kernels, noted in exec.
const FlowSdeKernels& path_kernels(registry::Execution& exec) {
  const Isa path = gemm_isa(isa());
  exec.isa = isa_name(path);
  return gemm_flow_sde_kernels(path);
}

void step_forward(const detail::FlowSdeStepProblem& p, registry::Execution& exec) {
  const FlowSdeKernels& kernels = path_kernels(exec);
  const RowSources s{RowSource(p.x), RowSource(p.v), RowSource(p.noise), source(p.prev), {}};
  const FlowSdeRow constants = constants_of(p.constants);
  const std::int64_t d = p.x.shape[p.x.rank - 1];
  for_rows(detail::row_count(p.x), row_length(p.x), exec,
           [&](RowRange range) { s.for_rows(constants, range.begin, range.end, d, kernels.step); });
}

void step_backward(const detail::FlowSdeStepBackwardProblem& p, registry::Execution& exec) {
  const FlowSdeKernels& kernels = path_kernels(exec);
  const RowSources s{{}, {}, RowSource(p.dprev), source(p.dx), source(p.dv)};
  const FlowSdeRow constants = constants_of(p.constants);
  const std::int64_t d = p.dprev.shape[p.dprev.rank - 1];
  for_rows(detail::row_count(p.dprev), row_length(p.dprev), exec, [&](RowRange range) {
    s.for_rows(constants, range.begin, range.end, d, kernels.step_grad);
  });
}

// Distances buffered before their leaves are summed: 128 leaves (16 KiB, in L1).
constexpr std::int64_t kChunkLeaves = 128;

// The linear tree's sum of the squares of n distances, which for_segments(visit) hands
// over as row segments in order (visit(segment) for each), a chunk at a time.
template <class Segments>
float sum_of_squares(const FlowSdeKernels& kernels, std::int64_t n, const Segments& for_segments) {
  constexpr std::int64_t kLeaf = contract::kLinearLeaf;
  constexpr std::int64_t kChunk = kChunkLeaves * kLeaf;
  thread_local std::vector<float> chunk, sums;
  chunk.resize(static_cast<std::size_t>(kChunk));
  sums.resize(static_cast<std::size_t>(kChunkLeaves));
  contract::LinearTreeAccumulator<float, contract::LinearAddFloats> tree(
      n, contract::LinearAddFloats{});
  std::int64_t filled = 0;
  // Sums the whole leaves of the chunk; the partial one moves to its front.
  const auto drain = [&] {
    const std::int64_t leaves = filled / kLeaf;
    kernels.leaf_sums(chunk.data(), leaves, sums.data());
    for (std::int64_t l = 0; l < leaves; ++l) tree.push_leaf(sums[static_cast<std::size_t>(l)]);
    const std::int64_t rest = filled - leaves * kLeaf;
    std::memmove(chunk.data(), chunk.data() + leaves * kLeaf,
                 static_cast<std::size_t>(rest) * sizeof(float));
    filled = rest;
  };
  for_segments([&](const FlowSdeRow& row) {
    for (std::int64_t i = 0; i < row.count;) {
      const std::int64_t count = std::min(row.count - i, kChunk - filled);
      FlowSdeRow part = row;
      part.count = count;
      const auto advance = [&](const void* p, DType t) {
        return p == nullptr ? p : static_cast<const char*>(p) + i * dtype_size(t);
      };
      part.x = advance(row.x, row.x_dtype);
      part.v = advance(row.v, row.v_dtype);
      part.third = advance(row.third, row.third_dtype);
      kernels.distances(part, chunk.data() + filled);
      filled += count;
      i += count;
      if (filled == kChunk) drain();
    }
  });
  drain();
  if (filled > 0) {  // the last, partial leaf
    float leaf = 0.0f;
    for (std::int64_t i = 0; i < filled; ++i) {
      leaf = contract::fma_rn(chunk[static_cast<std::size_t>(i)],
                              chunk[static_cast<std::size_t>(i)], leaf);
    }
    tree.push_leaf(leaf);
  }
  return tree.result(0.0f);
}

// Parts a sample is summed in: 1, or where the samples are fewer than the threads and the
// tensors dense, the most parts (a power of two up to the thread count) that the tree
// reproduces (contract::linear_shards_reproduce: each part a subtree, the parts combined
// in the tree's order by linear_combine_shards), so that one sample uses every thread.
std::int64_t parts_of_a_sample(std::int64_t samples, std::int64_t n, const RowSources& s) {
  std::int64_t parts = 1;
  if (!s.dense()) return parts;
  while (samples * parts * 2 <= num_threads() && parts * 2 <= contract::kLinearMaxShards &&
         contract::linear_shards_reproduce(n, parts * 2)) {
    parts *= 2;
  }
  return parts;
}

void logp_forward(const detail::FlowSdeLogpProblem& p, registry::Execution& exec) {
  const FlowSdeKernels& kernels = path_kernels(exec);
  const RowSources s{RowSource(p.x), RowSource(p.v), RowSource(p.prev), {}, {}};
  const FlowSdeRow constants = constants_of(p.constants);
  const std::int64_t samples = p.x.shape[0];
  const std::int64_t rows = rows_per_sample(p.x), d = p.x.shape[p.x.rank - 1], n = rows * d;
  const std::int64_t parts = parts_of_a_sample(samples, n, s);
  const std::int64_t m = n / parts;  // a part's elements
  thread_local std::vector<float> partials;
  partials.assign(static_cast<std::size_t>(samples * parts), 0.0f);
  float* const partial = partials.data();
  // A task per (sample, part), in ranges over the threads.
  for_rows(samples * parts, static_cast<int>(std::min<std::int64_t>(m, INT_MAX)), exec,
           [&](RowRange range) {
             for (std::int64_t t = range.begin; t < range.end; ++t) {
               const std::int64_t b = t / parts, part = t % parts;
               partial[t] = parts == 1 ? sum_of_squares(kernels, n,
                                                        [&](const auto& visit) {
                                                          s.for_rows(constants, b * rows,
                                                                     (b + 1) * rows, d, visit);
                                                        })
                                       : sum_of_squares(kernels, m, [&](const auto& visit) {
                                           visit(s.row(constants, b * rows, part * m, m));
                                         });
             }
           });
  for (std::int64_t b = 0; b < samples; ++b) {
    const float squares =
        parts == 1 ? partial[b]
                   : contract::linear_combine_shards(partial + b * parts, static_cast<int>(parts));
    contract::store_output(
        DType::F32, p.logp.data, b * p.logp.strides[0],
        contract::flow_sde_logp(squares, static_cast<float>(n), p.constants.inverse_two_variance,
                                p.constants.log_normalizer));
  }
}

void logp_backward(const detail::FlowSdeLogpBackwardProblem& p, registry::Execution& exec) {
  const FlowSdeKernels& kernels = path_kernels(exec);
  const RowSources s{RowSource(p.x), RowSource(p.v), RowSource(p.prev), source(p.dx), source(p.dv)};
  const FlowSdeRow constants = constants_of(p.constants);
  const std::int64_t rows = rows_per_sample(p.x), d = p.x.shape[p.x.rank - 1];
  const auto count = static_cast<float>(rows * d);
  const auto* dlogp = static_cast<const float*>(p.dlogp.data);
  for_rows(detail::row_count(p.x), row_length(p.x), exec, [&](RowRange range) {
    // The range's rows a sample at a time: each sample's factor g.
    for (std::int64_t r = range.begin; r < range.end;) {
      const std::int64_t sample = r / rows, end = std::min(range.end, (sample + 1) * rows);
      FlowSdeRow with_g = constants;
      with_g.grad_scale = contract::flow_sde_logp_grad_scale(
          dlogp[sample * p.dlogp.strides[0]], count, p.constants.inverse_two_variance);
      s.for_rows(with_g, r, end, d, kernels.logp_grad);
      r = end;
    }
  });
}

}  // namespace

void add_flow_sde_step_kernels(registry::Kernels& k) {
  k.set<OpType::FlowSdeStep, Direction::Forward>(step_forward);
  k.set<OpType::FlowSdeStep, Direction::Backward>(step_backward);
}

void add_flow_sde_logp_kernels(registry::Kernels& k) {
  k.set<OpType::FlowSdeLogp, Direction::Forward>(logp_forward);
  k.set<OpType::FlowSdeLogp, Direction::Backward>(logp_backward);
}

}  // namespace kernel_align::cpu
