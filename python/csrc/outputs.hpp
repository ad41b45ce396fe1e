// Outputs of the torch operators: validated before they are allocated (StandIns, the
// library's own validation on views of memory not allocated yet), checked against the
// device's memory, then allocated like torch.empty_like (new_output). Shared by every
// operator file (ops.cpp, linear.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string_view>

#include "kernel_align/tensor.hpp"
#include "views.hpp"

namespace kernel_align::torch_ext {

// Views of outputs not allocated yet, for validating a call first: each dense, of the
// shape of the input it is made like (as empty_like makes it) and its own dtype, on that
// input's device, at an address past the end of every input and of the stand-ins before
// it, so that the aliasing rule finds it apart from everything, as new memory is. Never
// dereferenced. Sizes saturate at 2^62: a shape past the library's limits is refused by
// validation (naming the input first) before any stand-in's address matters.
class StandIns {
 public:
  explicit StandIns(std::initializer_list<std::optional<ConstTensorView>> inputs) {
    for (const std::optional<ConstTensorView>& v : inputs) {
      if (!v) continue;
      std::uint64_t last = 0;
      for (int i = 0; i < v->rank; ++i) {
        const auto steps = static_cast<std::uint64_t>(std::max<std::int64_t>(v->shape[i] - 1, 0));
        last = add(last, mul(steps, static_cast<std::uint64_t>(v->strides[i])));
      }
      const auto start = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(v->data));
      next_ = std::max(next_, add(start, mul(add(last, 1), dtype_size(v->dtype))));
    }
  }

  TensorView like(const ConstTensorView& input, DType dtype) {
    return like(input, dtype, input.shape[input.rank - 1]);
  }

  // The same with its last dim `last` instead of the input's (linear's y is [..., N]).
  TensorView like(const ConstTensorView& input, DType dtype, std::int64_t last) {
    TensorView v;
    v.rank = input.rank;
    for (int i = 0; i < v.rank; ++i) v.shape[i] = i == v.rank - 1 ? last : input.shape[i];
    return placed(v, input, dtype);
  }

  // An fp32 [B] of one number per sample (dim 0) of `input` (flow_sde_logp's logp).
  TensorView per_sample(const ConstTensorView& input) {
    ConstTensorView samples = input;
    samples.rank = 1;
    return like(samples, DType::F32);
  }

  // latent_pack's tokens [B, H/2 * W/2, 4C] of `latents` [B, C, H, W], in their dtype. The
  // sizes saturate: tokens too large to index come of latents the validation refuses first
  // (as it does latents of another rank, whose dims past their rank read 0 here).
  TensorView packed(const ConstTensorView& latents) {
    const auto size = [&](int dim) { return static_cast<std::uint64_t>(latents.shape[dim]); };
    TensorView v;
    v.rank = 3;
    v.shape = {latents.shape[0], static_cast<std::int64_t>(mul(size(2) / 2, size(3) / 2)),
               static_cast<std::int64_t>(mul(4, size(1)))};
    return placed(v, latents, latents.dtype);
  }

  // Its inverse's latents [B, C, height, width] of `tokens` [B, S, 4C], in their dtype.
  TensorView unpacked(const ConstTensorView& tokens, std::int64_t height, std::int64_t width) {
    TensorView v;
    v.rank = 4;
    v.shape = {tokens.shape[0], tokens.shape[2] / 4, height, width};
    return placed(v, tokens, tokens.dtype);
  }

  // The bytes of every stand-in made (at most 2^62).
  std::uint64_t bytes() const { return bytes_; }

 private:
  static constexpr std::uint64_t kClamp = std::uint64_t{1} << 62;
  static std::uint64_t add(std::uint64_t a, std::uint64_t b) {
    std::uint64_t r = 0;
    return __builtin_add_overflow(a, b, &r) || r > kClamp ? kClamp : r;
  }
  static std::uint64_t mul(std::uint64_t a, std::uint64_t b) {
    std::uint64_t r = 0;
    return __builtin_mul_overflow(a, b, &r) || r > kClamp ? kClamp : r;
  }

  // `v` (its rank and shape set) made dense, in `dtype` on `input`'s device, at the next
  // address.
  TensorView placed(TensorView v, const ConstTensorView& input, DType dtype) {
    v.dtype = dtype;
    v.device = input.device;
    std::uint64_t elements = 1;
    for (int i = v.rank - 1; i >= 0; --i) {
      v.strides[i] = static_cast<std::int64_t>(elements);
      elements = mul(elements, static_cast<std::uint64_t>(std::max<std::int64_t>(v.shape[i], 0)));
    }
    next_ = (next_ + 63) / 64 * 64;  // aligned, as an allocation is
    v.data = reinterpret_cast<void*>(static_cast<std::uintptr_t>(next_));
    const std::uint64_t size = mul(elements, dtype_size(dtype));
    next_ = add(next_, size);
    bytes_ = add(bytes_, size);
    return v;
  }

  std::uint64_t next_ = 64;  // never null
  std::uint64_t bytes_ = 0;
};

// After a call validated on stand-ins: an Error naming `argument` unless the outputs fit
// in the memory of `like`'s device.
inline void check_outputs_fit(const char* argument, const at::Tensor& like,
                              const StandIns& outputs) {
  check_fits_memory(argument, like.device(), outputs.bytes(), "outputs");
}

// A new output `out`, advised, on the CPU when it is large, to use transparent huge pages
// (madvise MADV_HUGEPAGE, the 2 MiB-aligned part of its memory; the advice torch's
// THP_MEM_ALLOC_ENABLE=1 gives every large tensor): under glibc's defaults each such
// output is a fresh mapping that the kernel fills by page faults on the first write, 512
// times fewer of them with 2 MiB pages. Only this output's memory is advised, never the
// allocator's other memory; where THP is "never", or the advice fails, nothing changes.
// KERNEL_ALIGN_HUGE_PAGES=0 (read once) turns the advice off (docs/python.md, "Speed in
// practice").
inline at::Tensor with_huge_pages(at::Tensor out) {
  static const bool advise = [] {
    const char* setting = std::getenv("KERNEL_ALIGN_HUGE_PAGES");
    return setting == nullptr || std::string_view(setting) != "0";
  }();
  constexpr std::uintptr_t kHugePage = std::uintptr_t{1} << 21;
  if (advise && out.is_cpu() && out.storage().nbytes() >= 2 * kHugePage) {
    const auto begin = reinterpret_cast<std::uintptr_t>(out.storage().data());
    const std::uintptr_t first = (begin + kHugePage - 1) & ~(kHugePage - 1);
    const std::uintptr_t last = (begin + out.storage().nbytes()) & ~(kHugePage - 1);
    if (last > first) {
      ::madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);  // advice only
    }
  }
  return out;
}

// An output like `t` (torch.empty_like, so the fake kernels' strides) in `dtype`.
inline at::Tensor new_output(const at::Tensor& t, at::ScalarType dtype) {
  return with_huge_pages(at::empty_like(t, t.options().dtype(dtype)));
}

}  // namespace kernel_align::torch_ext
