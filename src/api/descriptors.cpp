#include "api/descriptors.hpp"

namespace kernel_align::detail {
namespace {

constexpr OptionSpec kMode{"mode", OptionKind::Choice, {"single", "diffusers"}};
constexpr OptionSpec kEps{"eps", OptionKind::Float, {}};
constexpr OptionSpec kLayout{"layout", OptionKind::Choice, {"bshd", "bhsd"}};
constexpr OptionSpec kPairing{"pairing", OptionKind::Choice, {"half", "interleaved"}};
constexpr OptionSpec kTextLen{"text_len", OptionKind::Integer, {}};
constexpr OptionSpec kActivation{"activation", OptionKind::Choice, {"none", "gelu_tanh", "silu"}};

// In op_list.hpp's order; options in the order the trace writes them.
constexpr OpDescriptor kDescriptors[] = {
    {OpType::QkRmsNorm, "tree16-v1", {kMode, kEps}, 2},
    {OpType::MultiAxisRope, nullptr, {kLayout, kPairing}, 2},
    {OpType::QkNormRope, "tree16-v1", {kLayout, kPairing, kMode, kEps, kTextLen}, 5},
    {OpType::Linear, "linear-tree-v1", {kActivation}, 1},
};
static_assert(sizeof kDescriptors / sizeof kDescriptors[0] == kOpCount,
              "one descriptor per op of op_list.hpp");

constexpr bool in_op_list_order() {
  for (int i = 0; i < kOpCount; ++i) {
    if (kDescriptors[i].op != kOpTypes[i]) return false;
  }
  return true;
}
static_assert(in_op_list_order(), "descriptors in op_list.hpp's order");

}  // namespace

const OpDescriptor& descriptor(OpType op) {
  return kDescriptors[static_cast<int>(op)];
}

}  // namespace kernel_align::detail
