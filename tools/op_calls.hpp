// Each op's call from generic arguments: its tensors by the names of its descriptor's
// signature (api/descriptors.hpp) and its options as the descriptor's option values. The
// CLI's `apply` commands (commands_apply.cpp) read the tensors and options a signature
// names, allocate its outputs, and hand them to the op's call; the op's file of tools/ops/
// says only how the public function takes them. Declared from op_list.hpp (a missing one
// is a link error).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "api/call.hpp"  // OptionValue
#include "api/descriptors.hpp"
#include "kernel_align/op_list.hpp"
#include "kernel_align/tensor.hpp"

namespace kernel_align::cli {

class OpCallArgs {
 public:
  OpCallArgs(OpType op, Direction direction);

  const detail::OpDescriptor& descriptor() const { return *descriptor_; }
  const detail::Signature& signature() const { return *signature_; }
  bool forward() const { return direction_ == Direction::Forward; }

  // The tensor of the signature called `name`: given (an input's view, an output's view)
  // or absent (an optional one left out).
  void set_input(std::string_view name, const ConstTensorView& view);
  void set_output(std::string_view name, const TensorView& view);
  ConstTensorView in(std::string_view name) const;
  std::optional<ConstTensorView> optional_in(std::string_view name) const;
  TensorView out(std::string_view name) const;
  std::optional<TensorView> optional_out(std::string_view name) const;

  // An option's value; an option never set keeps the options struct's default.
  void set_option(const detail::OptionValue& value);
  // Stores the option called `name`, when it was set, in `field`: a Choice as the enum
  // whose enumerators are the descriptor's choices in order, a Float as a float, an
  // Integer as an integer.
  template <class Field>
  void get(std::string_view name, Field& field) const {
    const detail::OptionValue* v = option(name);
    if (v == nullptr) return;
    if constexpr (std::is_enum_v<Field>) {
      field = static_cast<Field>(choice_index(*v));
    } else if constexpr (std::is_floating_point_v<Field>) {
      field = v->number;
    } else {
      field = static_cast<Field>(v->integer);
    }
  }

 private:
  int tensor_index(std::string_view name) const;
  const detail::OptionValue* option(std::string_view name) const;
  int choice_index(const detail::OptionValue& v) const;

  const detail::OpDescriptor* descriptor_;
  const detail::Signature* signature_;
  Direction direction_;
  std::vector<std::optional<ConstTensorView>> inputs_;  // by signature index
  std::vector<std::optional<TensorView>> outputs_;
  std::vector<detail::OptionValue> options_;
};

// The shape and dtype of an output of a signature, by its shape rule: those of the input
// it is like (`like_shape`, `like_dtype`), its last dim `rows_of_rows` (dim 0 of its rows_of
// input, read only where it has one), one fp32 per sample, or the input's packed or
// unpacked latents (the unpacked H and W: the options height and width of `args`, an Error
// naming height where they are not set). `apply` and verify allocate every output by it.
struct OutputLayout {
  std::vector<std::int64_t> shape;
  DType dtype = DType::F32;
};
OutputLayout output_layout(const detail::TensorSpec& t, std::vector<std::int64_t> like_shape,
                           DType like_dtype, std::int64_t rows_of_rows, const OpCallArgs& args);

// An op's call and the sentences the CLI's help says of each direction.
struct OpCall {
  const char* forward_summary = "";
  const char* backward_summary = "";
  void (*call)(const OpCallArgs& args) = nullptr;
};

#define KERNEL_ALIGN_DECLARE_CALL(Enumerator, name) OpCall name##_call();
KERNEL_ALIGN_OPS(KERNEL_ALIGN_DECLARE_CALL)
#undef KERNEL_ALIGN_DECLARE_CALL

// The call of `op` (from the functions above).
const OpCall& op_call(OpType op);

}  // namespace kernel_align::cli
