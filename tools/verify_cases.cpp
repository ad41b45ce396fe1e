#include "verify_cases.hpp"

#include "api/validate.hpp"  // choice, integer_value
#include "op_calls.hpp"

#include <utility>

#include "cases/parallel.hpp"
#include "kernel_align/registry.hpp"
#include "tensor_io.hpp"

namespace kernel_align::cli::verify_cases {

NpyArray& reused_array(NpyArray& array, NpyType type, std::vector<std::int64_t> shape) {
  array.type = type;
  array.shape = std::move(shape);
  array.data.resize(static_cast<std::size_t>(array.numel()) * npy_type_size(type));
  return array;
}

std::vector<std::int64_t> head_rows(const cases::Config& config, std::int64_t seq,
                                    std::int64_t heads) {
  if (config.layout == Layout::BHSD) return {kBatch, heads, seq, cases::kHeadDim};
  return {kBatch, seq, heads, cases::kHeadDim};
}

namespace {

// The option values of a configuration, and the shape's text length where the op has one.
void set_options(const Case& c, OpCallArgs& args) {
  for (const detail::OptionValue& o : c.options) args.set_option(o);
  const cases::Config& config = *c.config;
  if (config.mode) args.set_option(detail::choice("mode", norm_mode_name(*config.mode)));
  if (config.pairing) args.set_option(detail::choice("pairing", pairing_name(*config.pairing)));
  if (config.layout) args.set_option(detail::choice("layout", layout_name(*config.layout)));
  if (config.activation) {
    args.set_option(detail::choice("activation", activation_name(*config.activation)));
  }
  if (config.transform) {
    args.set_option(detail::choice("transform", latent_transform_name(*config.transform)));
  }
  if (args.descriptor().option("text_len") != nullptr) {
    args.set_option(detail::integer_value("text_len", c.shape->text_len));
  }
}

std::vector<std::int64_t> shape_of(const ConstTensorView& v) {
  return {v.shape.begin(), v.shape.begin() + v.rank};
}

}  // namespace

void compute(const Case& c, bool whole_batch, Outputs& outputs) {
  OpCallArgs args(c.config->op, c.config->direction);
  set_options(c, args);
  const detail::Signature& signature = args.signature();
  // An input's view in this call, and whether it is per sample (batched).
  std::vector<std::optional<std::pair<ConstTensorView, bool>>> inputs(
      static_cast<std::size_t>(signature.count));
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    const ConstTensorView all = const_view(c.arrays[i]);
    const bool batched = c.inputs[i].batched;
    const ConstTensorView view =
        batched && !whole_batch ? narrow(all, 0, kSampleSlot, kSampleSlot + 1) : all;
    inputs[static_cast<std::size_t>(signature.index(c.inputs[i].name))] = {view, batched};
  }
  if (signature.index("cos") >= 0) {
    inputs[static_cast<std::size_t>(signature.index("cos"))] = {c.tables->cos(), false};
    inputs[static_cast<std::size_t>(signature.index("sin"))] = {c.tables->sin(), false};
  }
  std::size_t count = 0;
  for (const detail::TensorSpec& t : signature.tensors()) {
    const int i = signature.index(t.name);
    if (t.role == detail::TensorRole::Input) {
      if (const auto& in = inputs[static_cast<std::size_t>(i)]) args.set_input(t.name, in->first);
    } else if (inputs[static_cast<std::size_t>(signature.index(t.like))]) {
      ++count;
    }
  }
  // Sized before any view of them is taken.
  outputs.resize(count);
  std::size_t next = 0;
  for (const detail::TensorSpec& t : signature.tensors()) {
    if (t.role != detail::TensorRole::Output) continue;
    const auto& like = inputs[static_cast<std::size_t>(signature.index(t.like))];
    if (!like) continue;
    const std::int64_t rows =
        t.rows_of != nullptr
            ? inputs[static_cast<std::size_t>(signature.index(t.rows_of))]->first.shape[0]
            : 0;
    OutputLayout layout = output_layout(t, shape_of(like->first), like->first.dtype, rows, args);
    Output& o = outputs[next++];
    o.name = t.name;
    o.per_sample = like->second;
    NpyArray& a = reused_array(o.array, npy_type_of(layout.dtype), std::move(layout.shape));
    cases::zero_fill(a.data);
    args.set_output(t.name, mutable_view(a));
  }
  op_call(c.config->op).call(args);
}

}  // namespace kernel_align::cli::verify_cases
