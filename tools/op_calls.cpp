#include "op_calls.hpp"

#include "kernel_align/error.hpp"

#include <algorithm>
#include <array>

namespace kernel_align::cli {

OpCallArgs::OpCallArgs(OpType op, Direction direction)
    : descriptor_(&detail::descriptor(op)),
      signature_(&descriptor_->signature(direction)),
      direction_(direction),
      inputs_(static_cast<std::size_t>(signature_->count)),
      outputs_(static_cast<std::size_t>(signature_->count)) {}

int OpCallArgs::tensor_index(std::string_view name) const {
  const int i = signature_->index(name);
  if (i < 0) {
    throw std::logic_error(std::string(op_type_name(descriptor_->op)) + " has no tensor " +
                           std::string(name));
  }
  return i;
}

void OpCallArgs::set_input(std::string_view name, const ConstTensorView& view) {
  inputs_[static_cast<std::size_t>(tensor_index(name))] = view;
}

void OpCallArgs::set_output(std::string_view name, const TensorView& view) {
  outputs_[static_cast<std::size_t>(tensor_index(name))] = view;
}

std::optional<ConstTensorView> OpCallArgs::optional_in(std::string_view name) const {
  return inputs_[static_cast<std::size_t>(tensor_index(name))];
}

std::optional<TensorView> OpCallArgs::optional_out(std::string_view name) const {
  return outputs_[static_cast<std::size_t>(tensor_index(name))];
}

ConstTensorView OpCallArgs::in(std::string_view name) const {
  const std::optional<ConstTensorView> v = optional_in(name);
  if (!v) throw std::logic_error("a call without its input " + std::string(name));
  return *v;
}

TensorView OpCallArgs::out(std::string_view name) const {
  const std::optional<TensorView> v = optional_out(name);
  if (!v) throw std::logic_error("a call without its output " + std::string(name));
  return *v;
}

void OpCallArgs::set_option(const detail::OptionValue& value) {
  if (descriptor_->option(value.name) == nullptr) {
    throw std::logic_error(std::string(op_type_name(descriptor_->op)) + " has no option " +
                           value.name);
  }
  options_.push_back(value);
}

const detail::OptionValue* OpCallArgs::option(std::string_view name) const {
  const auto it = std::find_if(options_.begin(), options_.end(),
                               [&](const detail::OptionValue& v) { return name == v.name; });
  return it == options_.end() ? nullptr : &*it;
}

int OpCallArgs::choice_index(const detail::OptionValue& v) const {
  const auto names = descriptor_->option(v.name)->choice_names();
  const auto it = std::find_if(names.begin(), names.end(),
                               [&](const char* n) { return std::string_view(n) == v.choice; });
  if (it == names.end()) {
    throw std::logic_error(std::string("option ") + v.name + " has no choice " + v.choice);
  }
  return static_cast<int>(it - names.begin());
}

OutputLayout output_layout(const detail::TensorSpec& t, std::vector<std::int64_t> like_shape,
                           DType like_dtype, std::int64_t rows_of_rows, const OpCallArgs& args) {
  OutputLayout out{std::move(like_shape), like_dtype};
  if (t.rows_of != nullptr) out.shape.back() = rows_of_rows;
  if (t.per_sample) out = {{out.shape.front()}, DType::F32};
  // A shape the op's validator refuses stays as it is, for its error to name the input.
  std::vector<std::int64_t>& s = out.shape;
  if (t.packing == detail::Packing::Packed && s.size() == 4) {
    s = {s[0], (s[2] / 2) * (s[3] / 2), 4 * s[1]};
  } else if (t.packing == detail::Packing::Unpacked && s.size() == 3) {
    std::int64_t height = 0, width = 0;
    args.get("height", height);
    args.get("width", width);
    if (height <= 0 || width <= 0) {
      throw Error("height", "the latents' H and W to unpack to (height and width, both > 0)",
                  "height " + std::to_string(height) + ", width " + std::to_string(width));
    }
    s = {s[0], s[2] / 4, height, width};
  }
  return out;
}

const OpCall& op_call(OpType op) {
#define KERNEL_ALIGN_CALL_ROW(Enumerator, name) name##_call(),
  static const std::array<OpCall, kOpCount> calls{KERNEL_ALIGN_OPS(KERNEL_ALIGN_CALL_ROW)};
#undef KERNEL_ALIGN_CALL_ROW
  return calls[static_cast<std::size_t>(op)];
}

}  // namespace kernel_align::cli
