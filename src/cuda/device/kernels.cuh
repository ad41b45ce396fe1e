// The CUDA backend's kernel bodies (docs/cuda-backend.md). Each is a struct with its
// launch arguments (Params, device/params.hpp), its shared memory (Shared) and
// `run(params, shared)`, a template on the Grid: CudaGrid on a device (cuda_backend.cu
// wraps run in a __global__ function), EmulatedGrid on the host in CI. The arithmetic is
// the contract headers' (include/kernel_align/contract/), nothing else.
//
// Two paths compute the same bytes:
// - generic: any even D up to 4096, any strides and alignment, any mix of dtypes; 16
//   threads per row, thread j owning lane j of the row tree (elements j, j + 16, ...),
//   scalar loads, the tree's halvings as shuffles xor 8, 4, 2, 1;
// - fast: D = 128, one dtype for every activation tensor, unit-stride rows that start on
//   a 4-element boundary; 4 threads per row, thread g owning lanes 4g .. 4g + 3 (the
//   elements 16m + 4g + l), so a row's 32 elements per thread come in 8 vector loads and
//   stay in registers; the halvings by 8 and 4 are shuffles xor 2 and 1, those by 2 and
//   1 happen in the thread. Both pairings keep a pair in one thread (2k, 2k + 1 in one
//   run of 4; k and k + 64 in runs m and m + 4).
//
// A row's every thread takes part in its shuffles (rows past the end compute on zeros
// and store nothing), and every barrier is reached by the whole block.
#pragma once

#include <cstdint>

#include "cuda/device/params.hpp"
#include "cuda/device/primitives.cuh"
#include "kernel_align/contract/rmsnorm.hpp"
#include "kernel_align/contract/rope.hpp"
#include "kernel_align/ops.hpp"

namespace kernel_align::cuda {

inline constexpr int kGenericRowThreads = 16;  // one lane of the row tree each
inline constexpr int kFastRowThreads = 4;      // four lanes each
inline constexpr int kFastD = 128;
inline constexpr int kFastRuns = kFastD / contract::kTreeLanes;  // runs of 4 per thread
inline constexpr unsigned kMaxBlockThreads = 256;
// Rows whose dw terms one chunk of a backward block adds, at most (fast path).
inline constexpr int kMaxChunkRows = kMaxBlockThreads / kFastRowThreads;

// ---- element helpers, shared by both paths --------------------------------------------

KA_DEVICE float load_element(const void* data, DType t, std::int64_t index) {
  return contract::load_f32(t, data, index);
}

// The weight as fp32 in shared memory, staged by the whole block (then a barrier).
template <class Grid>
KA_DEVICE void stage_weight(const WeightVector& w, int d, float* staged) {
  for (int i = static_cast<int>(Grid::thread()); i < d; i += static_cast<int>(Grid::threads())) {
    staged[i] = w.data == nullptr ? 1.0f : load_element(w.data, w.dtype, i * w.step);
  }
  Grid::sync();
}

// Pair k of a row and its two elements (contract section 4).
struct Pair {
  int k;
  int first;
  int second;
};

KA_DEVICE Pair pair_k(int k, int d, Pairing pairing) {
  return pairing == Pairing::Interleaved ? Pair{k, 2 * k, 2 * k + 1} : Pair{k, k, k + d / 2};
}

// The pair element i belongs to.
KA_DEVICE Pair pair_of(int i, int d, Pairing pairing) {
  const int half = d / 2;
  return pair_k(pairing == Pairing::Interleaved ? i / 2 : (i < half ? i : i - half), d, pairing);
}

// The generic path's output passes: thread j of a row writes the pairs k = j, j + 16, ...
// whole (RoPE and the fused ops) or the elements i = j, j + 16, ... (the norm): no other
// thread reads what it overwrites, so an output may be its own input (in place).
template <class PairStep>
KA_DEVICE void for_own_pairs(int j, int d, Pairing pairing, const PairStep& step) {
  for (int k = j; k < d / 2; k += kGenericRowThreads) step(pair_k(k, d, pairing));
}

KA_DEVICE contract::RotatedPair rotate(const Tables& t, std::int64_t table_row, int k, float a,
                                       float b) {
  const float c = t.cos[table_row * t.cos_row + k * t.cos_column];
  const float s = t.sin[table_row * t.sin_row + k * t.sin_column];
  return t.transpose ? contract::rope_rotate_transpose(a, b, c, s)
                     : contract::rope_rotate(a, b, c, s);
}

// The fused backward's dy of a pair: dq_out rotated back and rounded to dq_out's dtype
// (the intermediate of contract section 5).
KA_DEVICE contract::RotatedPair backward_dy_pair(const NormBackwardParams& p, std::int64_t dy_base,
                                                 std::int64_t table_row, const Pair& pair) {
  const float a = load_element(p.dy.data, p.dy.dtype, dy_base + pair.first * p.dy.step);
  const float b = load_element(p.dy.data, p.dy.dtype, dy_base + pair.second * p.dy.step);
  const contract::RotatedPair r = rotate(p.tables, table_row, pair.k, a, b);
  return {contract::round_through(p.dy.dtype, r.first),
          contract::round_through(p.dy.dtype, r.second)};
}

// The dy the norm's backward reads: the tensor itself, or the fused op's intermediate.
KA_DEVICE float backward_dy(const NormBackwardParams& p, std::int64_t dy_base,
                            std::int64_t table_row, int i) {
  if (!p.rope) return load_element(p.dy.data, p.dy.dtype, dy_base + i * p.dy.step);
  const Pair pair = pair_of(i, p.d, p.tables.pairing);
  const contract::RotatedPair g = backward_dy_pair(p, dy_base, table_row, pair);
  return i == pair.first ? g.first : g.second;
}

// The fast path's rotation of a thread's 32 elements of a row, in place: pairs (2k, 2k+1)
// within a run of 4, or (k, k + 64) in runs m and m + 4.
KA_DEVICE void rotate_fast_row(const Tables& tables, std::int64_t table_row, int g,
                               float (&v)[kFastRuns][4]) {
  if (tables.pairing == Pairing::Interleaved) {
    KA_UNROLL
    for (int m = 0; m < kFastRuns; ++m) {
      KA_UNROLL
      for (int l = 0; l < 4; l += 2) {
        const int k = (16 * m + 4 * g + l) / 2;
        const contract::RotatedPair r = rotate(tables, table_row, k, v[m][l], v[m][l + 1]);
        v[m][l] = r.first;
        v[m][l + 1] = r.second;
      }
    }
  } else {
    KA_UNROLL
    for (int m = 0; m < kFastRuns / 2; ++m) {
      KA_UNROLL
      for (int l = 0; l < 4; ++l) {
        const int k = 16 * m + 4 * g + l;
        const contract::RotatedPair r =
            rotate(tables, table_row, k, v[m][l], v[m + kFastRuns / 2][l]);
        v[m][l] = r.first;
        v[m + kFastRuns / 2][l] = r.second;
      }
    }
  }
}

// ---- qk_rmsnorm forward and the fused forward ------------------------------------------

// Generic: y_i = out(norm(x)_i), or for the fused op the rotation of each pair of
// RN_y(norm(x)) values.
template <class Grid>
struct NormForwardGeneric {
  using Params = StreamsParams<NormForwardParams>;
  struct Shared {
    float weight[kMaxHeadDim];
  };

  static KA_DEVICE void run(const Params& all, Shared& s) {
    const NormForwardParams& p = all.streams[Grid::block_y()];
    stage_weight<Grid>(p.weight, p.d, s.weight);
    const unsigned t = Grid::thread();
    const int j = static_cast<int>(t % kGenericRowThreads);
    const std::int64_t row =
        static_cast<std::int64_t>(Grid::block()) * (Grid::threads() / kGenericRowThreads) +
        t / kGenericRowThreads;
    const bool active = row < p.rows;
    const std::int64_t xb = active ? p.x.rows.offset(row) : 0;
    const auto x = [&](int i) { return load_element(p.x.data, p.x.dtype, xb + i * p.x.step); };
    float lane[1] = {0.0f};
    for (int i = j; active && i < p.d; i += kGenericRowThreads) {
      const float v = x(i);
      lane[0] = contract::add(lane[0], contract::mul(v, v));
    }
    const float rstd = contract::rms_rstd(group_tree_sum<Grid, 1>(lane), p.d, p.eps);
    if (!active) return;
    const DType weight_dtype = p.weight.data == nullptr ? DType::F32 : p.weight.dtype;
    const auto normalized = [&](int i) {
      return contract::rms_forward(x(i), rstd, s.weight[i], p.mode, weight_dtype);
    };
    const std::int64_t yb = p.y.rows.offset(row);
    const auto y = [&](int i, float v) {
      contract::store_output(p.y.dtype, p.y.data, yb + i * p.y.step, v);
    };
    if (!p.rope) {
      for (int i = j; i < p.d; i += kGenericRowThreads) y(i, normalized(i));
      return;
    }
    const std::int64_t table_row = p.tables.table_row(row);
    for_own_pairs(j, p.d, p.tables.pairing, [&](const Pair& pair) {
      const contract::RotatedPair r = rotate(
          p.tables, table_row, pair.k, contract::round_through(p.y.dtype, normalized(pair.first)),
          contract::round_through(p.y.dtype, normalized(pair.second)));
      y(pair.first, r.first);
      y(pair.second, r.second);
    });
  }
};

// Fast: the same for D = 128 in dtype IO (x and y), the normalised value rounded
// through RoundTo before the weight multiplies it (F32: not at all; diffusers mode with
// a bf16 or fp16 weight: that dtype).
template <class Grid, DType IO, DType RoundTo>
struct NormForwardFast {
  using Params = StreamsParams<NormForwardParams>;
  struct Shared {
    float weight[kFastD];
  };
  static constexpr NormMode kMode = RoundTo == DType::F32 ? NormMode::Single : NormMode::Diffusers;

  static KA_DEVICE void run(const Params& all, Shared& s) {
    const NormForwardParams& p = all.streams[Grid::block_y()];
    stage_weight<Grid>(p.weight, kFastD, s.weight);
    const unsigned t = Grid::thread();
    const int g = static_cast<int>(t % kFastRowThreads);
    const std::int64_t row =
        static_cast<std::int64_t>(Grid::block()) * (Grid::threads() / kFastRowThreads) +
        t / kFastRowThreads;
    const bool active = row < p.rows;
    const std::int64_t xb = active ? p.x.rows.offset(row) : 0;
    float x[kFastRuns][4] = {};
    float lane[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    KA_UNROLL
    for (int m = 0; m < kFastRuns; ++m) {
      if (active) load4<IO>(p.x.data, xb + 16 * m + 4 * g, x[m]);
      KA_UNROLL
      for (int l = 0; l < 4; ++l) lane[l] = contract::add(lane[l], contract::mul(x[m][l], x[m][l]));
    }
    const float rstd = contract::rms_rstd(group_tree_sum<Grid, 4>(lane), kFastD, p.eps);
    if (!active) return;
    float y[kFastRuns][4];
    KA_UNROLL
    for (int m = 0; m < kFastRuns; ++m) {
      KA_UNROLL
      for (int l = 0; l < 4; ++l) {
        y[m][l] =
            contract::rms_forward(x[m][l], rstd, s.weight[16 * m + 4 * g + l], kMode, RoundTo);
      }
    }
    if (p.rope) {  // the fused op: the intermediate in y's dtype, rotated
      KA_UNROLL
      for (int m = 0; m < kFastRuns; ++m) {
        KA_UNROLL
        for (int l = 0; l < 4; ++l) y[m][l] = contract::round_through(IO, y[m][l]);
      }
      rotate_fast_row(p.tables, p.tables.table_row(row), g, y);
    }
    const std::int64_t yb = p.y.rows.offset(row);
    KA_UNROLL
    for (int m = 0; m < kFastRuns; ++m) store4<IO>(p.y.data, yb + 16 * m + 4 * g, y[m]);
  }
};

// ---- multi_axis_rope ---------------------------------------------------------------

template <class Grid>
struct RopeGeneric {
  using Params = RopeParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    const unsigned t = Grid::thread();
    const std::int64_t row =
        static_cast<std::int64_t>(Grid::block()) * (Grid::threads() / kGenericRowThreads) +
        t / kGenericRowThreads;
    if (row >= p.rows) return;
    const std::int64_t ib = p.in.rows.offset(row);
    const std::int64_t ob = p.out.rows.offset(row);
    const std::int64_t table_row = p.tables.table_row(row);
    for_own_pairs(
        static_cast<int>(t % kGenericRowThreads), p.d, p.tables.pairing, [&](const Pair& pair) {
          const contract::RotatedPair r =
              rotate(p.tables, table_row, pair.k,
                     load_element(p.in.data, p.in.dtype, ib + pair.first * p.in.step),
                     load_element(p.in.data, p.in.dtype, ib + pair.second * p.in.step));
          contract::store_output(p.out.dtype, p.out.data, ob + pair.first * p.out.step, r.first);
          contract::store_output(p.out.dtype, p.out.data, ob + pair.second * p.out.step, r.second);
        });
  }
};

template <class Grid, DType IO>
struct RopeFast {
  using Params = RopeParams;
  struct Shared {};

  static KA_DEVICE void run(const Params& p, Shared&) {
    const unsigned t = Grid::thread();
    const int g = static_cast<int>(t % kFastRowThreads);
    const std::int64_t row =
        static_cast<std::int64_t>(Grid::block()) * (Grid::threads() / kFastRowThreads) +
        t / kFastRowThreads;
    if (row >= p.rows) return;
    const std::int64_t ib = p.in.rows.offset(row);
    float v[kFastRuns][4];
    KA_UNROLL
    for (int m = 0; m < kFastRuns; ++m) load4<IO>(p.in.data, ib + 16 * m + 4 * g, v[m]);
    rotate_fast_row(p.tables, p.tables.table_row(row), g, v);
    const std::int64_t ob = p.out.rows.offset(row);
    KA_UNROLL
    for (int m = 0; m < kFastRuns; ++m) store4<IO>(p.out.data, ob + 16 * m + 4 * g, v[m]);
  }
};

// ---- qk_rmsnorm backward and the fused backward ------------------------------------

// Where a chunk's rows are, for the dw pass: what the column threads need of each row.
struct ChunkRows {
  float rstd[kMaxChunkRows];
  std::int64_t x_base[kMaxChunkRows];
  std::int64_t dy_base[kMaxChunkRows];
  std::int64_t table_row[kMaxChunkRows];
};

// The dw pass over one chunk of `count` rows: column c's running block sum adds, in
// row order, dy * (the normalised value the forward multiplied by the weight).
template <class Grid>
KA_DEVICE void add_chunk_dw_terms(const NormBackwardParams& p, const ChunkRows& chunk, int count,
                                  float* block_sum) {
  const DType weight_dtype = p.weight.data == nullptr ? DType::F32 : p.weight.dtype;
  for (int c = static_cast<int>(Grid::thread()); c < p.d; c += static_cast<int>(Grid::threads())) {
    float sum = block_sum[c];
    for (int r = 0; r < count; ++r) {
      const float x = load_element(p.x.data, p.x.dtype, chunk.x_base[r] + c * p.x.step);
      const float n = contract::rms_normalized(x, chunk.rstd[r], p.mode, weight_dtype);
      sum = contract::add(
          sum, contract::mul(backward_dy(p, chunk.dy_base[r], chunk.table_row[r], c), n));
    }
    block_sum[c] = sum;
  }
}

// The shape of a backward launch, the same for both paths. Each row is computed in two
// steps: compute(row, active) finds its constants (rstd, coef: two row trees) reading
// only, store(row, active) writes its dx. Without dw, one row per row group and the grid
// over the rows. By dw blocks (when a stream of the launch computes dw), thread block b
// computes the contract's dw block b (rows [256b, 256b + 256)) in chunks of one row per
// group; with partials, between a chunk's two steps the block adds the chunk's dw terms
// in row order (behind a barrier on each side, and before dx is written: dx may be x or
// dy itself), and at the end writes its block sums to partials[b].
template <class Grid, class Shared, class Compute, class Store>
KA_DEVICE void backward_rows(const NormBackwardParams& p, Shared& s, int row_threads,
                             const Compute& compute, const Store& store) {
  const unsigned t = Grid::thread();
  const int groups = static_cast<int>(Grid::threads()) / row_threads;
  const int group = static_cast<int>(t) / row_threads;
  if (!p.by_dw_blocks) {
    const std::int64_t row = static_cast<std::int64_t>(Grid::block()) * groups + group;
    compute(row, row < p.rows);
    store(row, row < p.rows);
    return;
  }
  const std::int64_t block = Grid::block();
  if (block >= contract::dw_block_count(p.rows)) return;  // the whole thread block
  const std::int64_t end = contract::dw_block_end(p.rows, block);
  for (int c = static_cast<int>(t); c < p.d; c += static_cast<int>(Grid::threads())) {
    s.block_sum[c] = 0.0f;
  }
  for (std::int64_t first = contract::dw_block_begin(p.rows, block); first < end; first += groups) {
    const std::int64_t row = first + group;
    compute(row, row < end);
    if (p.partials != nullptr) {  // uniform over the block: no barrier is skipped by some
      Grid::sync();               // the chunk's rows are known; the last chunk's dx are written
      const std::int64_t rows_here = end - first < groups ? end - first : groups;
      add_chunk_dw_terms<Grid>(p, s.chunk, static_cast<int>(rows_here), s.block_sum);
      Grid::sync();  // the terms are read: dx may overwrite x or dy; s.chunk is free
    }
    store(row, row < end);
  }
  if (p.partials == nullptr) return;
  for (int c = static_cast<int>(t); c < p.d; c += static_cast<int>(Grid::threads())) {
    p.partials[block * p.d + c] = s.block_sum[c];
  }
}

// Records a chunk row for the dw pass (by the row's first thread).
KA_DEVICE void note_chunk_row(ChunkRows& chunk, int group, float rstd, std::int64_t x_base,
                              std::int64_t dy_base, std::int64_t table_row) {
  chunk.rstd[group] = rstd;
  chunk.x_base[group] = x_base;
  chunk.dy_base[group] = dy_base;
  chunk.table_row[group] = table_row;
}

// Where a backward row is in each tensor.
struct BackwardRow {
  std::int64_t x = 0, dy = 0, table = 0;
};

KA_DEVICE BackwardRow backward_row(const NormBackwardParams& p, std::int64_t row, bool active) {
  if (!active) return {};
  return {p.x.rows.offset(row), p.dy.rows.offset(row), p.rope ? p.tables.table_row(row) : 0};
}

template <class Grid>
struct NormBackwardGeneric {
  using Params = StreamsParams<NormBackwardParams>;
  struct Shared {
    float weight[kMaxHeadDim];
    float block_sum[kMaxHeadDim];
    ChunkRows chunk;
  };

  static KA_DEVICE void run(const Params& all, Shared& s) {
    const NormBackwardParams& p = all.streams[Grid::block_y()];
    stage_weight<Grid>(p.weight, p.d, s.weight);
    const int j = static_cast<int>(Grid::thread() % kGenericRowThreads);
    const int group = static_cast<int>(Grid::thread() / kGenericRowThreads);
    BackwardRow at;
    contract::RmsBackwardRow constants{};
    const auto x = [&](int i) { return load_element(p.x.data, p.x.dtype, at.x + i * p.x.step); };
    const auto compute = [&](std::int64_t row, bool active) {
      at = backward_row(p, row, active);
      float squares[1] = {0.0f};
      float dots[1] = {0.0f};
      for (int i = j; active && i < p.d; i += kGenericRowThreads) {
        const float v = x(i);
        squares[0] = contract::add(squares[0], contract::mul(v, v));
        const float g = contract::mul(backward_dy(p, at.dy, at.table, i), s.weight[i]);
        dots[0] = contract::add(dots[0], contract::mul(g, v));
      }
      constants = contract::rms_backward_constants(
          contract::rms_rstd(group_tree_sum<Grid, 1>(squares), p.d, p.eps),
          group_tree_sum<Grid, 1>(dots), p.d);
      if (active && j == 0 && p.partials != nullptr) {
        note_chunk_row(s.chunk, group, constants.rstd, at.x, at.dy, at.table);
      }
    };
    const auto store = [&](std::int64_t row, bool active) {
      if (!active) return;
      const std::int64_t dxb = p.dx.rows.offset(row);
      const auto dx = [&](int i, float dy) {
        contract::store_output(
            p.dx.dtype, p.dx.data, dxb + i * p.dx.step,
            contract::rms_backward_dx(x(i), contract::mul(dy, s.weight[i]), constants));
      };
      if (!p.rope) {
        for (int i = j; i < p.d; i += kGenericRowThreads) {
          dx(i, load_element(p.dy.data, p.dy.dtype, at.dy + i * p.dy.step));
        }
        return;
      }
      for_own_pairs(j, p.d, p.tables.pairing, [&](const Pair& pair) {
        const contract::RotatedPair g = backward_dy_pair(p, at.dy, at.table, pair);
        dx(pair.first, g.first);
        dx(pair.second, g.second);
      });
    };
    backward_rows<Grid>(p, s, kGenericRowThreads, compute, store);
  }
};

template <class Grid, DType IO, DType RoundTo>
struct NormBackwardFast {
  using Params = StreamsParams<NormBackwardParams>;
  struct Shared {
    float weight[kFastD];
    float block_sum[kFastD];
    ChunkRows chunk;
  };

  static KA_DEVICE void run(const Params& all, Shared& s) {
    const NormBackwardParams& p = all.streams[Grid::block_y()];
    stage_weight<Grid>(p.weight, kFastD, s.weight);
    const int g = static_cast<int>(Grid::thread() % kFastRowThreads);
    const int group = static_cast<int>(Grid::thread() / kFastRowThreads);
    // A row's 32 elements of this thread, kept in registers from compute to store.
    float x[kFastRuns][4];
    float grad[kFastRuns][4];  // dy (the fused op: its intermediate), then g = dy * w
    contract::RmsBackwardRow constants{};
    const auto compute = [&](std::int64_t row, bool active) {
      const BackwardRow at = backward_row(p, row, active);
      KA_UNROLL
      for (int m = 0; m < kFastRuns; ++m) {
        KA_UNROLL
        for (int l = 0; l < 4; ++l) x[m][l] = grad[m][l] = 0.0f;
        if (active) {
          load4<IO>(p.x.data, at.x + 16 * m + 4 * g, x[m]);
          load4<IO>(p.dy.data, at.dy + 16 * m + 4 * g, grad[m]);
        }
      }
      if (p.rope && active) {
        rotate_fast_row(p.tables, at.table, g, grad);
        KA_UNROLL
        for (int m = 0; m < kFastRuns; ++m) {
          KA_UNROLL
          for (int l = 0; l < 4; ++l) grad[m][l] = contract::round_through(IO, grad[m][l]);
        }
      }
      float squares[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      float dots[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      KA_UNROLL
      for (int m = 0; m < kFastRuns; ++m) {
        KA_UNROLL
        for (int l = 0; l < 4; ++l) {
          grad[m][l] = contract::mul(grad[m][l], s.weight[16 * m + 4 * g + l]);
          squares[l] = contract::add(squares[l], contract::mul(x[m][l], x[m][l]));
          dots[l] = contract::add(dots[l], contract::mul(grad[m][l], x[m][l]));
        }
      }
      constants = contract::rms_backward_constants(
          contract::rms_rstd(group_tree_sum<Grid, 4>(squares), kFastD, p.eps),
          group_tree_sum<Grid, 4>(dots), kFastD);
      if (active && g == 0 && p.partials != nullptr) {
        note_chunk_row(s.chunk, group, constants.rstd, at.x, at.dy, at.table);
      }
    };
    const auto store = [&](std::int64_t row, bool active) {
      if (!active) return;
      const std::int64_t dxb = p.dx.rows.offset(row);
      KA_UNROLL
      for (int m = 0; m < kFastRuns; ++m) {
        float dx[4];
        KA_UNROLL
        for (int l = 0; l < 4; ++l)
          dx[l] = contract::rms_backward_dx(x[m][l], grad[m][l], constants);
        store4<IO>(p.dx.data, dxb + 16 * m + 4 * g, dx);
      }
    };
    backward_rows<Grid>(p, s, kFastRowThreads, compute, store);
  }
};

// dw_i = RN_dw(block sums added in block order from +0), one thread per column.
template <class Grid>
struct FinishDw {
  using Params = StreamsParams<FinishDwParams>;
  struct Shared {};

  static KA_DEVICE void run(const Params& all, Shared&) {
    const FinishDwParams& p = all.streams[Grid::block_y()];
    const std::int64_t c =
        static_cast<std::int64_t>(Grid::block()) * Grid::threads() + Grid::thread();
    if (c >= p.d) return;
    float total = 0.0f;
    for (std::int64_t b = 0; b < p.blocks; ++b)
      total = contract::add(total, p.partials[b * p.d + c]);
    contract::store_output(p.dtype, p.dw, c * p.step, total);
  }
};

}  // namespace kernel_align::cuda
