// kernel-align run: the main job. Builds positions and tables for a Qwen-Image
// attention front end, applies qk_rmsnorm then RoPE to seeded random q and k,
// judges the result against the fp64 oracle and checks batch invariance.
#include "run.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cases/shapes.hpp"
#include "cli_args.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/version.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/positions.hpp"
#include "kernel_align/registry.hpp"
#include "kernel_align/runtime.hpp"
#include "kernel_align/tables.hpp"
#include "memory.hpp"
#include "oracle/oracle.hpp"
#include "random_inputs.hpp"
#include "tensor_io.hpp"

namespace kernel_align::cli {
namespace {

constexpr std::array<FlagSpec, 8> kRunFlags{{{"--image", true},
                                             {"--text-len"},
                                             {"--heads"},
                                             {"--dtype"},
                                             {"--layout"},
                                             {"--seed"},
                                             {"--batch"},
                                             {"--trace"}}};
using cases::kHeadDim;
// The shape the job runs when no flag says otherwise.
constexpr std::string_view kDefaultShape = "t2i_1328x1328";

struct JobConfig {
  PositionRequest positions;
  std::int64_t heads = 0;
  DType dtype = DType::BF16;
  std::uint64_t seed = 42;
  std::int64_t batch = 4;  // the batch the invariance check puts the sample into
  std::string trace;       // trace file, "" for none
};

JobConfig parse_config(const std::vector<std::string>& tokens) {
  const Args args(tokens, kRunFlags);
  JobConfig c;
  c.positions.layout = parse_choice<PositionLayout>(
      "--layout", args.optional("--layout").value_or("diffusers"),
      {{"diffusers", PositionLayout::Diffusers}, {"seed", PositionLayout::Seed}});
  const cases::Shape& defaults = cases::issue_shape(kDefaultShape);
  for (const std::string& image : args.all("--image")) {
    c.positions.images.push_back(parse_image(image));
  }
  if (c.positions.images.empty()) c.positions.images = defaults.images;
  const auto text_len = args.optional("--text-len");
  c.positions.text_len =
      text_len ? parse_int<std::int64_t>("--text-len", *text_len) : defaults.text_len;
  const auto heads = args.optional("--heads");
  c.heads = heads ? parse_int<std::int64_t>("--heads", *heads) : defaults.heads;
  if (c.heads < 1) throw Error("--heads", "a head count >= 1", std::to_string(c.heads));
  c.dtype = parse_dtype("--dtype", args.optional("--dtype").value_or("bf16"));
  c.seed = parse_int<std::uint64_t>("--seed", args.optional("--seed").value_or("42"));
  c.batch = parse_int<std::int64_t>("--batch", args.optional("--batch").value_or("4"));
  if (c.batch < 2) throw Error("--batch", "a batch size >= 2", std::to_string(c.batch));
  c.trace = args.optional("--trace").value_or("");
  return c;
}

// Refuses, before anything is allocated, a job larger than the memory the machine can
// give: the tables, the sample's arrays and the oracle's fp64 copies, then the batch.
void check_job_memory(const JobConfig& c, std::int64_t seq) {
  const auto tokens = static_cast<std::uint64_t>(seq);
  const auto elements =
      checked_product({tokens, static_cast<std::uint64_t>(c.heads), std::uint64_t{kHeadDim}});
  const std::string sample = std::to_string(seq) + " tokens x " + std::to_string(c.heads) +
                             " heads x " + std::to_string(kHeadDim) + ", " + dtype_name(c.dtype);
  // int32 positions [S, 3] and fp32 cos/sin [S, D/2].
  const std::uint64_t table_bytes_per_token = 3 * 4 + 2 * (kHeadDim / 2) * 4;
  const auto tables = checked_product({tokens, table_bytes_per_token});
  check_fits_in_memory("--image", tables,
                       "the positions and tables of " + std::to_string(seq) + " tokens");
  // q and k: input, normed, output, fused output (8 arrays), and the oracle's fp64 copy
  // of an input and its expected values with their bounds (about 48 bytes an element).
  const std::uint64_t sample_bytes_per_element = 8 * dtype_size(c.dtype) + 48;
  const auto per_sample =
      checked_product({elements.value_or(UINT64_MAX), sample_bytes_per_element});
  const auto job = [&](std::optional<std::uint64_t> batch_bytes) -> std::optional<std::uint64_t> {
    if (!tables || !per_sample || !batch_bytes) return std::nullopt;
    std::uint64_t total = *tables;
    if (__builtin_add_overflow(total, *per_sample, &total) ||
        __builtin_add_overflow(total, *batch_bytes, &total)) {
      return std::nullopt;
    }
    return total;
  };
  check_fits_in_memory("--heads", elements ? job(0) : std::nullopt, "one sample (" + sample + ")");
  // The batch: q and k inputs and fused outputs.
  const auto batch_bytes =
      checked_product({elements.value_or(UINT64_MAX), static_cast<std::uint64_t>(c.batch),
                       4 * dtype_size(c.dtype)});
  check_fits_in_memory("--batch", job(batch_bytes),
                       "a batch of " + std::to_string(c.batch) + " samples (" + sample + ")");
}

std::vector<double> widened(const ConstTensorView& v) {
  std::vector<double> out(static_cast<std::size_t>(v.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = contract::load_f32(v.dtype, v.data, static_cast<std::int64_t>(i));
  }
  return out;
}

// The four learned norm weights of a diffusers block (none in the seed layout).
struct NormWeights {
  std::optional<NpyArray> text;
  std::optional<NpyArray> image;
};

struct Stage {
  NormWeights q;
  NormWeights k;
  NormMode mode = NormMode::Single;
  RopeOptions rope;
  std::int64_t text_len = 0;
  ConstTensorView cos;
  ConstTensorView sin;
};

std::optional<ConstTensorView> view_of(const std::optional<NpyArray>& a) {
  return a ? std::optional<ConstTensorView>(const_view(*a)) : std::nullopt;
}

// qk_rmsnorm (text and image rows with their own weights) into `normed`, then RoPE
// from `normed` into `out`.
void norm_then_rope(const Stage& stage, const NormWeights& weights, const NpyArray& x,
                    NpyArray& normed, NpyArray& out) {
  const ConstTensorView xv = const_view(x);
  const TensorView nv = mutable_view(normed);
  const std::int64_t seq = xv.shape[1];
  const RmsNormOptions options{1e-6f, stage.mode};
  if (stage.text_len > 0) {
    qk_rmsnorm_forward(narrow(xv, 1, 0, stage.text_len), view_of(weights.text),
                       narrow(nv, 1, 0, stage.text_len), options);
  }
  qk_rmsnorm_forward(narrow(xv, 1, stage.text_len, seq), view_of(weights.image),
                     narrow(nv, 1, stage.text_len, seq), options);
  multi_axis_rope_forward(nv, stage.cos, stage.sin, mutable_view(out), stage.rope);
}

// q and k through the fused op.
std::array<NpyArray, 2> fused_norm_rope(const Stage& stage, const NpyArray& q, const NpyArray& k,
                                        DType dtype) {
  std::array<NpyArray, 2> out{float_array_like(q, dtype), float_array_like(k, dtype)};
  const QkNormWeights weights{view_of(stage.q.text), view_of(stage.k.text), view_of(stage.q.image),
                              view_of(stage.k.image)};
  qk_norm_rope_forward(const_view(q), const_view(k), weights, stage.cos, stage.sin,
                       mutable_view(out[0]), mutable_view(out[1]),
                       {1e-6f, stage.mode, stage.rope.pairing, stage.rope.layout, stage.text_len});
  return out;
}

struct OracleVerdict {
  std::int64_t checked = 0;
  std::int64_t outside = 0;
  double worst_ratio = 0.0;  // max |result - exact| / bound

  void judge(const std::vector<oracle::Expected>& expected, const ConstTensorView& result) {
    for (std::size_t i = 0; i < expected.size(); ++i) {
      const double got =
          contract::load_f32(result.dtype, result.data, static_cast<std::int64_t>(i));
      ++checked;
      if (!oracle::within(expected[i], got)) ++outside;
      if (expected[i].bound > 0.0) {
        worst_ratio = std::max(worst_ratio, std::abs(got - expected[i].value) / expected[i].bound);
      }
    }
  }
};

// Each stage against exact math, given the stage's actual input bytes.
void judge_with_oracle(const Stage& stage, const NormWeights& weights, const NpyArray& x,
                       const NpyArray& normed, const NpyArray& out, OracleVerdict& verdict) {
  const ConstTensorView xv = const_view(x);
  const ConstTensorView nv = const_view(normed);
  const std::int64_t seq = xv.shape[1];
  const std::int64_t heads = xv.shape[2];
  for (const auto& [begin, end, weight] :
       {std::tuple{std::int64_t{0}, stage.text_len, &weights.text},
        std::tuple{stage.text_len, seq, &weights.image}}) {
    if (begin == end) continue;
    const std::vector<double> w = *weight ? widened(const_view(**weight)) : std::vector<double>{};
    const DType weight_dtype = *weight ? float_dtype(**weight, "weight") : DType::F32;
    verdict.judge(oracle::rmsnorm_forward(widened(narrow(xv, 1, begin, end)), kHeadDim, w, 1e-6f,
                                          stage.mode, weight_dtype, nv.dtype),
                  narrow(nv, 1, begin, end));
  }
  verdict.judge(oracle::rope(widened(nv), 1, seq, heads, kHeadDim, widened(stage.cos),
                             widened(stage.sin), stage.rope.pairing, false, nv.dtype),
                const_view(out));
}

// The sample's bytes must be the same alone and as element `slot` of a batch.
bool batch_invariant(const NpyArray& alone, const NpyArray& batched, std::int64_t slot) {
  const std::size_t sample_bytes = alone.data.size();
  return std::memcmp(alone.data.data(), batched.data.data() + slot * sample_bytes, sample_bytes) ==
         0;
}

// Batch of `batch` random samples with `sample` copied into slot `slot`.
NpyArray batch_around(const NpyArray& sample, Random& random, DType dtype, std::int64_t batch,
                      std::int64_t slot) {
  std::vector<std::int64_t> shape = sample.shape;
  shape[0] = batch;
  NpyArray b = random_tensor(random, dtype, shape, -4.0f, 8.0f);
  std::copy(sample.data.begin(), sample.data.end(),
            b.data.begin() + static_cast<std::ptrdiff_t>(slot * sample.data.size()));
  return b;
}

// Which backend the last call ran on, and why that one.
std::string backend_choice() {
  const CallReport call = last_call();
  std::string line = call.backend + " (isa " + call.isa + ", " + std::to_string(num_threads()) +
                     " threads allowed): ";
  if (!call.fallback.empty()) return line + "FALLBACK from " + call.fallback;
  if (!backend_override().empty()) return line + "forced by --backend or KERNEL_ALIGN_BACKEND";
  return line + "first choice of the cpu registry list";
}

class Clock {
 public:
  double lap_ms() {
    const auto now = std::chrono::steady_clock::now();
    const double ms = std::chrono::duration<double, std::milli>(now - last_).count();
    last_ = now;
    return ms;
  }
  double total_s() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_ = start_;
};

// The main job (run_main_job's, after its flags are parsed).
int run_job(const JobConfig& config) {
  check_job_memory(config, call_library({{"text_len", "--text-len"}, {"images", "--image"}},
                                        [&] { return sequence_length(config.positions); }));
  const bool diffusers = config.positions.layout == PositionLayout::Diffusers;
  Clock clock;

  std::string order;
  for (const RegistryRow& row : registry_table()) {
    if (row.platform != Platform::Cpu || row.op != OpType::QkNormRope) continue;
    for (const BackendStatus& b : row.backends) order += (order.empty() ? "" : ", ") + b.name;
  }
  const std::string forced = backend_override();
  std::printf("kernel-align run (%s): cpu backends in order: %s%s; isa %s, %d threads%s\n",
              contract::kVersionString, order.c_str(),
              forced.empty() ? "" : (" (" + forced + " forced)").c_str(), isa_name(isa()),
              num_threads(), strict() ? ", strict" : "");
  if (!config.trace.empty()) set_trace_path(config.trace);
  const std::vector<Position> positions = build_positions(config.positions);
  const auto seq = static_cast<std::int64_t>(positions.size());
  std::string grids;
  for (const ImageGrid& g : config.positions.images) {
    grids += (grids.empty() ? "" : ", ") + std::to_string(g.height) + "x" + std::to_string(g.width);
  }
  std::printf(
      "  layout %s: text %lld + images (h x w tokens) %s -> S = %lld; %lld heads x %d, %s\n",
      position_layout_name(config.positions.layout),
      static_cast<long long>(config.positions.text_len), grids.c_str(), static_cast<long long>(seq),
      static_cast<long long>(config.heads), kHeadDim, dtype_name(config.dtype));
  std::printf("  [1/6] positions                     %9.1f ms\n", clock.lap_ms());

  const RopeTables tables = build_rope_tables(positions.front().data(), seq);
  std::printf("  [2/6] cos/sin tables [%lld, %lld]       %9.1f ms\n", static_cast<long long>(seq),
              static_cast<long long>(tables.columns), clock.lap_ms());

  Random random(config.seed);
  const std::vector<std::int64_t> sample_shape{1, seq, config.heads, kHeadDim};
  Stage stage;
  stage.mode = diffusers ? NormMode::Diffusers : NormMode::Single;
  stage.rope = {diffusers ? Pairing::Interleaved : Pairing::Half, Layout::BSHD};
  stage.text_len = config.positions.text_len;
  stage.cos = ConstTensorView::contiguous(tables.cos.data(), DType::F32, {seq, tables.columns});
  stage.sin = ConstTensorView::contiguous(tables.sin.data(), DType::F32, {seq, tables.columns});
  if (diffusers) {
    // Weights near 1, as trained RMSNorm weights are.
    for (NormWeights* w : {&stage.q, &stage.k}) {
      w->text = random_tensor(random, config.dtype, {kHeadDim}, 0.5f, 1.0f);
      w->image = random_tensor(random, config.dtype, {kHeadDim}, 0.5f, 1.0f);
    }
  }

  // q and k of one sample: unfused ops, judged against the oracle.
  struct Sample {
    const NormWeights* weights;
    NpyArray x, normed, out;
  };
  std::vector<Sample> samples;
  for (const NormWeights* weights : {&stage.q, &stage.k}) {
    NpyArray x = random_tensor(random, config.dtype, sample_shape, -4.0f, 8.0f);
    NpyArray normed = float_array_like(x, config.dtype);
    NpyArray out = float_array_like(x, config.dtype);
    samples.push_back({weights, std::move(x), std::move(normed), std::move(out)});
  }
  clock.lap_ms();
  for (Sample& s : samples) norm_then_rope(stage, *s.weights, s.x, s.normed, s.out);
  std::printf("  [3/6] q, k: qk_rmsnorm (%s%s) then multi_axis_rope (%s, bshd) %9.1f ms\n",
              norm_mode_name(stage.mode), diffusers ? ", text/image weights" : ", no weight",
              pairing_name(stage.rope.pairing), clock.lap_ms());
  std::printf("        ran on %s\n", backend_choice().c_str());

  OracleVerdict verdict;
  for (const Sample& s : samples)
    judge_with_oracle(stage, *s.weights, s.x, s.normed, s.out, verdict);
  const bool oracle_pass = verdict.outside == 0;
  std::printf(
      "  [4/6] fp64 oracle: %lld values, %lld outside the bound, worst error/bound %.3f: %s"
      "  (%.1f ms)\n",
      static_cast<long long>(verdict.checked), static_cast<long long>(verdict.outside),
      verdict.worst_ratio, oracle_pass ? "PASS" : "FAIL", clock.lap_ms());

  // The fused op must give the unfused bytes.
  const std::array<NpyArray, 2> fused =
      fused_norm_rope(stage, samples[0].x, samples[1].x, config.dtype);
  const double fused_ms = clock.lap_ms();
  const bool fused_equal =
      fused[0].data == samples[0].out.data && fused[1].data == samples[1].out.data;
  std::printf("  [5/6] fused qk_norm_rope == unfused bytes: %s  (%.1f ms)\n",
              fused_equal ? "PASS" : "FAIL", fused_ms);

  // A sample's bytes must not depend on its batch neighbours.
  const std::int64_t slot = config.batch / 2;
  const NpyArray qb = batch_around(samples[0].x, random, config.dtype, config.batch, slot);
  const NpyArray kb = batch_around(samples[1].x, random, config.dtype, config.batch, slot);
  clock.lap_ms();
  const std::array<NpyArray, 2> batched = fused_norm_rope(stage, qb, kb, config.dtype);
  const bool invariant = batch_invariant(samples[0].out, batched[0], slot) &&
                         batch_invariant(samples[1].out, batched[1], slot);
  std::printf(
      "  [6/6] batch invariance: sample alone == slot %lld of a batch of %lld: %s  (%.1f ms)\n",
      static_cast<long long>(slot), static_cast<long long>(config.batch),
      invariant ? "PASS" : "FAIL", clock.lap_ms());
  const bool pass = oracle_pass && fused_equal && invariant;
  if (!config.trace.empty()) {
    set_trace_path("");
    std::printf("  trace: one record per call in %s (compare runs with kernel-align trace diff)\n",
                config.trace.c_str());
  }
  if (fallback_count() > 0) {
    std::printf("  %llu call(s) fell back to another backend (see the warning above)\n",
                static_cast<unsigned long long>(fallback_count()));
  }
  std::printf("  total %.2f s: %s\n", clock.total_s(), pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

}  // namespace

int run_main_job(const std::vector<std::string>& tokens) {
  const JobConfig config = parse_config(tokens);
  if (config.trace.empty()) return run_job(config);
  // The trace's errors, at its opening or at any record (a full disk; a FIFO whose reader
  // left, EPIPE), name --trace; one of KERNEL_ALIGN_TRACE's keeps the library's name.
  return call_library({{"trace", "--trace"}}, [&] { return run_job(config); });
}

}  // namespace kernel_align::cli
