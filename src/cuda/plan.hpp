// From a validated problem (api/problems.hpp) to the CUDA backend's launches: which
// kernel and path, its arguments, its launch configuration. The configuration is a pure
// function of the problem (shapes, strides, dtypes, alignment: never the device or the
// load), and no choice it makes changes a result bit: every row is computed by the same
// arithmetic whatever the block size, the number of rows or the path.
//
// The launches go to an Executor, so the same plan runs on a GPU (cuda_backend.cu) and
// through the grid emulator in the tests. An Executor provides
//   template <template <class> class Kernel>
//   void launch(const registry::LaunchRecord&, const typename Kernel<Grid>::Params&);
//   float* scratch_floats(std::size_t count);    // device memory for this call
//   std::uint64_t* scratch_digests(std::size_t count);
//   std::int64_t* scratch_indices(std::size_t count);
//   void copy_to_host(void* host, const void* device, std::size_t bytes);  // waits
//   void zero(const TensorView& vector);         // a [D] output set to +0
//   const float* one();                          // device memory holding 1.0f (this call)
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "api/gemm_problem.hpp"
#include "cuda/device/digest.cuh"
#include "cuda/device/gemm_kernel.cuh"
#include "cuda/device/kernels.cuh"
#include "kernel_align/error.hpp"
#include "registry/registry.hpp"

namespace kernel_align::cuda::plan {

// Calls at and above this many rows use blocks of 256 threads on the fast path, smaller
// ones 128 (more blocks, spread over more multiprocessors). A threshold the tests cross.
inline constexpr std::int64_t kLargeCallRows = 16384;
inline constexpr unsigned kFinishThreads = 128;
inline constexpr unsigned kDigestThreads = 256;
inline constexpr std::int64_t kMaxGridX = 2147483647;

// ---- arguments ---------------------------------------------------------------------

inline RowTensor row_tensor(const ConstTensorView& v) {
  return {v.data, v.dtype, detail::RowIndexer(v), v.strides[v.rank - 1]};
}

inline OutRowTensor out_row_tensor(const TensorView& v) {
  return {v.data, v.dtype, detail::RowIndexer(v), v.strides[v.rank - 1]};
}

inline WeightVector weight_vector(const std::optional<ConstTensorView>& w) {
  if (!w) return {};
  return {w->data, w->dtype, w->strides[0]};
}

// The tables of the rows of the 4-D view `rows_of` (its dims 1 and 2 give a row's
// sequence index in `layout`).
inline Tables tables_of(const ConstTensorView& cos, const ConstTensorView& sin,
                        const ConstTensorView& rows_of, std::int64_t seq_offset,
                        const RopeOptions& options, bool transpose) {
  Tables t;
  t.cos = static_cast<const float*>(cos.data);
  t.sin = static_cast<const float*>(sin.data);
  t.cos_row = cos.strides[0];
  t.cos_column = cos.strides[1];
  t.sin_row = sin.strides[0];
  t.sin_column = sin.strides[1];
  t.seq_offset = seq_offset;
  t.dim1 = rows_of.shape[1];
  t.dim2 = rows_of.shape[2];
  t.layout = options.layout;
  t.pairing = options.pairing;
  t.transpose = transpose;
  return t;
}

// ---- paths and launch configurations -------------------------------------------------

// The fast path's demand on a tensor: rows of D = 128 unit-stride elements, each row
// starting on a 4-element (one vector) boundary.
inline bool fast_rows(const ConstTensorView& v) {
  if (v.shape[v.rank - 1] != kFastD || v.strides[v.rank - 1] != 1) return false;
  const auto quad_bytes = 4 * dtype_size(v.dtype);
  if (reinterpret_cast<std::uintptr_t>(v.data) % quad_bytes != 0) return false;
  for (int i = 0; i < v.rank - 1; ++i) {
    if (v.shape[i] > 1 && v.strides[i] % 4 != 0) return false;
  }
  return true;
}

// Every tensor on the fast path, all of one dtype.
inline bool fast_tensors(std::initializer_list<ConstTensorView> views) {
  const DType first = views.begin()->dtype;
  for (const ConstTensorView& v : views) {
    if (v.dtype != first || !fast_rows(v)) return false;
  }
  return true;
}

// What the forward rounds the normalised value through: the weight's dtype in diffusers
// mode, nothing otherwise (F32). A compile-time parameter of the fast kernels.
inline DType rounding(NormMode mode, const std::optional<ConstTensorView>& weight) {
  return mode == NormMode::Diffusers && weight ? weight->dtype : DType::F32;
}

inline unsigned to_grid(std::int64_t blocks) {
  if (blocks > kMaxGridX) {
    throw Error("rows", "at most " + std::to_string(kMaxGridX) + " thread blocks of rows",
                std::to_string(blocks));
  }
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

// One row per row group; the grid covers `rows`.
inline registry::LaunchRecord row_launch(const char* kernel, std::int64_t rows, bool fast,
                                         unsigned streams = 1) {
  registry::LaunchRecord l;
  l.kernel = kernel;
  l.path = fast ? "fast" : "generic";
  const unsigned threads = fast ? (rows >= kLargeCallRows ? 256u : 128u) : kMaxBlockThreads;
  l.rows_per_block = static_cast<int>(threads) / (fast ? kFastRowThreads : kGenericRowThreads);
  l.block = {threads, 1, 1};
  l.grid = {to_grid((rows + l.rows_per_block - 1) / l.rows_per_block), streams, 1};
  return l;
}

// One thread block per dw block of the contract (kDwBlockRows rows).
inline registry::LaunchRecord dw_block_launch(const char* kernel, std::int64_t rows, bool fast,
                                              unsigned streams = 1) {
  registry::LaunchRecord l;
  l.kernel = kernel;
  l.path = fast ? "fast" : "generic";
  l.block = {kMaxBlockThreads, 1, 1};
  l.rows_per_block = contract::kDwBlockRows;
  l.grid = {to_grid(contract::dw_block_count(rows)), streams, 1};
  return l;
}

// Calls f(std::integral_constant<DType, t>{}).
template <class F>
void with_dtype(DType t, const F& f) {
  switch (t) {
    case DType::F32:
      return f(std::integral_constant<DType, DType::F32>{});
    case DType::BF16:
      return f(std::integral_constant<DType, DType::BF16>{});
    case DType::F16:
      return f(std::integral_constant<DType, DType::F16>{});
    case DType::Bool:  // never a kernel's dtype (validation)
      throw std::logic_error("with_dtype: bool");
  }
}

template <DType IO, DType RoundTo>
struct FastForward {
  template <class Grid>
  using Kernel = NormForwardFast<Grid, IO, RoundTo>;
};
template <DType IO, DType RoundTo>
struct FastBackward {
  template <class Grid>
  using Kernel = NormBackwardFast<Grid, IO, RoundTo>;
};
template <DType IO>
struct FastRope {
  template <class Grid>
  using Kernel = RopeFast<Grid, IO>;
};

// ---- the ops ---------------------------------------------------------------------

// The fields of a norm kernel's stream (NormForwardParams, NormBackwardParams) that come
// from its input x, weight and options.
template <class Stream>
void set_norm(Stream& s, const ConstTensorView& x, const std::optional<ConstTensorView>& weight,
              int d, const RmsNormOptions& norm) {
  s.x = row_tensor(x);
  s.weight = weight_vector(weight);
  s.rows = detail::row_count(x);
  s.d = d;
  s.eps = norm.eps;
  s.mode = norm.mode;
}

// Whether a stream can join a fast launch of dtype `io` and rounding `round_to`.
inline bool joins_fast(std::initializer_list<ConstTensorView> tensors, const RmsNormOptions& norm,
                       const std::optional<ConstTensorView>& weight, DType io, DType round_to) {
  return fast_tensors(tensors) && tensors.begin()->dtype == io &&
         rounding(norm.mode, weight) == round_to;
}

// Launches the forward kernel over `streams` (one for qk_rmsnorm, the fused op's
// streams), fast when every stream can take it with one dtype and one rounding.
template <class Executor>
void norm_forward(const StreamsParams<NormForwardParams>& streams, std::int64_t max_rows, bool fast,
                  DType io, DType round_to, const char* kernel, Executor& exec) {
  const auto grid_y = static_cast<unsigned>(streams.count);
  const registry::LaunchRecord l = row_launch(kernel, max_rows, fast, grid_y);
  if (!fast) return exec.template launch<NormForwardGeneric>(l, streams);
  with_dtype(io, [&](auto io_c) {
    with_dtype(round_to, [&](auto round_c) {
      exec.template launch<FastForward<io_c.value, round_c.value>::template Kernel>(l, streams);
    });
  });
}

template <class Executor>
void rmsnorm_forward(const detail::RmsNormForwardProblem& p, Executor& exec) {
  StreamsParams<NormForwardParams> streams;
  streams.count = 1;
  NormForwardParams& s = streams.streams[0];
  set_norm(s, p.x, p.weight, p.d, p.options);
  s.y = out_row_tensor(p.y);
  norm_forward(streams, s.rows, fast_tensors({p.x, p.y}), p.x.dtype,
               rounding(p.options.mode, p.weight), "rmsnorm_forward", exec);
}

template <class Executor>
void rope(const detail::RopeProblem& p, Executor& exec) {
  RopeParams r;
  r.in = row_tensor(p.in);
  r.out = out_row_tensor(p.out);
  r.rows = detail::row_count(p.in);
  r.d = p.d;
  r.tables = tables_of(p.cos, p.sin, p.in, 0, p.options, p.transpose);
  const bool fast = fast_tensors({p.in, p.out});
  const registry::LaunchRecord l = row_launch(p.transpose ? "rope_backward" : "rope", r.rows, fast);
  if (!fast) return exec.template launch<RopeGeneric>(l, r);
  with_dtype(p.in.dtype,
             [&](auto io_c) { exec.template launch<FastRope<io_c.value>::template Kernel>(l, r); });
}

template <class Executor>
void qk_norm_rope_forward(const detail::QkNormRopeForwardProblem& p, Executor& exec) {
  StreamsParams<NormForwardParams> streams;
  std::int64_t max_rows = 0;
  bool fast = true;
  const DType io = p.streams.front().x.dtype;
  const DType round_to = rounding(p.streams.front().norm.mode, p.streams.front().weight);
  for (const detail::NormRopeForwardProblem& stream : p.streams) {
    NormForwardParams& s = streams.streams[streams.count++];
    set_norm(s, stream.x, stream.weight, stream.d, stream.norm);
    s.y = out_row_tensor(stream.y);
    s.rope = true;
    s.tables = tables_of(stream.cos, stream.sin, stream.x, stream.seq_offset, stream.rope, false);
    max_rows = std::max(max_rows, s.rows);
    fast = fast && joins_fast({stream.x, stream.y}, stream.norm, stream.weight, io, round_to);
  }
  norm_forward(streams, max_rows, fast, io, round_to, "qk_norm_rope_forward", exec);
}

// The backward launches over `streams`, then the dw sums of those that ask for dw.
template <class Executor>
void norm_backward(StreamsParams<NormBackwardParams>& streams,
                   const std::vector<std::optional<TensorView>>& dws, bool fast, DType io,
                   DType round_to, const char* kernel, Executor& exec) {
  std::int64_t max_rows = 0;
  bool any_dw = false;
  for (int i = 0; i < streams.count; ++i) {
    max_rows = std::max(max_rows, streams.streams[i].rows);
    any_dw = any_dw || dws[static_cast<std::size_t>(i)].has_value();
  }
  // One launch shape for all streams: with any dw, every stream runs by dw blocks (a
  // stream without dw just writes no partials).
  StreamsParams<FinishDwParams> finish;
  for (int i = 0; i < streams.count; ++i) {
    NormBackwardParams& s = streams.streams[i];
    s.by_dw_blocks = any_dw;
    const auto& dw = dws[static_cast<std::size_t>(i)];
    if (!dw) continue;
    const std::int64_t blocks = contract::dw_block_count(s.rows);
    s.partials = exec.scratch_floats(static_cast<std::size_t>(blocks * s.d));
    finish.streams[finish.count++] = {s.partials, blocks, s.d, dw->data, dw->dtype, dw->strides[0]};
  }
  const auto grid_y = static_cast<unsigned>(streams.count);
  const registry::LaunchRecord l = any_dw ? dw_block_launch(kernel, max_rows, fast, grid_y)
                                          : row_launch(kernel, max_rows, fast, grid_y);
  if (!fast) {
    exec.template launch<NormBackwardGeneric>(l, streams);
  } else {
    with_dtype(io, [&](auto io_c) {
      with_dtype(round_to, [&](auto round_c) {
        exec.template launch<FastBackward<io_c.value, round_c.value>::template Kernel>(l, streams);
      });
    });
  }
  if (finish.count == 0) return;
  int max_d = 0;
  for (int i = 0; i < finish.count; ++i) max_d = std::max(max_d, finish.streams[i].d);
  registry::LaunchRecord f;
  f.kernel = "finish_dw";
  f.path = "generic";
  f.block = {kFinishThreads, 1, 1};
  f.grid = {to_grid((max_d + kFinishThreads - 1) / kFinishThreads),
            static_cast<unsigned>(finish.count), 1};
  exec.template launch<FinishDw>(f, finish);
}

template <class Executor>
void rmsnorm_backward(const detail::RmsNormBackwardProblem& p, Executor& exec) {
  StreamsParams<NormBackwardParams> streams;
  streams.count = 1;
  NormBackwardParams& s = streams.streams[0];
  set_norm(s, p.x, p.weight, p.d, p.options);
  s.dy = row_tensor(p.dy);
  s.dx = out_row_tensor(p.dx);
  norm_backward(streams, {p.dw}, fast_tensors({p.x, p.dy, p.dx}), p.x.dtype,
                rounding(p.options.mode, p.weight), "rmsnorm_backward", exec);
}

template <class Executor>
void qk_norm_rope_backward(const detail::QkNormRopeBackwardProblem& p, Executor& exec) {
  for (const TensorView& dw : p.empty_stream_grads) exec.zero(dw);
  if (p.streams.empty()) return;
  StreamsParams<NormBackwardParams> streams;
  std::vector<std::optional<TensorView>> dws;
  bool fast = true;
  const DType io = p.streams.front().x.dtype;
  const DType round_to = rounding(p.streams.front().norm.mode, p.streams.front().weight);
  for (const detail::NormRopeBackwardProblem& stream : p.streams) {
    NormBackwardParams& s = streams.streams[streams.count++];
    set_norm(s, stream.x, stream.weight, stream.d, stream.norm);
    s.dy = row_tensor(stream.dy);
    s.dx = out_row_tensor(stream.dx);
    s.rope = true;
    s.tables = tables_of(stream.cos, stream.sin, stream.x, stream.seq_offset, stream.rope, true);
    dws.push_back(stream.dw);
    fast = fast &&
           joins_fast({stream.x, stream.dy, stream.dx}, stream.norm, stream.weight, io, round_to);
  }
  norm_backward(streams, dws, fast, io, round_to, "qk_norm_rope_backward", exec);
}

// digest-v1 of each batch element of `v` (one per index of dim 0 of a 4-D view, else
// one), computed on the device and copied back.
template <class Executor>
std::vector<std::uint64_t> batch_digests(const ConstTensorView& v, Executor& exec) {
  DigestParams d;
  d.data = v.data;
  d.dtype = v.dtype;
  d.rank = v.rank;
  for (int i = 0; i < v.rank; ++i) {
    d.shape[i] = v.shape[i];
    d.strides[i] = v.strides[i];
  }
  d.batches = v.rank == kMaxRank ? v.shape[0] : 1;
  d.digests = exec.scratch_digests(static_cast<std::size_t>(d.batches));
  registry::LaunchRecord l;
  l.kernel = "digest_v1";
  l.path = "generic";
  l.block = {kDigestThreads, 1, 1};
  l.grid = {to_grid(d.batches), 1, 1};
  exec.template launch<DigestV1>(l, d);
  std::vector<std::uint64_t> digests(static_cast<std::size_t>(d.batches));
  exec.copy_to_host(digests.data(), d.digests, digests.size() * sizeof(std::uint64_t));
  return digests;
}

// ---- GEMM (docs/contract.md "Linear (GEMM)"; device/gemm_kernel.cuh) -------------------

// gridDim.y's limit: past 65535 M tiles, each block also does the M tiles 65535 apart.
inline constexpr std::int64_t kMaxGridY = 65535;

inline GemmOperand gemm_operand(const detail::GemmMatrix& m) {
  return {m.data, m.dtype, m.row_stride, m.col_stride};
}

inline GemmOperand gemm_operand(const std::optional<detail::GemmMatrix>& m) {
  return m ? gemm_operand(*m) : GemmOperand{};
}

// The kernel's arguments and launch for `p`: 64 x 64 tiles of C, N tiles over grid.x, M
// tiles over grid.y. Any dtypes and strides (one kernel: the loads and the store take the
// dtype at run time), bias, activation, grad_out (the activation-backward epilogue).
inline GemmParams gemm_params(const detail::GemmProblem& p) {
  GemmParams g;
  g.m = p.m;
  g.n = p.n;
  g.r = p.r;
  g.a = gemm_operand(p.a);
  g.b = gemm_operand(p.b);
  g.bias = gemm_operand(p.bias);
  g.grad_out = gemm_operand(p.grad_out);
  g.activation = p.activation;
  g.c = p.c;
  g.c_dtype = p.c_dtype;
  g.c_row_stride = p.c_row_stride;
  g.c_col_stride = p.c_col_stride;
  g.m_tiles = (p.m + kGemmTileM - 1) / kGemmTileM;
  g.m_tile_step = std::min(std::max<std::int64_t>(g.m_tiles, 1), kMaxGridY);
  return g;
}

inline registry::LaunchRecord gemm_launch(const GemmParams& g) {
  registry::LaunchRecord l;
  l.kernel = "gemm";
  l.path = "generic";
  l.rows_per_block = kGemmTileM;
  l.block = {kGemmThreads, 1, 1};
  l.grid = {to_grid((g.n + kGemmTileN - 1) / kGemmTileN), static_cast<unsigned>(g.m_tile_step), 1};
  return l;
}

// One launch; none when C is empty (M or N = 0).
template <class Executor>
void gemm(const detail::GemmProblem& p, Executor& exec) {
  if (p.m <= 0 || p.n <= 0) return;
  const GemmParams g = gemm_params(p);
  exec.template launch<Gemm>(gemm_launch(g), g);
}

// linear_backward's GEMMs (detail::linear_backward_gemms) as launches, its dz scratch
// and the 1.0f of db's product in the call's device memory.
template <class Executor>
void linear_backward(const detail::LinearBackwardProblem& p, Executor& exec) {
  float* dz =
      p.activation == contract::Activation::None
          ? nullptr
          : exec.scratch_floats(static_cast<std::size_t>(p.m) * static_cast<std::size_t>(p.n));
  detail::linear_backward_gemms(p, dz, exec.one(),
                                [&](const detail::GemmProblem& g) { gemm(g, exec); });
}

}  // namespace kernel_align::cuda::plan
