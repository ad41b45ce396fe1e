// kernel_align::TensorView of a torch tensor (its data pointer, sizes and element
// strides: no copy), and the translation of the library's errors into the Python
// exceptions torch raises for c10 errors.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"

namespace kernel_align::torch_ext {

// Whether this extension was built with the CUDA backend (KERNEL_ALIGN_TORCH_CUDA).
#if defined(KERNEL_ALIGN_TORCH_CUDA)
inline constexpr bool kCudaBuild = true;
#else
inline constexpr bool kCudaBuild = false;
#endif

// "the CPU or a CUDA device" (CUDA builds) or "the CPU": for messages.
inline const char* supported_devices() {
  return kCudaBuild ? "the CPU or a CUDA device" : "the CPU";
}

// The library's dtype of a torch dtype; a TypeError naming `op` and `argument` for one the
// library lacks.
DType library_dtype(const char* op, const char* argument, at::ScalarType type);

// A read-only view of `tensor` (its device included). Rejects, naming `op` and
// `argument`: a tensor on another device than the CPU or (CUDA builds) a CUDA device
// (ValueError), not strided or of a dtype the library lacks (TypeError), of rank above 4
// (ValueError).
ConstTensorView input_view(const char* op, const char* argument, const at::Tensor& tensor);
std::optional<ConstTensorView> input_view(const char* op, const char* argument,
                                          const std::optional<at::Tensor>& tensor);
// The same checks; the library writes through this view.
TensorView output_view(const char* op, const char* argument, const at::Tensor& tensor);
// A read-only view of a mask (torch.bool or torch.uint8, as DType::Bool), checked as
// input_view checks a tensor of numbers; none for None.
std::optional<ConstTensorView> mask_view(const char* op, const char* argument,
                                         const std::optional<at::Tensor>& tensor);

// "cpu, reference": the names of `values`, for messages.
template <class Enum, std::size_t N, class Name>
std::string names(const std::array<Enum, N>& values, Name name) {
  std::string out;
  for (Enum v : values) out += (out.empty() ? "" : ", ") + std::string(name(v));
  return out;
}

// The value of `values` whose name is `text`; an Error naming `argument` otherwise.
template <class Enum, std::size_t N, class Name>
Enum parse(const char* argument, std::string_view text, const std::array<Enum, N>& values,
           Name name) {
  for (Enum v : values) {
    if (text == name(v)) return v;
  }
  throw Error(argument, "one of " + names(values, name), "'" + std::string(text) + "'");
}

// "torch.float64": a dtype as Python users write it (c10's own names are "Double", ...).
std::string torch_dtype_name(at::ScalarType type);

// Where a call on `tensor`'s device queues its work: torch's current stream of that
// device for a CUDA tensor (so the kernels are ordered with the caller's torch work, as
// torch's own ops are), nothing for a CPU one. The library runs the kernels on the
// tensors' device whatever the current one is.
ExecutionContext context_of(const at::Tensor& tensor);

// Throws the ValueError torch raises for a c10::ValueError: "kernel_align.<op>: <message>".
[[noreturn]] void raise_value_error(const char* op, const std::string& message);

// An argument as the library names it and as the Python function that reaches it does
// (the in-place RoPE's output "y" is its x; the fused ops' "weights.text_q" is
// text_q_weight). A `library` name ending in '*' stands for every name it starts; a
// `python` name ending in '*' keeps the rest of the name (an index).
struct Rename {
  std::string_view library;
  std::string_view python;
};
using Renames = std::span<const Rename>;

// `e` with its argument, and the arguments its expected phrase quotes ('q_out'), named as
// `renames` says.
Error renamed(const Error& e, Renames renames);

// Runs `body`; a kernel_align::Error it throws becomes a ValueError naming `op`, and the
// arguments by their Python names (`renames`).
template <class Body>
decltype(auto) translate_errors(const char* op, Renames renames, Body&& body) {
  try {
    return std::forward<Body>(body)();
  } catch (const Error& e) {
    raise_value_error(op, renamed(e, renames).what());
  }
}

// Runs `body`; a kernel_align::Error it throws becomes a ValueError naming `op`.
template <class Body>
decltype(auto) translate_errors(const char* op, Body&& body) {
  return translate_errors(op, {}, std::forward<Body>(body));
}

// The bytes of memory a tensor on `device` could ever take: the CPU's RAM and swap, a
// CUDA device's global memory. An output larger than that cannot be allocated, nor a
// tensor of that many bytes be read into one.
std::uint64_t memory_bytes(const at::Device& device);

// An Error naming `argument` unless `bytes` (of the outputs `what` describes) fit in
// memory_bytes(device).
void check_fits_memory(const char* argument, const at::Device& device, std::uint64_t bytes,
                       const std::string& what);

}  // namespace kernel_align::torch_ext
