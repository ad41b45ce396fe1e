// Each op's descriptor: its tensors in each direction (name, input or output, optional,
// which inputs an output may be, the shape and dtype of an output), its options (name,
// kind, the values of an enumerated one) and the name of its reduction order. The
// validators list a call's tensors from it (the trace's names, the aliasing rule), the
// call record (api/call.hpp) holds a call's option values in the descriptor's order, the
// trace writes them by name, the verify configurations enumerate the choices, a backend's
// predicate reads them by name, and the CLI's `apply` commands derive their flags, inputs
// and outputs from it. One descriptor per op of op_list.hpp (descriptors.cpp).
#pragma once

#include <array>
#include <span>
#include <string_view>

#include "kernel_align/registry.hpp"  // OpType, Direction

namespace kernel_align::detail {

enum class OptionKind : unsigned char {
  Choice,   // one of a few named values ("bshd")
  Float,    // an fp32 value (eps)
  Integer,  // an integer (text_len)
};

inline constexpr int kMaxChoices = 4;

struct OptionSpec {
  const char* name = "";
  OptionKind kind = OptionKind::Choice;
  // A Choice option's values as the trace, the CLI and the Python package spell them, in
  // the order of the option's enum.
  std::array<const char*, kMaxChoices> choices{};
  std::span<const char* const> choice_names() const {
    std::size_t n = 0;
    while (n < choices.size() && choices[n] != nullptr) ++n;
    return {choices.data(), n};
  }
};

inline constexpr int kMaxOptions = 8;

enum class TensorRole : unsigned char { Input, Output };
enum class TensorKind : unsigned char {
  Numbers,  // fp32, bf16 or fp16
  Mask,     // bool
};

// An output whose shape is a permutation's of its `like` (latent_pack, contract section 16).
enum class Packing : unsigned char {
  None,
  Packed,    // [B, C, H, W] -> [B, H/2 * W/2, 4C]
  Unpacked,  // [B, S, 4C] -> [B, C, height, width] (the op's options height and width)
};

// One tensor argument of a direction of an op.
// (Members ordered by size, as clang-tidy's padding check asks.)
struct TensorSpec {
  const char* name = "";  // as the trace records it; the CLI's flag is --name ('_' as '-')
  // As errors name it where that differs from `name`: the fused op's weights, members of
  // a struct argument ("weights.text_q", traced "weight_text_q"); null: `name`.
  const char* argument = nullptr;
  // An output: the input whose shape and dtype it has, unless `rows_of` says otherwise.
  const char* like = nullptr;
  // An output whose last dim is dim 0 of this input (linear's y: N, the rows of weight).
  const char* rows_of = nullptr;
  // An output: the inputs it may be exactly, computing in place (contract section 7).
  std::array<const char*, 2> in_place_of{};
  TensorRole role = TensorRole::Input;
  TensorKind kind = TensorKind::Numbers;
  Packing packing = Packing::None;
  bool optional = false;
  // An output whose dtype the caller may choose (the forward's y of qk_rmsnorm, linear).
  bool dtype_free = false;
  // An output of one fp32 number per sample: shape [dim 0 of `like`] (flow_sde_logp's logp).
  bool per_sample = false;
  constexpr const char* error_name() const { return argument != nullptr ? argument : name; }
};

// The fused backward has the most tensor arguments: 16.
inline constexpr int kMaxTensorArgs = 16;

// A direction's tensor arguments in the order of the API's signature (and of the record).
struct Signature {
  std::array<TensorSpec, kMaxTensorArgs> list{};
  int count = 0;
  constexpr std::span<const TensorSpec> tensors() const {
    return {list.data(), static_cast<std::size_t>(count)};
  }
  // The index of the tensor called `name`; -1 when there is none.
  constexpr int index(std::string_view name) const {
    for (int i = 0; i < count; ++i) {
      if (name == list[static_cast<std::size_t>(i)].name) return i;
    }
    return -1;
  }
};

// (Members ordered by size, as clang-tidy's padding check asks.)
struct OpDescriptor {
  // The contract's name of the op's reduction order ("tree16-v1"); null for an op that
  // sums nothing.
  const char* reduction_tree = nullptr;
  std::array<OptionSpec, kMaxOptions> option_list{};
  Signature forward;
  Signature backward;
  int option_count = 0;
  OpType op = OpType::QkRmsNorm;
  constexpr const Signature& signature(Direction direction) const {
    return direction == Direction::Forward ? forward : backward;
  }
  std::span<const OptionSpec> options() const {
    return {option_list.data(), static_cast<std::size_t>(option_count)};
  }
  // The option called `name`; null when the op has none.
  const OptionSpec* option(std::string_view name) const {
    for (const OptionSpec& o : options()) {
      if (name == o.name) return &o;
    }
    return nullptr;
  }
};

const OpDescriptor& descriptor(OpType op);

}  // namespace kernel_align::detail
