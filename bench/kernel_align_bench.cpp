// Google Benchmark suite of kernel-align at the Qwen-Image shapes (docs/performance.md).
//
// Every case is named  <op>/<dtype>/<shape>/<path>/threads:<n>  and reports
//   GBps            effective bandwidth: bytes = inputs read once + outputs written once
//                   + cos/sin tables + norm weights (and dw), per wall-clock second
//   copy_GBps       memcpy of the same byte count on the same number of threads, measured
//                   right after the case's timed loop (each repetition its own)
//   ratio_to_copy   GBps / copy_GBps (>= 1: faster than memcpy)
//   nt_copy_GBps, ratio_to_nt_copy   the same against a non-temporal-store copy
// Inputs are random from a fixed seed; buffers are allocated and faulted in before the
// timed loop, which allocates nothing. Use --benchmark_out=<file> --benchmark_out_format=json
// (or csv) to keep results; bench/run_bench.sh and bench/summarize.py do that.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cases/inputs.hpp"
#include "cases/shapes.hpp"
#include "copy_baseline.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/positions.hpp"
#include "kernel_align/registry.hpp"
#include "kernel_align/runtime.hpp"
#include "kernel_align/tables.hpp"

namespace kernel_align::bench {
namespace {

// The shapes: the issue's (src/cases/shapes.hpp), B = 1.
using cases::issue_shapes;
using cases::kHeadDim;
constexpr float kEps = 1e-6f;

// ---------------------------------------------------------------------------------------
// Ops and the bytes each one moves.

enum class Op : unsigned char {
  RmsNormFwd,
  RmsNormBwd,
  RopeFwd,
  RopeBwd,
  FusedFwd,
  UnfusedFwd,
  FusedBwd,
  UnfusedBwd,
};

const char* op_name(Op op) {
  switch (op) {
    case Op::RmsNormFwd:
      return "qk_rmsnorm_fwd";
    case Op::RmsNormBwd:
      return "qk_rmsnorm_bwd";
    case Op::RopeFwd:
      return "multi_axis_rope_fwd";
    case Op::RopeBwd:
      return "multi_axis_rope_bwd";
    case Op::FusedFwd:
      return "qk_norm_rope_fwd";
    case Op::UnfusedFwd:
      return "unfused_norm_rope_fwd";
    case Op::FusedBwd:
      return "qk_norm_rope_bwd";
    case Op::UnfusedBwd:
      return "unfused_norm_rope_bwd";
  }
  return "?";
}

// Fused and unfused variants count the same logical bytes (q and k in, q and k out),
// so their GBps compare directly and the ratio of the two is the fused speed-up.
std::int64_t op_bytes(Op op, const cases::Shape& shape, DType dt) {
  const auto es = static_cast<std::int64_t>(dtype_size(dt));
  const std::int64_t seq = shape.seq();
  const std::int64_t tensor = seq * shape.heads * kHeadDim * es;
  const std::int64_t weight = kHeadDim * es;
  const std::int64_t tables = 2 * seq * (kHeadDim / 2) * 4;
  switch (op) {
    case Op::RmsNormFwd:
      return 2 * tensor + weight;  // x, w -> y
    case Op::RmsNormBwd:
      return 3 * tensor + 2 * weight;  // x, dy, w -> dx, dw
    case Op::RopeFwd:
    case Op::RopeBwd:
      return 2 * tensor + tables;  // x, cos, sin -> y
    case Op::FusedFwd:
    case Op::UnfusedFwd:
      return 4 * tensor + 4 * weight + tables;  // q, k, 4 w, cos, sin -> q_out, k_out
    case Op::FusedBwd:
    case Op::UnfusedBwd:
      return 6 * tensor + 8 * weight + tables;  // q, k, dq_out, dk_out, 4 w -> dq, dk, 4 dw
  }
  return 0;
}

// ---------------------------------------------------------------------------------------
// Paths: the scalar reference backend, and the CPU backend per instruction set.

struct Path {
  std::string name;
  bool reference = false;
  Isa isa = Isa::Portable;
};

std::vector<Path> paths() {
  std::vector<Path> p;
  p.push_back({"reference", true, Isa::Portable});
  for (const Isa isa : {Isa::Portable, Isa::Avx2, Isa::Avx512}) {
    if (static_cast<int>(isa) > static_cast<int>(best_isa())) break;
    p.push_back({std::string("cpu-") + isa_name(isa), false, isa});
  }
  return p;
}

std::vector<int> thread_counts() {
  const int hw = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  std::vector<int> t{1};
  if (hw > 1) t.push_back(hw);
  return t;
}

// Selects the path and thread count; throws what the library throws.
void select(const Path& path, int threads) {
  if (path.reference) {
    set_backend("reference");
  } else {
    set_backend("simd");
    set_isa(path.isa);
    set_num_threads(threads);
  }
}

// ---------------------------------------------------------------------------------------
// Inputs and outputs of one (shape, dtype), kept while consecutive cases share them.

struct Workspace {
  int shape = -1;  // its index in issue_shapes()
  DType dtype = DType::F32;
  std::int64_t heads = 0;
  std::int64_t text_len = 0;
  std::int64_t seq = 0;
  Buffer q, k, dq_out, dk_out;  // inputs, [1, S, H, D]
  Buffer out_q, out_k;          // outputs
  Buffer tmp_q, tmp_k;          // the unfused pipelines' intermediates
  Buffer weight[4];             // text q, text k, image q, image k: [D]
  Buffer dweight[4];
  RopeTables tables;
};

// Uniform values in [lo, lo + width), stored in dtype dt.
void fill_random(Buffer& b, DType dt, std::uint64_t seed, float lo, float width) {
  cases::Random random(seed);
  cases::fill_uniform(random, dt, {reinterpret_cast<std::byte*>(b.data()), b.size()}, lo, width);
}

Workspace& workspace(int shape, DType dt) {
  static std::unique_ptr<Workspace> ws;
  if (ws && ws->shape == shape && ws->dtype == dt) return *ws;
  ws.reset();  // free the previous buffers before allocating the next
  auto w = std::make_unique<Workspace>();
  w->shape = shape;
  w->dtype = dt;
  const cases::Shape& s = issue_shapes()[static_cast<std::size_t>(shape)];
  w->heads = s.heads;
  w->text_len = s.text_len;
  cases::ShapeTables tables = cases::shape_tables(s);
  w->seq = tables.seq;
  w->tables = std::move(tables.tables);
  const auto tensor_bytes = static_cast<std::size_t>(w->seq * w->heads * kHeadDim) * dtype_size(dt);
  std::uint64_t seed = 20240917;
  for (Buffer* b : {&w->q, &w->k, &w->dq_out, &w->dk_out}) {
    *b = Buffer(tensor_bytes);
    fill_random(*b, dt, seed++, -2.0f, 4.0f);
  }
  for (Buffer* b : {&w->out_q, &w->out_k, &w->tmp_q, &w->tmp_k}) *b = Buffer(tensor_bytes);
  for (int i = 0; i < 4; ++i) {
    w->weight[i] = Buffer(static_cast<std::size_t>(kHeadDim) * dtype_size(dt));
    fill_random(w->weight[i], dt, seed++, 0.5f, 1.0f);
    w->dweight[i] = Buffer(static_cast<std::size_t>(kHeadDim) * dtype_size(dt));
  }
  ws = std::move(w);
  return *ws;
}

// [1, len, H, D] view of sequence positions [start, start + len) of a buffer of H heads.
TensorView seq_view(const Buffer& b, DType dt, std::int64_t heads, std::int64_t start,
                    std::int64_t len) {
  auto* base = b.data() + static_cast<std::size_t>(start * heads * kHeadDim) * dtype_size(dt);
  return TensorView::contiguous(base, dt, {1, len, heads, kHeadDim});
}

TensorView vec_view(const Buffer& b, DType dt) {
  return TensorView::contiguous(b.data(), dt, {kHeadDim});
}

// One call of an op, built before the timed loop.
std::function<void()> make_call(Op op, Workspace& w) {
  const DType dt = w.dtype;
  const std::int64_t s = w.seq;
  const std::int64_t t = w.text_len;
  const std::int64_t h = w.heads;
  const ConstTensorView cos =
      ConstTensorView::contiguous(w.tables.cos.data(), DType::F32, {s, kHeadDim / 2});
  const ConstTensorView sin =
      ConstTensorView::contiguous(w.tables.sin.data(), DType::F32, {s, kHeadDim / 2});
  // k, dk_out and out_k serve the fused cases only.
  const TensorView q = seq_view(w.q, dt, h, 0, s);
  [[maybe_unused]] const TensorView k = seq_view(w.k, dt, h, 0, s);
  const TensorView dq_out = seq_view(w.dq_out, dt, h, 0, s);
  [[maybe_unused]] const TensorView dk_out = seq_view(w.dk_out, dt, h, 0, s);
  const TensorView out_q = seq_view(w.out_q, dt, h, 0, s);
  [[maybe_unused]] const TensorView out_k = seq_view(w.out_k, dt, h, 0, s);
  std::optional<ConstTensorView> wt[4];
  std::optional<TensorView> dwt[4];
  for (int i = 0; i < 4; ++i) {
    wt[i] = vec_view(w.weight[i], dt);
    dwt[i] = vec_view(w.dweight[i], dt);
  }
  const RmsNormOptions norm{kEps, NormMode::Diffusers};
  const RopeOptions rope{Pairing::Interleaved, Layout::BSHD};

  // The unfused pipeline on one stream: text and image rows normed with their own
  // weights (two calls), then RoPE over the whole sequence.
  struct Stream {
    const Buffer *x, *dy, *out, *tmp;
    int text_w, image_w;
  };
  const Stream streams[2] = {{&w.q, &w.dq_out, &w.out_q, &w.tmp_q, 0, 2},
                             {&w.k, &w.dk_out, &w.out_k, &w.tmp_k, 1, 3}};

  switch (op) {
    case Op::RmsNormFwd:
      return [=] { qk_rmsnorm_forward(q, wt[2], out_q, norm); };
    case Op::RmsNormBwd:
      return [=] { qk_rmsnorm_backward(q, dq_out, wt[2], out_q, dwt[2], norm); };
    case Op::RopeFwd:
      return [=] { multi_axis_rope_forward(q, cos, sin, out_q, rope); };
    case Op::RopeBwd:
      return [=] { multi_axis_rope_backward(dq_out, cos, sin, out_q, rope); };
    case Op::UnfusedFwd:
      return [=] {
        for (const Stream& st : streams) {
          qk_rmsnorm_forward(seq_view(*st.x, dt, h, 0, t), wt[st.text_w],
                             seq_view(*st.tmp, dt, h, 0, t), norm);
          qk_rmsnorm_forward(seq_view(*st.x, dt, h, t, s - t), wt[st.image_w],
                             seq_view(*st.tmp, dt, h, t, s - t), norm);
          multi_axis_rope_forward(seq_view(*st.tmp, dt, h, 0, s), cos, sin,
                                  seq_view(*st.out, dt, h, 0, s), rope);
        }
      };
    case Op::UnfusedBwd:
      return [=] {
        for (const Stream& st : streams) {
          multi_axis_rope_backward(seq_view(*st.dy, dt, h, 0, s), cos, sin,
                                   seq_view(*st.tmp, dt, h, 0, s), rope);
          qk_rmsnorm_backward(seq_view(*st.x, dt, h, 0, t), seq_view(*st.tmp, dt, h, 0, t),
                              wt[st.text_w], seq_view(*st.out, dt, h, 0, t), dwt[st.text_w], norm);
          qk_rmsnorm_backward(seq_view(*st.x, dt, h, t, s - t), seq_view(*st.tmp, dt, h, t, s - t),
                              wt[st.image_w], seq_view(*st.out, dt, h, t, s - t), dwt[st.image_w],
                              norm);
        }
      };
    case Op::FusedFwd: {
      QkNormWeights weights{wt[0], wt[1], wt[2], wt[3]};
      const QkNormRopeOptions options{kEps, NormMode::Diffusers, Pairing::Interleaved, Layout::BSHD,
                                      t};
      return [=] { qk_norm_rope_forward(q, k, weights, cos, sin, out_q, out_k, options); };
    }
    case Op::FusedBwd: {
      QkNormWeights weights{wt[0], wt[1], wt[2], wt[3]};
      QkNormWeightGrads grads{dwt[0], dwt[1], dwt[2], dwt[3]};
      const QkNormRopeOptions options{kEps, NormMode::Diffusers, Pairing::Interleaved, Layout::BSHD,
                                      t};
      return [=] {
        qk_norm_rope_backward(q, k, dq_out, dk_out, weights, cos, sin, out_q, out_k, grads,
                              options);
      };
    }
    default:
      break;
  }
  return {};
}

// ---------------------------------------------------------------------------------------
// The cases.

// KERNEL_ALIGN_BENCH_NO_COPY_BASELINE=1 leaves the copy counters out: for runs that
// count instructions (bench/count_instructions.py), where timing copies only costs.
bool copy_baseline_wanted() {
  static const bool wanted = [] {
    const char* v = std::getenv("KERNEL_ALIGN_BENCH_NO_COPY_BASELINE");
    return v == nullptr || *v == '\0' || std::string(v) == "0";
  }();
  return wanted;
}

void attach_copy_counters(benchmark::State& state, std::int64_t bytes, int threads) {
  const auto b = static_cast<double>(bytes);
  using benchmark::Counter;
  state.counters["GBps"] = Counter(b * 1e-9, Counter::kIsIterationInvariantRate);
  state.counters["bytes"] = Counter(b);
  state.counters["threads"] = Counter(threads);
  if (!copy_baseline_wanted()) return;
  const CopyRate rate = copy_rate_now(static_cast<std::size_t>(bytes), threads);
  state.counters["copy_GBps"] = Counter(rate.memcpy_bytes_per_second * 1e-9);
  state.counters["nt_copy_GBps"] = Counter(rate.nt_bytes_per_second * 1e-9);
  // (bytes / copy rate) per iteration over the iteration time = the copy's time over ours.
  state.counters["ratio_to_copy"] =
      Counter(b / rate.memcpy_bytes_per_second, Counter::kIsIterationInvariantRate);
  state.counters["ratio_to_nt_copy"] =
      Counter(b / rate.nt_bytes_per_second, Counter::kIsIterationInvariantRate);
}

void run_op(benchmark::State& state, Op op, int shape, DType dt, const Path& path, int threads) {
  std::function<void()> call;
  std::int64_t bytes = 0;
  try {
    Workspace& w = workspace(shape, dt);
    bytes = op_bytes(op, issue_shapes()[static_cast<std::size_t>(shape)], dt);
    select(path, threads);
    call = make_call(op, w);
    call();  // untimed: checks the arguments, warms the pool and the caches
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    for (auto _ : state) {
    }
    return;
  }
  for (auto _ : state) {
    call();
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  // The baseline of this repetition, measured now: ratio_to_copy pairs the two.
  attach_copy_counters(state, bytes, threads);
}

void run_copy(benchmark::State& state, CopyKind kind, std::int64_t bytes, int threads) {
  CopyJob job(static_cast<std::size_t>(bytes));
  CopyPool& pool = copy_pool(threads);
  job.run(pool, kind);
  for (auto _ : state) {
    job.run(pool, kind);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  attach_copy_counters(state, bytes, threads);
}

void register_all() {
  const std::vector<Path> all_paths = paths();
  const std::vector<int> threads = thread_counts();
  const Op ops[] = {Op::RmsNormFwd, Op::RmsNormBwd, Op::RopeFwd,  Op::RopeBwd,
                    Op::FusedFwd,   Op::UnfusedFwd, Op::FusedBwd, Op::UnfusedBwd};
  for (int si = 0; si < static_cast<int>(issue_shapes().size()); ++si) {
    const cases::Shape& shape = issue_shapes()[static_cast<std::size_t>(si)];
    for (const DType dt : {DType::F32, DType::BF16, DType::F16}) {
      const std::string tail = std::string("/") + dtype_name(dt) + "/" + shape.name + "/";
      // Copy baselines at the fused forward's byte count, as cases of their own.
      for (const CopyKind kind : {CopyKind::Memcpy, CopyKind::NonTemporal}) {
        for (const int n : threads) {
          const std::int64_t bytes = op_bytes(Op::FusedFwd, shape, dt);
          benchmark::RegisterBenchmark(
              (std::string("copy_") + copy_kind_name(kind) + tail +
               "copy/threads:" + std::to_string(n))
                  .c_str(),
              [kind, bytes, n](benchmark::State& st) { run_copy(st, kind, bytes, n); })
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
      }
      for (const Op op : ops) {
        for (const Path& path : all_paths) {
          for (const int n : threads) {
            if (path.reference && n != 1) continue;  // the reference is single-threaded
            benchmark::RegisterBenchmark(
                (op_name(op) + tail + path.name + "/threads:" + std::to_string(n)).c_str(),
                [op, si, dt, path, n](benchmark::State& st) { run_op(st, op, si, dt, path, n); })
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
          }
        }
      }
    }
  }
}

void add_context() {
  std::string shapes;
  for (const cases::Shape& s : issue_shapes()) {
    shapes += (shapes.empty() ? "[" : ", ") + cases::shape_json(s);
  }
  benchmark::AddCustomContext("kernel_align.shapes", shapes + "]");
  benchmark::AddCustomContext("kernel_align.math",
                              "diffusers: NormMode::Diffusers with weights, interleaved "
                              "pairs, BSHD, positions and tables of the diffusers layout");
  benchmark::AddCustomContext("kernel_align.best_isa", isa_name(best_isa()));
  benchmark::AddCustomContext("kernel_align.hardware_threads",
                              std::to_string(std::thread::hardware_concurrency()));
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  benchmark::AddCustomContext("GLIBC_TUNABLES", tunables ? tunables : "");
  benchmark::AddCustomContext(
      "kernel_align.copy_baseline",
      "memcpy (and SSE2 non-temporal-store copy) from a bytes/2 source to a bytes/2 "
      "destination, split over the same thread count; rate = bytes read + written per "
      "second, median of " +
          std::to_string(kCopyRuns) +
          " runs after a warm-up, measured right after each case's timed loop (each "
          "repetition its own)");
}

}  // namespace
}  // namespace kernel_align::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  kernel_align::bench::add_context();
  kernel_align::bench::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
