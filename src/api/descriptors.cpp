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
    {.reduction_tree = "tree16-v1",
     .option_list = {kMode, kEps},
     .option_count = 2,
     .op = OpType::QkRmsNorm},
    {.reduction_tree = nullptr,
     .option_list = {kLayout, kPairing},
     .option_count = 2,
     .op = OpType::MultiAxisRope},
    {.reduction_tree = "tree16-v1",
     .option_list = {kLayout, kPairing, kMode, kEps, kTextLen},
     .option_count = 5,
     .op = OpType::QkNormRope},
    {.reduction_tree = "linear-tree-v1",
     .option_list = {kActivation},
     .option_count = 1,
     .op = OpType::Linear},
    {.reduction_tree = "attention-v1",
     .option_list = {kLayout},
     .option_count = 1,
     .op = OpType::Attention},
    {.reduction_tree = "tree16-v1",
     .option_list = {kMode, kEps},
     .option_count = 2,
     .op = OpType::AdaLnModulation},
    {.reduction_tree = "token-blocks-256",
     .option_list = {kMode},
     .option_count = 1,
     .op = OpType::AdaLnGateResidual},
    {.reduction_tree = nullptr,
     .option_list = {kActivation},
     .option_count = 1,
     .op = OpType::Activation},
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
