// Operators that are not kernels: token positions, RoPE tables and the runtime settings
// (the registry's backend choice, strict mode and trace; threads). They are torch
// operators too so that the extension needs no second binding layer; they take and
// return plain values and CPU tensors.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "kernel_align/error.hpp"
#include "kernel_align/positions.hpp"
#include "kernel_align/registry.hpp"
#include "kernel_align/runtime.hpp"
#include "kernel_align/tables.hpp"
#include "kernel_align/trace.hpp"
#include "kernel_align/version.hpp"
#include "views.hpp"

namespace kernel_align::torch_ext {
namespace {

constexpr std::array kLayouts{PositionLayout::Seed, PositionLayout::Diffusers};

std::int32_t frame_of(std::int64_t frame) {
  if (frame < std::numeric_limits<std::int32_t>::min() ||
      frame > std::numeric_limits<std::int32_t>::max()) {
    throw Error("frames", "values that fit int32", std::to_string(frame));
  }
  return static_cast<std::int32_t>(frame);
}

// The library's arguments as kernel_align.qwen_image_positions(text_len, h, w) (the seed
// layout, one image) and qwen_image_rope_positions(img_shapes, txt_seq_len) (diffusers')
// name them.
constexpr Rename kSeedPositionNames[] = {
    {"images[0].height", "h"}, {"images[0].width", "w"}, {"images*", "h, w"}};
constexpr Rename kDiffusersPositionNames[] = {
    {"text_len", "txt_seq_len"}, {"images*", "img_shapes"}, {"frames", "img_shapes"}};

// int32 [S, 3] positions of the sequence [text, image 0, image 1, ...]. `frames` is empty
// (each image's frame is its index) or gives every image's frame.
at::Tensor positions(c10::string_view layout, std::int64_t text_len, at::IntArrayRef heights,
                     at::IntArrayRef widths, at::IntArrayRef frames) {
  constexpr const char* op = "positions";
  const Renames names = layout == "seed"        ? Renames(kSeedPositionNames)
                        : layout == "diffusers" ? Renames(kDiffusersPositionNames)
                                                : Renames();
  return translate_errors(op, names, [&] {
    PositionRequest request;
    request.layout = parse("layout", layout, kLayouts, position_layout_name);
    request.text_len = text_len;
    if (heights.size() != widths.size() || (!frames.empty() && frames.size() != heights.size())) {
      throw Error("heights, widths, frames", "lists of one length (frames may be empty)",
                  "lengths " + std::to_string(heights.size()) + ", " +
                      std::to_string(widths.size()) + ", " + std::to_string(frames.size()));
    }
    for (std::size_t i = 0; i < heights.size(); ++i) {
      ImageGrid grid{heights[i], widths[i], std::nullopt};
      if (!frames.empty()) grid.frame = frame_of(frames[i]);
      request.images.push_back(grid);
    }
    const std::vector<Position> built = build_positions(request);
    at::Tensor out = at::empty({static_cast<std::int64_t>(built.size()), kPositionAxes},
                               at::TensorOptions().dtype(at::kInt));
    std::memcpy(out.mutable_data_ptr(), built.data(), built.size() * sizeof(Position));
    return out;
  });
}

// The table spec's members are kernel_align.rope_tables' arguments.
constexpr Rename kTableNames[] = {{"spec.theta", "theta"}, {"spec.axes_dim*", "axes_dim*"}};

// cos and sin, fp32 [S, D/2], of int32 positions [S, len(axes_dim)].
std::tuple<at::Tensor, at::Tensor> rope_tables(const at::Tensor& positions,
                                               at::IntArrayRef axes_dim, double theta) {
  constexpr const char* op = "rope_tables";
  return translate_errors(op, kTableNames, [&] {
    TORCH_CHECK_TYPE(positions.scalar_type() == at::kInt,
                     "kernel_align.rope_tables: argument 'positions': expected dtype torch.int32, "
                     "found ",
                     torch_dtype_name(positions.scalar_type()));
    if (!positions.device().is_cpu()) {
      throw Error("positions", "a CPU tensor", "one on " + positions.device().str());
    }
    if (positions.dim() != 2 || positions.size(1) != static_cast<std::int64_t>(axes_dim.size())) {
      throw Error("positions",
                  "shape [S, " + std::to_string(axes_dim.size()) + "] (one column per axis)",
                  "shape " + std::string(c10::str(positions.sizes())));
    }
    RopeTableSpec spec;
    spec.axes_dim.clear();
    for (const std::int64_t d : axes_dim) {
      if (d < 1 || d > kMaxHeadDim) {
        throw Error("axes_dim", "dims from 1 to " + std::to_string(kMaxHeadDim), std::to_string(d));
      }
      spec.axes_dim.push_back(static_cast<int>(d));
    }
    spec.theta = fp32_option("theta", theta);
    // The builder reads rows of int32: a copy only when the caller's tensor is strided.
    const at::Tensor rows = positions.contiguous();
    const RopeTables tables =
        build_rope_tables(rows.const_data_ptr<std::int32_t>(), rows.size(0), spec);
    const auto table = [&](const std::vector<float>& values) {
      at::Tensor t =
          at::empty({tables.rows, tables.columns}, at::TensorOptions().dtype(at::kFloat));
      std::memcpy(t.mutable_data_ptr(), values.data(), values.size() * sizeof(float));
      return t;
    };
    return std::tuple{table(tables.cos), table(tables.sin)};
  });
}

// The spec's members are kernel_align.timestep_embedding's arguments.
constexpr Rename kTimestepNames[] = {{"spec.channels", "channels"},
                                     {"spec.downscale_freq_shift", "downscale_freq_shift"},
                                     {"spec.scale", "scale"},
                                     {"spec.max_period", "max_period"}};

// fp32 [n, channels] of fp32 timesteps [n] (a CPU tensor; the Python wrapper moves it).
at::Tensor timestep_embedding(const at::Tensor& timesteps, std::int64_t channels,
                              bool flip_sin_to_cos, double downscale_freq_shift, double scale,
                              double max_period) {
  constexpr const char* op = "timestep_embedding";
  return translate_errors(op, kTimestepNames, [&] {
    if (timesteps.scalar_type() != at::kFloat || !timesteps.device().is_cpu() ||
        timesteps.dim() != 1) {
      throw Error("timesteps", "a 1-D fp32 CPU tensor [n]",
                  std::string(c10::str(timesteps.scalar_type(), " ", timesteps.sizes(), " on ",
                                       timesteps.device())));
    }
    if (channels < 1 || channels > kMaxHeadDim) {
      throw Error("channels", "even and in [2, 4096]", std::to_string(channels));
    }
    TimestepEmbeddingSpec spec;
    spec.channels = static_cast<int>(channels);
    spec.flip_sin_to_cos = flip_sin_to_cos;
    spec.downscale_freq_shift = fp32_option("downscale_freq_shift", downscale_freq_shift);
    spec.scale = fp32_option("scale", scale);
    spec.max_period = fp32_option("max_period", max_period);
    const at::Tensor rows = timesteps.contiguous();
    const std::vector<float> values =
        build_timestep_embedding(rows.const_data_ptr<float>(), rows.size(0), spec);
    at::Tensor out = at::empty({rows.size(0), channels}, at::TensorOptions().dtype(at::kFloat));
    std::memcpy(out.mutable_data_ptr(), values.data(), values.size() * sizeof(float));
    return out;
  });
}

// The options of a module, checked when it is built by the rules the ops apply when
// called (nothing runs, so nothing is traced): any that is given.
void check_options(std::optional<std::int64_t> head_dim, std::optional<double> eps,
                   std::optional<c10::string_view> mode, std::optional<c10::string_view> pairing,
                   std::optional<c10::string_view> layout) {
  translate_errors("check_options", [&] {
    if (head_dim && (*head_dim < 2 || *head_dim > kMaxHeadDim || *head_dim % 2 != 0)) {
      throw Error("dim", "an even head dim from 2 to " + std::to_string(kMaxHeadDim),
                  std::to_string(*head_dim));
    }
    if (eps) {
      const float value = fp32_option("eps", *eps);
      if (value < 0.0f) throw Error("eps", "a finite number >= 0", std::to_string(*eps));
    }
    if (mode) norm_mode_from_name(*mode);
    if (pairing) pairing_from_name(*pairing);
    if (layout) layout_from_name(*layout);
  });
}

// Whether this extension runs CUDA tensors (built with the library's CUDA backend).
bool has_cuda() {
  return kCudaBuild;
}

std::vector<std::string> backends() {
  return translate_errors("backends", [] { return backend_names(); });
}

// "" restores the platform's own order.
void set_backend(c10::string_view name) {
  static constexpr Rename kNames[] = {{"backend", "name"}};
  translate_errors("set_backend", kNames, [&] { kernel_align::set_backend(name); });
}

std::string get_backend() {
  return translate_errors("get_backend", [] { return backend_override(); });
}

void set_strict(bool on) {
  translate_errors("set_strict", [&] { kernel_align::set_strict(on); });
}

bool get_strict() {
  return translate_errors("get_strict", [] { return strict(); });
}

// "" stops tracing.
void set_trace_path(c10::string_view path) {
  translate_errors("set_trace_path", [&] { kernel_align::set_trace_path(std::string(path)); });
}

std::string get_trace_path() {
  return translate_errors("get_trace_path", [] { return kernel_align::trace_path(); });
}

// digest-v1 (docs/trace.md) of each index of `batch_dim` of `tensor`, or of the whole
// tensor when it is None: 16 hex digits each, the library's own digest code, for
// kernel_align.alignment's module records. Any dtype (the digest covers storage bytes);
// a device tensor is copied to the host first, and a lazily conjugated or negated one
// is resolved, so that the bytes digested are the values the tensor holds.
std::vector<std::string> digests(const at::Tensor& tensor, std::optional<std::int64_t> batch_dim) {
  constexpr const char* op = "digests";
  return translate_errors(op, [&] {
    if (tensor.layout() != at::kStrided || tensor.is_nested()) {
      throw Error("tensor", "a strided (dense) tensor", "layout " + c10::str(tensor.layout()));
    }
    if (batch_dim && (*batch_dim < 0 || *batch_dim >= tensor.dim())) {
      throw Error("batch_dim",
                  "a dim from 0 to " + std::to_string(tensor.dim() - 1) +
                      " (the tensor's rank is " + std::to_string(tensor.dim()) + ")",
                  std::to_string(*batch_dim));
    }
    // Bounded as every op is: by what the memory could hold (an expanded view of a few
    // bytes can stand for more elements than could ever be digested), counted before the
    // copy to the host, which may materialise them.
    std::uint64_t bytes = tensor.element_size();
    bool overflow = false;
    for (const std::int64_t size : tensor.sizes()) {
      overflow =
          __builtin_mul_overflow(bytes, static_cast<std::uint64_t>(size), &bytes) || overflow;
    }
    overflow = overflow && std::ranges::find(tensor.sizes(), 0) == tensor.sizes().end();
    const std::uint64_t limit = memory_bytes(at::Device(at::kCPU));
    if (overflow || bytes > limit) {
      throw Error("tensor",
                  "a tensor whose elements fit in the memory of cpu (" + std::to_string(limit) +
                      " bytes of RAM and swap)",
                  "shape " + c10::str(tensor.sizes()) + " (" +
                      (overflow ? std::string("2^64 or more") : std::to_string(bytes)) + " bytes)");
    }
    const at::Tensor host = tensor.resolve_conj().resolve_neg().cpu();
    StridedBytes array;
    array.data = host.const_data_ptr();
    array.element_size = host.element_size();
    array.shape = std::span(host.sizes().data(), host.sizes().size());
    array.strides = std::span(host.strides().data(), host.strides().size());
    std::vector<std::string> hex;
    const auto dim = batch_dim ? std::optional(static_cast<std::size_t>(*batch_dim)) : std::nullopt;
    for (const std::uint64_t d : digests_along(array, dim)) {
      char text[20];
      std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(d));
      hex.emplace_back(text);
    }
    return hex;
  });
}

// Appends a record to the open trace in the library's sequence (trace.hpp); false when
// tracing is off.
bool append_trace_record(c10::string_view members) {
  return translate_errors("append_trace_record", [&] {
    return kernel_align::append_trace_record(std::string_view(members.data(), members.size()));
  });
}

// What the last call of this thread ran on: requested backend, backend, ISA path, the
// fallback reason ("" when it did not fall back), the backend's and the whole library
// call's wall times.
std::tuple<std::string, std::string, std::string, std::string, double, double> last_call() {
  return translate_errors("last_call", [] {
    const CallReport r = kernel_align::last_call();
    return std::make_tuple(r.requested_backend, r.backend, r.isa, r.fallback, r.backend_seconds,
                           r.call_seconds);
  });
}

std::int64_t fallback_count() {
  return translate_errors("fallback_count",
                          [] { return static_cast<std::int64_t>(kernel_align::fallback_count()); });
}

void set_num_threads(std::int64_t n) {
  static constexpr Rename kNames[] = {{"threads", "n"}};
  translate_errors("set_num_threads", kNames, [&] { kernel_align::set_num_threads(n); });
}

std::int64_t get_num_threads() {
  return translate_errors("get_num_threads", [] { return std::int64_t{num_threads()}; });
}

// The SDE step's per-step constants (flow_sde_coefficients), in FlowSdeCoefficients'
// order. A double argument is taken as the fp32 value nearest to it, as every fp32 option.
std::vector<double> flow_sde_coefficients(double sigma, double sigma_prev, double noise_level,
                                          double sigma_max) {
  return translate_errors("flow_sde_coefficients", [&] {
    const FlowSdeCoefficients c = kernel_align::flow_sde_coefficients(
        fp32_option("sigma", sigma), fp32_option("sigma_prev", sigma_prev),
        fp32_option("noise_level", noise_level), fp32_option("sigma_max", sigma_max));
    return std::vector<double>{c.x_scale, c.v_scale, c.noise_scale, c.inverse_two_variance,
                               c.log_normalizer};
  });
}

// The library's version (kernel_align.__version__ reads it) and the contract's.
std::string library_version() {
  return kernel_align::version();
}
std::string library_contract_version() {
  return kernel_align::contract_version();
}

}  // namespace
}  // namespace kernel_align::torch_ext

TORCH_LIBRARY_FRAGMENT(kernel_align, m) {
  namespace ext = kernel_align::torch_ext;
  m.def("positions(str layout, int text_len, int[] heights, int[] widths, int[] frames) -> Tensor",
        &ext::positions);
  m.def("rope_tables(Tensor positions, int[] axes_dim, float theta) -> (Tensor cos, Tensor sin)",
        &ext::rope_tables);
  m.def(
      "timestep_embedding(Tensor timesteps, int channels, bool flip_sin_to_cos, "
      "float downscale_freq_shift, float scale, float max_period) -> Tensor",
      &ext::timestep_embedding);
  m.def(
      "flow_sde_coefficients(float sigma, float sigma_prev, float noise_level, "
      "float sigma_max) -> float[]",
      &ext::flow_sde_coefficients);
  m.def("check_options(int? head_dim, float? eps, str? norm_mode, str? pairing, str? layout) -> ()",
        &ext::check_options);
  m.def("has_cuda() -> bool", &ext::has_cuda);
  m.def("backends() -> str[]", &ext::backends);
  m.def("set_backend(str name) -> ()", &ext::set_backend);
  m.def("get_backend() -> str", &ext::get_backend);
  m.def("set_strict(bool on) -> ()", &ext::set_strict);
  m.def("get_strict() -> bool", &ext::get_strict);
  m.def("set_trace_path(str path) -> ()", &ext::set_trace_path);
  m.def("get_trace_path() -> str", &ext::get_trace_path);
  m.def("digests(Tensor tensor, int? batch_dim) -> str[]", &ext::digests);
  m.def("append_trace_record(str members) -> bool", &ext::append_trace_record);
  m.def("last_call() -> (str, str, str, str, float, float)", &ext::last_call);
  m.def("fallback_count() -> int", &ext::fallback_count);
  m.def("set_num_threads(int n) -> ()", &ext::set_num_threads);
  m.def("get_num_threads() -> int", &ext::get_num_threads);
  m.def("version() -> str", &ext::library_version);
  m.def("contract_version() -> str", &ext::library_contract_version);
}
