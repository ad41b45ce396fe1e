// Each op's descriptor: its options (name, kind, the values of an enumerated one) and the
// name of its reduction order. The call record (api/call.hpp) holds a call's option values
// in the descriptor's order; the trace writes them by name, the verify configurations
// enumerate the choices, and a backend's predicate reads them by name. One descriptor per
// op of op_list.hpp (descriptors.cpp).
#pragma once

#include <array>
#include <span>
#include <string_view>

#include "kernel_align/registry.hpp"  // OpType

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

// (Members ordered by size, as clang-tidy's padding check asks.)
struct OpDescriptor {
  // The contract's name of the op's reduction order ("tree16-v1"); null for an op that
  // sums nothing.
  const char* reduction_tree = nullptr;
  std::array<OptionSpec, kMaxOptions> option_list{};
  int option_count = 0;
  OpType op = OpType::QkRmsNorm;
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
