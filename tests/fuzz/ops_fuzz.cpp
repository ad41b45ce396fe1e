// libFuzzer target, differential: every op through the public API on views decoded from
// the input, all pointing into one arena: shapes (small, or near integer overflow),
// strides (any: zero, overlapping, huge), dtypes, layouts, modes, pairings, eps,
// text_len, linear's activations and optional gradients, attention's masks and layouts,
// adaln_modulation's and adaln_gate_residual's modulations ([B, D] or [B, 1, D]) and optional
// gradients, the activation's kinds and ranks, the SDE step's and log-probability's steps
// (valid or not), per-sample vectors and optional gradients, the latent normalization's
// transforms, ranks and per-channel constants (of C or another length), the patchify's
// latents (H and W mostly even) and tokens (mostly of the latents' shape and dtype), the
// guidance's rows, scales (finite or not) and optional gradients, bool
// tensors where numbers belong, outputs in place or anywhere (overlapping
// inputs and each other, or beside them with the same strides: byte ranges that interleave, with or
// without a common element), pointers off their dtype's alignment. The validation must accept a
// call or throw kernel_align::Error; a call whose views reach past the arena (a view that is never
// allocated whole) is only validated, directly, and must touch nothing. Whatever is
// accepted, every backend and path (simd at every ISA path and 1 or 3 threads, the CUDA
// kernels on the grid emulator) must leave the arena byte for byte as the reference does.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <fuzzer/FuzzedDataProvider.h>

#include "api/ops/activation.hpp"
#include "api/ops/adaln_gate_residual.hpp"
#include "api/ops/adaln_modulation.hpp"
#include "api/ops/attention.hpp"
#include "api/ops/flow_sde.hpp"
#include "api/ops/latent.hpp"
#include "api/ops/linear.hpp"
#include "api/ops/multi_axis_rope.hpp"
#include "api/ops/qk_norm_rope.hpp"
#include "api/ops/qk_rmsnorm.hpp"
#include "api/ops/true_cfg.hpp"
#include "cuda/emulator/emulated_backend.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/registry.hpp"
#include "kernel_align/runtime.hpp"
#include "registry/registry.hpp"

namespace {

using namespace kernel_align;

constexpr std::size_t kArenaBytes = std::size_t{1} << 18;

struct Arena {
  alignas(64) std::byte bytes[kArenaBytes];
};

// Decodes the views and options of one call.
class Decoder {
 public:
  Decoder(FuzzedDataProvider& f, Arena& arena) : f_(f), arena_(arena) {}

  // Mostly a floating type; sometimes Bool, which every tensor of numbers must refuse.
  DType dtype() {
    return f_.ConsumeIntegralInRange<int>(0, 31) == 0
               ? DType::Bool
               : static_cast<DType>(f_.ConsumeIntegralInRange<int>(0, 2));
  }

  // Mostly small, sometimes a dim near the limits of int64 arithmetic.
  std::int64_t dim(std::int64_t small_max) {
    switch (f_.ConsumeIntegralInRange<int>(0, 31)) {
      case 0:
        return std::int64_t{1} << f_.ConsumeIntegralInRange<int>(20, 62);
      case 1:
        return f_.ConsumeIntegral<std::int64_t>();
      case 2:
        return 0;
      default:
        return f_.ConsumeIntegralInRange<std::int64_t>(1, small_max);
    }
  }

  // A view of `rank` dims with last dim `d` (a dim of its own when d == 0).
  TensorView view(DType t, int rank, const std::int64_t* shape) {
    TensorView v;
    v.dtype = t;
    v.rank = rank;
    std::int64_t step = 1;
    for (int i = rank - 1; i >= 0; --i) {
      v.shape[i] = shape[i];
      switch (f_.ConsumeIntegralInRange<int>(0, 15)) {
        case 0:
          v.strides[i] = f_.ConsumeIntegralInRange<std::int64_t>(0, 64);
          break;
        case 1:
          v.strides[i] = std::int64_t{1} << f_.ConsumeIntegralInRange<int>(16, 62);
          break;
        case 2:
          v.strides[i] = f_.ConsumeIntegral<std::int64_t>();
          break;
        default:
          v.strides[i] = step;
      }
      const __int128 next = static_cast<__int128>(step) * (shape[i] > 0 ? shape[i] : 1);
      step = next < (__int128{1} << 62) ? static_cast<std::int64_t>(next) : step;
    }
    std::size_t offset = f_.ConsumeIntegralInRange<std::size_t>(0, kArenaBytes / 2);
    if (f_.ConsumeIntegralInRange<int>(0, 15) != 0) offset -= offset % dtype_size(t);
    v.data = arena_.bytes + offset;
    return v;
  }

  // Mostly a view of its own; sometimes one beside `like` (beside()).
  TensorView same_shape(DType t, const ConstTensorView& like) {
    if (f_.ConsumeIntegralInRange<int>(0, 3) == 0) return beside(t, like, like.shape.data());
    return view(t, like.rank, like.shape.data());
  }

  // A view of `shape` (near's rank) with near's strides, its data 0 to 64 elements after
  // near's: views of one buffer as a framework makes them, whose byte ranges interleave
  // (packed QKV, the halves of rows, every other element) with or without a common
  // element.
  TensorView beside(DType t, const ConstTensorView& near, const std::int64_t* shape) {
    TensorView v;
    v.dtype = t;
    v.rank = near.rank;
    for (int i = 0; i < v.rank; ++i) v.shape[i] = shape[i];
    v.strides = near.strides;
    const std::size_t offset =
        static_cast<std::size_t>(static_cast<const std::byte*>(near.data) - arena_.bytes) +
        f_.ConsumeIntegralInRange<std::size_t>(0, 64) * dtype_size(t);
    v.data = arena_.bytes + std::min(offset, kArenaBytes - 1);
    return v;
  }

  std::optional<ConstTensorView> weight(std::int64_t d) {
    if (!f_.ConsumeBool()) return std::nullopt;
    return view(dtype(), 1, &d);
  }
  float eps() {
    switch (f_.ConsumeIntegralInRange<int>(0, 7)) {
      case 0:
        return f_.ConsumeFloatingPoint<float>();
      case 1:
        return 0.0f;
      default:
        return 1e-6f;
    }
  }
  NormMode mode() { return f_.ConsumeBool() ? NormMode::Diffusers : NormMode::Single; }
  RopeOptions rope() {
    return {f_.ConsumeBool() ? Pairing::Half : Pairing::Interleaved,
            f_.ConsumeBool() ? Layout::BSHD : Layout::BHSD};
  }
  bool coin() { return f_.ConsumeBool(); }
  std::int64_t small(std::int64_t lo, std::int64_t hi) {
    return f_.ConsumeIntegralInRange<std::int64_t>(lo, hi);
  }

 private:
  FuzzedDataProvider& f_;
  Arena& arena_;
};

// Whether every element `v` can touch lies in the arena (overflow-safe).
bool inside(const ConstTensorView& v, const Arena& arena) {
  // Each span is below 2^126 in magnitude, but four of them and the byte size can pass
  // 2^127: a view whose spans add up past the arena's size is outside it, and the sums
  // stop there.
  constexpr __int128 kFar = static_cast<__int128>(1) << 100;
  __int128 first = 0;
  __int128 last = 0;
  for (int i = 0; i < v.rank; ++i) {
    if (v.shape[i] <= 0) return false;
    const __int128 span = static_cast<__int128>(v.shape[i] - 1) * v.strides[i];
    if (span <= -kFar || span >= kFar) return false;
    (span < 0 ? first : last) += span;
  }
  const auto* base = static_cast<const std::byte*>(v.data);
  const __int128 begin = (base - arena.bytes) + first * static_cast<__int128>(dtype_size(v.dtype));
  const __int128 end =
      (base - arena.bytes) + (last + 1) * static_cast<__int128>(dtype_size(v.dtype));
  return begin >= 0 && end <= static_cast<__int128>(kArenaBytes);
}

// One decoded call: the tensors it names and how to make it.
struct Call {
  std::vector<ConstTensorView> views;
  std::function<void()> run;       // through the public API
  std::function<void()> validate;  // the validation alone (detail::*_call)
};

Call decode(FuzzedDataProvider& f, Arena& arena) {
  Decoder in(f, arena);
  Call call;
  const int op = f.ConsumeIntegralInRange<int>(0, 25);
  const std::int64_t half = in.dim(40);  // D = 2 * half, or whatever half is when unusual
  const std::int64_t d = half > 0 && half < (std::int64_t{1} << 40) ? 2 * half : half;
  const auto add = [&](const auto& v) {
    if (v) call.views.push_back(*v);
  };
  if (op >= 24) {  // true_cfg: rows [..., D], rank 1 to 4; v in place or not; any scale
    const std::int64_t shape[4] = {in.dim(3), in.dim(5), in.dim(3), d};
    const int rank = static_cast<int>(in.small(1, 4));
    const TensorView cond = in.view(in.dtype(), rank, shape + (4 - rank));
    const TensorView uncond = in.same_shape(in.dtype(), cond);
    const TrueCfgOptions options{in.small(0, 7) == 0 ? INFINITY
                                                     : static_cast<float>(in.small(-4, 8))};
    if (op == 24) {
      const TensorView v = in.coin() ? uncond : in.same_shape(in.dtype(), cond);
      call.views = {cond, uncond, v};
      call.run = [=] { true_cfg_forward(cond, uncond, v, options); };
      call.validate = [=] { detail::true_cfg_forward_call(cond, uncond, v, options); };
    } else {
      const TensorView dv = in.same_shape(in.dtype(), cond);
      std::optional<TensorView> dcond, duncond;
      if (in.coin()) dcond = in.same_shape(in.dtype(), cond);
      if (in.coin()) duncond = in.same_shape(in.dtype(), cond);
      call.views = {cond, uncond, dv};
      add(dcond);
      add(duncond);
      call.run = [=] { true_cfg_backward(cond, uncond, dv, dcond, duncond, options); };
      call.validate = [=] {
        detail::true_cfg_backward_call(cond, uncond, dv, dcond, duncond, options);
      };
    }
    return call;
  }
  if (op >= 22) {  // latent_pack: latents [B, C, H, W] (H, W mostly even), tokens [B, S, 4C]
    const auto mostly_even = [&](std::int64_t small_max) {
      const std::int64_t h = in.dim(small_max);
      if (h <= 0 || h >= (std::int64_t{1} << 40)) return h;
      return 2 * h + (in.small(0, 7) == 0 ? 1 : 0);
    };
    const DType t = in.dtype();
    const std::int64_t shape[4] = {in.dim(3), in.dim(5), mostly_even(4), mostly_even(6)};
    // Mostly rank 4; sometimes its last three dims alone.
    const int rank = in.small(0, 7) == 0 ? 3 : 4;
    const TensorView latents = in.view(t, rank, shape + (4 - rank));
    // The tokens' shape where the dims are small enough to compute it; sometimes one dim off.
    const bool small = std::all_of(
        shape, shape + 4, [](std::int64_t s) { return s > 0 && s < (std::int64_t{1} << 20); });
    std::int64_t tokens_shape[3] = {shape[0], small ? (shape[2] / 2) * (shape[3] / 2) : in.dim(9),
                                    small ? 4 * shape[1] : in.dim(40)};
    if (small && in.small(0, 7) == 0) tokens_shape[in.small(0, 2)] += in.small(-1, 1);
    const DType token_dtype = in.small(0, 7) == 0 ? in.dtype() : t;
    TensorView tokens = in.view(token_dtype, in.small(0, 7) == 0 ? 2 : 3, tokens_shape);
    // The output sometimes over its input's memory (refused: a permutation never is in place).
    if (in.small(0, 7) == 0) tokens.data = latents.data;
    if (op == 22) {
      call.views = {latents, tokens};
      call.run = [=] { latent_pack_forward(latents, tokens); };
      call.validate = [=] { detail::latent_pack_forward_call(latents, tokens); };
    } else {
      call.views = {tokens, latents};
      call.run = [=] { latent_pack_backward(tokens, latents); };
      call.validate = [=] { detail::latent_pack_backward_call(tokens, latents); };
    }
    return call;
  }
  if (op >= 20) {  // latent_normalize: z of rank 2 to 4, [C] constants, the output in place or not
    const LatentNormalizeOptions options{in.coin() ? LatentTransform::Denormalize
                                                   : LatentTransform::Normalize};
    const std::int64_t shape[4] = {in.dim(3), in.dim(17), in.dim(5), in.dim(40)};
    const int rank = static_cast<int>(in.small(2, 4));
    const TensorView z = in.view(in.dtype(), rank, shape + (4 - rank));
    const auto constants = [&] {
      const std::int64_t channels[1] = {in.small(0, 7) == 0 ? in.dim(17) : z.shape[1]};
      return in.view(in.coin() ? DType::F32 : in.dtype(), 1, channels);
    };
    const TensorView std_dev = constants();
    const TensorView out = in.coin() ? z : in.same_shape(in.dtype(), z);
    if (op == 20) {
      const TensorView mean = constants();
      call.views = {z, mean, std_dev, out};
      call.run = [=] { latent_normalize_forward(z, mean, std_dev, out, options); };
      call.validate = [=] {
        detail::latent_normalize_forward_call(z, mean, std_dev, out, options);
      };
    } else {
      call.views = {z, std_dev, out};
      call.run = [=] { latent_normalize_backward(z, std_dev, out, options); };
      call.validate = [=] { detail::latent_normalize_backward_call(z, std_dev, out, options); };
    }
    return call;
  }
  if (op >= 16) {  // flow_sde_step, flow_sde_logp: latents of rank 2 to 4, steps valid or not
    const auto pick = [&](std::initializer_list<float> values) {
      return values.begin()[in.small(0, static_cast<std::int64_t>(values.size()) - 1)];
    };
    const FlowSdeOptions options{pick({0.8f, 1.0f, 0.02f, 0.0f, 1.5f}),
                                 pick({0.6f, 0.0f, 0.8f, -0.1f}), pick({0.7f, 1e-20f, 1e30f}),
                                 pick({0.9f, 0.0f})};
    const std::int64_t shape[4] = {in.dim(3), in.dim(5), in.dim(3), in.dim(70)};
    const int rank = static_cast<int>(in.small(2, 4));
    const TensorView x = in.view(in.dtype(), rank, shape + (4 - rank));
    const std::int64_t samples[1] = {x.shape[0]};
    const auto per_sample = [&] {
      return in.view(in.coin() ? DType::F32 : in.dtype(), 1, samples);
    };
    const auto optional_grad = [&](const TensorView& like) {
      return in.coin() ? std::optional<TensorView>(in.same_shape(in.dtype(), like)) : std::nullopt;
    };
    if (op == 17) {  // the step's backward: x stands for dprev
      const std::optional<TensorView> dx = optional_grad(x), dv = optional_grad(x);
      call.views = {x};
      add(dx);
      add(dv);
      call.run = [=] { flow_sde_step_backward(x, dx, dv, options); };
      call.validate = [=] { detail::flow_sde_step_backward_call(x, dx, dv, options); };
      return call;
    }
    const TensorView v = in.same_shape(in.dtype(), x);
    const TensorView third = in.same_shape(in.dtype(), x);  // noise, or prev
    if (op == 16) {
      const TensorView prev = in.coin() ? (in.coin() ? x : third) : in.same_shape(in.dtype(), x);
      call.views = {x, v, third, prev};
      call.run = [=] { flow_sde_step_forward(x, v, third, prev, options); };
      call.validate = [=] { detail::flow_sde_step_forward_call(x, v, third, prev, options); };
      return call;
    }
    if (op == 18) {
      const TensorView logp = per_sample();
      call.views = {x, v, third, logp};
      call.run = [=] { flow_sde_logp_forward(x, v, third, logp, options); };
      call.validate = [=] { detail::flow_sde_logp_forward_call(x, v, third, logp, options); };
      return call;
    }
    const TensorView dlogp = per_sample();
    const std::optional<TensorView> dx =
        in.coin() ? std::optional<TensorView>(x) : optional_grad(x);
    const std::optional<TensorView> dv = optional_grad(x);
    call.views = {x, v, third, dlogp};
    add(dx);
    add(dv);
    call.run = [=] { flow_sde_logp_backward(x, v, third, dlogp, dx, dv, options); };
    call.validate = [=] {
      detail::flow_sde_logp_backward_call(x, v, third, dlogp, dx, dv, options);
    };
    return call;
  }
  if (op >= 14) {  // activation: x of rank 1 to 4, the output in place or anywhere
    const ActivationOptions options{static_cast<Activation>(in.small(0, 2))};
    const std::int64_t shape[4] = {in.dim(3), in.dim(5), in.dim(3), in.dim(40)};
    const int rank = static_cast<int>(in.small(1, 4));
    const TensorView x = in.view(in.dtype(), rank, shape + (4 - rank));
    if (op == 14) {
      const TensorView y = in.coin() ? x : in.same_shape(in.dtype(), x);
      call.views = {x, y};
      call.run = [=] { activation_forward(x, y, options); };
      call.validate = [=] { detail::activation_forward_call(x, y, options); };
      return call;
    }
    const TensorView dy = in.same_shape(in.dtype(), x);
    const TensorView dx = in.coin() ? (in.coin() ? x : dy) : in.same_shape(in.dtype(), x);
    call.views = {x, dy, dx};
    call.run = [=] { activation_backward(x, dy, dx, options); };
    call.validate = [=] { detail::activation_backward_call(x, dy, dx, options); };
    return call;
  }
  if (op >= 10) {  // adaln_modulation, adaln_gate_residual
    const std::int64_t shape[3] = {in.dim(3), in.dim(9), in.dim(40)};
    const TensorView x = in.view(in.dtype(), 3, shape);
    // A sample's modulation, [B, D] or [B, 1, D] (or, as the dims are fuzzed, neither).
    const std::int64_t modulation_shape[3] = {shape[0], 1, shape[2]};
    const bool unsqueezed = in.coin();
    const auto modulation = [&] {
      return unsqueezed ? in.view(in.dtype(), 3, modulation_shape)
                        : in.view(in.dtype(), 2, std::array{shape[0], shape[2]}.data());
    };
    if (op >= 12) {
      const GateResidualOptions options{in.mode()};
      const TensorView gate = modulation();
      const TensorView y = in.same_shape(in.dtype(), x);
      if (op == 12) {
        const TensorView out = in.coin() ? (in.coin() ? x : y) : in.same_shape(in.dtype(), x);
        call.views = {x, gate, y, out};
        call.run = [=] { adaln_gate_residual_forward(x, gate, y, out, options); };
        call.validate = [=] { detail::gate_residual_forward_call(x, gate, y, out, options); };
        return call;
      }
      // x is dout here.
      const TensorView dy = in.coin() ? (in.coin() ? x : y) : in.same_shape(in.dtype(), x);
      std::optional<TensorView> dgate;
      if (in.coin()) dgate = modulation();
      call.views = {gate, y, x, dy};
      add(dgate);
      call.run = [=] { adaln_gate_residual_backward(gate, y, x, dy, dgate, options); };
      call.validate = [=] { detail::gate_residual_backward_call(gate, y, x, dy, dgate, options); };
      return call;
    }
    const TensorView scale = modulation();
    const AdaLnOptions options{in.eps(), in.mode()};
    if (op == 10) {
      const TensorView shift = modulation();
      const TensorView y = in.coin() ? x : in.same_shape(in.dtype(), x);
      call.views = {x, scale, shift, y};
      call.run = [=] { adaln_modulation_forward(x, scale, shift, y, options); };
      call.validate = [=] { detail::adaln_forward_call(x, scale, shift, y, options); };
      return call;
    }
    const TensorView dy = in.same_shape(in.dtype(), x);
    const TensorView dx = in.coin() ? (in.coin() ? x : dy) : in.same_shape(in.dtype(), x);
    std::optional<TensorView> dscale, dshift;
    if (in.coin()) dscale = modulation();
    if (in.coin()) dshift = modulation();
    call.views = {x, scale, dy, dx};
    add(dscale);
    add(dshift);
    call.run = [=] { adaln_modulation_backward(x, scale, dy, dx, dscale, dshift, options); };
    call.validate = [=] { detail::adaln_backward_call(x, scale, dy, dx, dscale, dshift, options); };
    return call;
  }
  if (op >= 8) {  // attention
    const Layout layout = in.coin() ? Layout::BSHD : Layout::BHSD;
    const std::int64_t batch = in.dim(3), seq = in.dim(9), heads = in.dim(3), dim = in.dim(40);
    const std::int64_t shape[4] = {batch, layout == Layout::BSHD ? seq : heads,
                                   layout == Layout::BSHD ? heads : seq, dim};
    const TensorView q = in.view(in.dtype(), 4, shape);
    // k beside q sometimes: a packed QKV's views.
    const TensorView k =
        in.coin() ? in.beside(in.dtype(), q, shape) : in.view(in.dtype(), 4, shape);
    const TensorView v = in.same_shape(in.dtype(), q);
    std::optional<ConstTensorView> mask;
    if (in.coin()) {
      const std::int64_t mask_shape[2] = {batch, seq};
      // Its bytes are the arena's: any values, nonzero ones true.
      mask = in.view(DType::Bool, 2, mask_shape);
    }
    const AttentionOptions options{layout};
    call.views = {q, k, v};
    add(mask);
    if (op == 8) {
      const TensorView out = in.same_shape(in.dtype(), q);
      call.views.push_back(out);
      call.run = [=] { attention_forward(q, k, v, mask, out, options); };
      call.validate = [=] { detail::attention_forward_call(q, k, v, mask, out, options); };
      return call;
    }
    const TensorView out = in.same_shape(in.dtype(), q);
    const TensorView dout = in.same_shape(in.dtype(), q);
    const TensorView dq = in.same_shape(in.dtype(), q);
    const TensorView dk = in.same_shape(in.dtype(), q);
    const TensorView dv = in.same_shape(in.dtype(), q);
    for (const TensorView& t : {out, dout, dq, dk, dv}) call.views.push_back(t);
    call.run = [=] { attention_backward(q, k, v, mask, out, dout, dq, dk, dv, options); };
    call.validate = [=] {
      detail::attention_backward_call(q, k, v, mask, out, dout, dq, dk, dv, options);
    };
    return call;
  }
  if (op >= 6) {  // linear
    const int rank = static_cast<int>(in.small(1, 4));
    const std::int64_t k = in.dim(70), n = in.dim(40);
    std::int64_t x_shape[4] = {in.dim(3), in.dim(4), in.dim(5), k};
    std::int64_t* x_dims = x_shape + (4 - rank);
    const TensorView x = in.view(in.dtype(), rank, x_dims);
    const std::int64_t w_shape[2] = {n, k};
    // Beside x (x's strides: one buffer holding both) only where x is a matrix too.
    const TensorView w = rank == 2 && in.coin() ? in.beside(in.dtype(), x, w_shape)
                                                : in.view(in.dtype(), 2, w_shape);
    std::optional<ConstTensorView> bias;
    if (in.coin()) bias = in.view(in.dtype(), 1, &n);
    std::int64_t y_shape[4] = {x_shape[0], x_shape[1], x_shape[2], n};
    const LinearOptions options{static_cast<Activation>(in.small(0, 2))};
    call.views = {x, w};
    add(bias);
    if (op == 6) {
      const TensorView y = in.view(in.dtype(), rank, y_shape + (4 - rank));
      call.views.push_back(y);
      call.run = [=] { linear_forward(x, w, bias, y, options); };
      call.validate = [=] { detail::linear_forward_call(x, w, bias, y, options); };
      return call;
    }
    const TensorView dy = in.view(in.dtype(), rank, y_shape + (4 - rank));
    std::optional<TensorView> dx, dw, db;
    if (in.coin()) dx = in.same_shape(in.dtype(), x);
    if (in.coin()) dw = in.same_shape(in.dtype(), w);
    if (bias && in.coin()) db = in.view(in.dtype(), 1, &n);
    call.views.push_back(dy);
    add(dx);
    add(dw);
    add(db);
    call.run = [=] { linear_backward(x, w, bias, dy, dx, dw, db, options); };
    call.validate = [=] { detail::linear_backward_call(x, w, bias, dy, dx, dw, db, options); };
    return call;
  }
  if (op <= 1) {  // qk_rmsnorm
    const int rank = static_cast<int>(in.small(1, 4));
    std::int64_t shape[4] = {in.dim(4), in.dim(5), in.dim(3), d};
    std::int64_t* dims = shape + (4 - rank);
    const TensorView x = in.view(in.dtype(), rank, dims);
    const auto weight = in.weight(d);
    const RmsNormOptions options{in.eps(), in.mode()};
    const TensorView out = in.coin() ? x : in.same_shape(in.dtype(), x);
    call.views = {x, out};
    add(weight);
    if (op == 0) {
      call.run = [=] { qk_rmsnorm_forward(x, weight, out, options); };
      call.validate = [=] { detail::rmsnorm_forward_call(x, weight, out, options); };
    } else {
      const TensorView dy = in.same_shape(in.dtype(), x);
      std::optional<TensorView> dw;
      if (weight && in.coin()) dw = in.view(in.dtype(), 1, &d);
      call.views.push_back(dy);
      add(dw);
      call.run = [=] { qk_rmsnorm_backward(x, dy, weight, out, dw, options); };
      call.validate = [=] { detail::rmsnorm_backward_call(x, dy, weight, out, dw, options); };
    }
    return call;
  }
  const RopeOptions rope = in.rope();
  const std::int64_t batch = in.dim(3), seq = in.dim(6), heads = in.dim(3), k_heads = in.dim(3);
  const auto stored = [&](std::int64_t h) {
    return rope.layout == Layout::BSHD ? std::vector<std::int64_t>{batch, seq, h, d}
                                       : std::vector<std::int64_t>{batch, h, seq, d};
  };
  const std::int64_t table_shape[2] = {seq, d / 2};
  const TensorView cos = in.view(DType::F32, 2, table_shape);
  const TensorView sin = in.view(DType::F32, 2, table_shape);
  const DType activations = in.dtype();
  const TensorView q = in.view(activations, 4, stored(heads).data());
  call.views = {q, cos, sin};
  if (op <= 3) {  // multi_axis_rope
    const TensorView out = in.coin() ? q : in.same_shape(in.dtype(), q);
    call.views.push_back(out);
    if (op == 2) {
      call.run = [=] { multi_axis_rope_forward(q, cos, sin, out, rope); };
    } else {
      call.run = [=] { multi_axis_rope_backward(q, cos, sin, out, rope); };
    }
    call.validate = [=] {
      detail::rope_call(op == 3 ? Direction::Backward : Direction::Forward, q, cos, sin, out, rope);
    };
    return call;
  }
  const TensorView k = in.coin() ? in.beside(activations, q, stored(k_heads).data())
                                 : in.view(activations, 4, stored(k_heads).data());
  QkNormWeights weights{in.weight(d), in.weight(d), in.weight(d), in.weight(d)};
  const QkNormRopeOptions options{
      in.eps(), in.mode(), rope.pairing, rope.layout,
      in.small(-1, seq > 0 && seq < (std::int64_t{1} << 40) ? seq + 1 : 8)};
  call.views.push_back(k);
  for (const auto& w : {weights.text_q, weights.text_k, weights.image_q, weights.image_k}) add(w);
  const bool in_place = in.coin();
  const DType out_dtype = in.dtype();
  if (op == 4) {
    const TensorView q_out = in_place ? q : in.same_shape(out_dtype, q);
    const TensorView k_out = in_place ? k : in.same_shape(out_dtype, k);
    call.views.push_back(q_out);
    call.views.push_back(k_out);
    call.run = [=] { qk_norm_rope_forward(q, k, weights, cos, sin, q_out, k_out, options); };
    call.validate = [=] {
      detail::qk_norm_rope_forward_call(q, k, weights, cos, sin, q_out, k_out, options);
    };
    return call;
  }
  const TensorView dq_out = in.same_shape(activations, q);
  const TensorView dk_out = in.same_shape(activations, k);
  const TensorView dq = in_place ? dq_out : in.same_shape(out_dtype, q);
  const TensorView dk = in_place ? dk_out : in.same_shape(out_dtype, k);
  QkNormWeightGrads grads;
  for (auto [w, g] :
       {std::pair{&weights.text_q, &grads.text_q}, std::pair{&weights.text_k, &grads.text_k},
        std::pair{&weights.image_q, &grads.image_q}, std::pair{&weights.image_k, &grads.image_k}}) {
    if (*w && in.coin()) *g = in.view(in.dtype(), 1, &d);
  }
  for (const TensorView& v : {dq_out, dk_out, dq, dk}) call.views.push_back(v);
  for (const auto& g : {grads.text_q, grads.text_k, grads.image_q, grads.image_k}) add(g);
  call.run = [=] {
    qk_norm_rope_backward(q, k, dq_out, dk_out, weights, cos, sin, dq, dk, grads, options);
  };
  call.validate = [=] {
    detail::qk_norm_rope_backward_call(q, k, dq_out, dk_out, weights, cos, sin, dq, dk, grads,
                                       options);
  };
  return call;
}

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "ops_fuzz: %s\n", what.c_str());
  std::abort();
}

// Runs the call under `backend` on a fresh copy of `start`; true when validation accepted.
bool run_on(const std::string& backend, Isa isa, int threads, const Call& call, Arena& arena,
            const Arena& start) {
  std::memcpy(arena.bytes, start.bytes, kArenaBytes);
  set_backend(backend);
  if (backend == "simd") {
    set_isa(isa);
    set_num_threads(threads);
  }
  try {
    call.run();
    return true;
  } catch (const Error&) {
    if (std::memcmp(arena.bytes, start.bytes, kArenaBytes) != 0) {
      finding("a rejected call on " + backend + " wrote into the arena");
    }
    return false;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const registry::ScopedRegistration emulated(cuda::emulation::emulated_cuda_backend());
  static Arena* const arena = new Arena;
  static Arena* const start = new Arena;
  static Arena* const expected = new Arena;
  FuzzedDataProvider f(data, size);
  // The arena's contents: fuzzed bytes, repeated (every bit pattern: NaNs, Infs, ...).
  const std::vector<std::uint8_t> fill = f.ConsumeBytes<std::uint8_t>(64);
  for (std::size_t i = 0; i < kArenaBytes; ++i) {
    start->bytes[i] = std::byte{fill.empty() ? std::uint8_t(i * 131) : fill[i % fill.size()]};
  }
  const Call call = decode(f, *arena);
  bool all_inside = true;
  for (const ConstTensorView& v : call.views) all_inside = all_inside && inside(v, *arena);
  if (!all_inside) {
    // Views never allocated whole: validation only, which must touch no memory.
    std::memcpy(arena->bytes, start->bytes, kArenaBytes);
    try {
      call.validate();
    } catch (const Error&) {
    }
    if (std::memcmp(arena->bytes, start->bytes, kArenaBytes) != 0) finding("validation wrote");
    return 0;
  }
  if (!run_on("reference", Isa::Portable, 1, call, *arena, *start)) {
    for (const char* other : {"simd", "cuda-emulated"}) {
      if (run_on(other, best_isa(), 2, call, *arena, *start)) {
        finding(std::string(other) + " accepted a call the reference refused");
      }
    }
    return 0;
  }
  std::memcpy(expected->bytes, arena->bytes, kArenaBytes);
  const auto compare = [&](const std::string& name) {
    if (std::memcmp(arena->bytes, expected->bytes, kArenaBytes) != 0) {
      finding(name + " wrote other bytes than the reference");
    }
  };
  for (Isa isa = Isa::Portable; isa <= best_isa();
       isa = static_cast<Isa>(static_cast<int>(isa) + 1)) {
    for (const int threads : {1, 3}) {
      if (!run_on("simd", isa, threads, call, *arena, *start)) {
        finding("simd refused a call the reference accepted");
      }
      compare(std::string("simd/") + isa_name(isa) + "/" + std::to_string(threads));
    }
  }
  if (!run_on("cuda-emulated", Isa::Portable, 1, call, *arena, *start)) {
    finding("cuda-emulated refused a call the reference accepted");
  }
  compare("cuda-emulated");
  return 0;
}
