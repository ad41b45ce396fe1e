#include "api/descriptors.hpp"

#include <initializer_list>

namespace kernel_align::detail {
namespace {

constexpr OptionSpec kMode{"mode", OptionKind::Choice, {"single", "diffusers"}};
constexpr OptionSpec kEps{"eps", OptionKind::Float, {}};
constexpr OptionSpec kLayout{"layout", OptionKind::Choice, {"bshd", "bhsd"}};
constexpr OptionSpec kPairing{"pairing", OptionKind::Choice, {"half", "interleaved"}};
constexpr OptionSpec kTextLen{"text_len", OptionKind::Integer, {}};
constexpr OptionSpec kActivation{"activation", OptionKind::Choice, {"none", "gelu_tanh", "silu"}};
constexpr OptionSpec kSigma{"sigma", OptionKind::Float, {}};
constexpr OptionSpec kSigmaPrev{"sigma_prev", OptionKind::Float, {}};
constexpr OptionSpec kNoiseLevel{"noise_level", OptionKind::Float, {}};
constexpr OptionSpec kSigmaMax{"sigma_max", OptionKind::Float, {}};
constexpr OptionSpec kTransform{"transform", OptionKind::Choice, {"normalize", "denormalize"}};
constexpr OptionSpec kScale{"scale", OptionKind::Float, {}};
constexpr OptionSpec kHeight{"height", OptionKind::Integer, {}};
constexpr OptionSpec kWidth{"width", OptionKind::Integer, {}};

constexpr TensorSpec in(const char* name) {
  return {.name = name};
}
constexpr TensorSpec optional_in(const char* name, const char* argument = nullptr) {
  return {.name = name, .argument = argument, .optional = true};
}
constexpr TensorSpec optional_mask(const char* name) {
  return {.name = name, .kind = TensorKind::Mask, .optional = true};
}
constexpr TensorSpec out(const char* name, const char* like,
                         std::array<const char*, 2> in_place_of = {}) {
  return {.name = name, .like = like, .in_place_of = in_place_of, .role = TensorRole::Output};
}
constexpr TensorSpec optional_out(const char* name, const char* like,
                                  const char* argument = nullptr,
                                  std::array<const char*, 2> in_place_of = {}) {
  return {.name = name,
          .argument = argument,
          .like = like,
          .in_place_of = in_place_of,
          .role = TensorRole::Output,
          .optional = true};
}
// An fp32 output of one number per sample of `like`.
constexpr TensorSpec per_sample_out(const char* name, const char* like) {
  return {.name = name, .like = like, .role = TensorRole::Output, .per_sample = true};
}
// The forward's y of an op whose caller chooses y's dtype.
constexpr TensorSpec y_of_free_dtype(const char* like, const char* rows_of,
                                     std::array<const char*, 2> in_place_of) {
  return {.name = "y",
          .like = like,
          .rows_of = rows_of,
          .in_place_of = in_place_of,
          .role = TensorRole::Output,
          .dtype_free = true};
}

constexpr Signature signature(std::initializer_list<TensorSpec> tensors) {
  Signature s;
  for (const TensorSpec& t : tensors) s.list[static_cast<std::size_t>(s.count++)] = t;
  return s;
}

// qk_norm_rope's four optional weights (members of QkNormWeights) and their gradients.
constexpr TensorSpec kWeightTextQ = optional_in("weight_text_q", "weights.text_q");
constexpr TensorSpec kWeightTextK = optional_in("weight_text_k", "weights.text_k");
constexpr TensorSpec kWeightImageQ = optional_in("weight_image_q", "weights.image_q");
constexpr TensorSpec kWeightImageK = optional_in("weight_image_k", "weights.image_k");

// latent_pack's tokens [B, H/2 * W/2, 4C] of latents [B, C, H, W], and those latents of
// tokens (H and W: the options height and width).
constexpr TensorSpec packed_out(const char* name, const char* like) {
  return {.name = name, .like = like, .role = TensorRole::Output, .packing = Packing::Packed};
}
constexpr TensorSpec unpacked_out(const char* name, const char* like) {
  return {.name = name, .like = like, .role = TensorRole::Output, .packing = Packing::Unpacked};
}

// In op_list.hpp's order; tensors in the API's order, which the record keeps; options in
// the order the trace writes them.
// An output may be exactly an input of its in_place_of where each of its elements is
// written after every read of them that it depends on: the elementwise ops read an
// element, the row ops (norms, RoPE, the fused op, adaln's forward) read a row whole,
// and the modulation backwards finish their sums over tokens, before writing.
constexpr OpDescriptor kDescriptors[] = {
    {.reduction_tree = "tree16-v1",
     .option_list = {kMode, kEps},
     .forward = signature({in("x"), optional_in("weight"), y_of_free_dtype("x", nullptr, {"x"})}),
     .backward = signature({in("x"), in("dy"), optional_in("weight"), out("dx", "x", {"x", "dy"}),
                            optional_out("dw", "weight")}),
     .option_count = 2,
     .op = OpType::QkRmsNorm},
    {.reduction_tree = nullptr,
     .option_list = {kLayout, kPairing},
     .forward = signature({in("x"), in("cos"), in("sin"), out("y", "x", {"x"})}),
     .backward = signature({in("dy"), in("cos"), in("sin"), out("dx", "dy", {"dy"})}),
     .option_count = 2,
     .op = OpType::MultiAxisRope},
    {.reduction_tree = "tree16-v1",
     .option_list = {kLayout, kPairing, kMode, kEps, kTextLen},
     .forward =
         signature({in("q"), in("k"), kWeightTextQ, kWeightTextK, kWeightImageQ, kWeightImageK,
                    in("cos"), in("sin"), out("q_out", "q", {"q"}), out("k_out", "k", {"k"})}),
     .backward = signature({in("q"), in("k"), in("dq_out"), in("dk_out"), kWeightTextQ,
                            kWeightTextK, kWeightImageQ, kWeightImageK, in("cos"), in("sin"),
                            out("dq", "q", {"dq_out", "q"}), out("dk", "k", {"dk_out", "k"}),
                            optional_out("dw_text_q", "weight_text_q", "weight_grads.text_q"),
                            optional_out("dw_text_k", "weight_text_k", "weight_grads.text_k"),
                            optional_out("dw_image_q", "weight_image_q", "weight_grads.image_q"),
                            optional_out("dw_image_k", "weight_image_k", "weight_grads.image_k")}),
     .option_count = 5,
     .op = OpType::QkNormRope},
    {.reduction_tree = "linear-tree-v1",
     .option_list = {kActivation},
     .forward = signature(
         {in("x"), in("weight"), optional_in("bias"), y_of_free_dtype("x", "weight", {})}),
     .backward =
         signature({in("x"), in("weight"), optional_in("bias"), in("dy"), optional_out("dx", "x"),
                    optional_out("dw", "weight"), optional_out("db", "bias")}),
     .option_count = 1,
     .op = OpType::Linear},
    {.reduction_tree = "attention-v1",
     .option_list = {kLayout},
     .forward = signature({in("q"), in("k"), in("v"), optional_mask("mask"), out("out", "q")}),
     .backward = signature({in("q"), in("k"), in("v"), optional_mask("mask"), in("out"), in("dout"),
                            out("dq", "q"), out("dk", "k"), out("dv", "v")}),
     .option_count = 1,
     .op = OpType::Attention},
    {.reduction_tree = "tree16-v1",
     .option_list = {kMode, kEps},
     .forward = signature({in("x"), in("scale"), in("shift"), out("y", "x", {"x"})}),
     .backward = signature({in("x"), in("scale"), in("dy"), out("dx", "x", {"x", "dy"}),
                            optional_out("dscale", "scale"), optional_out("dshift", "scale")}),
     .option_count = 2,
     .op = OpType::AdaLnModulation},
    {.reduction_tree = "token-blocks-256",
     .option_list = {kMode},
     .forward = signature({in("x"), in("gate"), in("y"), out("out", "x", {"x", "y"})}),
     .backward = signature({in("gate"), in("y"), in("dout"), out("dy", "y", {"dout", "y"}),
                            optional_out("dgate", "gate")}),
     .option_count = 1,
     .op = OpType::AdaLnGateResidual},
    {.reduction_tree = nullptr,
     .option_list = {kActivation},
     .forward = signature({in("x"), out("y", "x", {"x"})}),
     .backward = signature({in("x"), in("dy"), out("dx", "x", {"x", "dy"})}),
     .option_count = 1,
     .op = OpType::Activation},
    {.reduction_tree = nullptr,
     .option_list = {kSigma, kSigmaPrev, kNoiseLevel, kSigmaMax},
     .forward = signature({in("x"), in("v"), in("noise"), out("prev", "x", {"x", "noise"})}),
     .backward = signature({in("dprev"), optional_out("dx", "dprev", nullptr, {"dprev"}),
                            optional_out("dv", "dprev", nullptr, {"dprev"})}),
     .option_count = 4,
     .op = OpType::FlowSdeStep},
    {.reduction_tree = "linear-tree-v1",
     .option_list = {kSigma, kSigmaPrev, kNoiseLevel, kSigmaMax},
     .forward = signature({in("x"), in("v"), in("prev"), per_sample_out("logp", "x")}),
     .backward = signature({in("x"), in("v"), in("prev"), in("dlogp"),
                            optional_out("dx", "x", nullptr, {"x"}),
                            optional_out("dv", "v", nullptr, {"v"})}),
     .option_count = 4,
     .op = OpType::FlowSdeLogp},
    {.reduction_tree = nullptr,
     .option_list = {kTransform},
     .forward = signature({in("z"), in("mean"), in("std"), out("y", "z", {"z"})}),
     .backward = signature({in("dy"), in("std"), out("dz", "dy", {"dy"})}),
     .option_count = 1,
     .op = OpType::LatentNormalize},
    // A permutation: an output never overlaps its input.
    {.reduction_tree = nullptr,
     .option_list = {kHeight, kWidth},
     .forward = signature({in("x"), packed_out("y", "x")}),
     .backward = signature({in("dy"), unpacked_out("dx", "dy")}),
     .option_count = 2,
     .op = OpType::LatentPack},
    {.reduction_tree = "tree16-v1",
     .option_list = {kScale},
     .forward = signature({in("cond"), in("uncond"), out("v", "cond", {"cond", "uncond"})}),
     .backward = signature({in("cond"), in("uncond"), in("dv"), optional_out("dcond", "cond"),
                            optional_out("duncond", "uncond")}),
     .option_count = 1,
     .op = OpType::TrueCfg},
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

// Every output's like, rows_of and in_place_of name an input of its signature.
constexpr bool names_an_input(const Signature& s, const char* name) {
  const int i = s.index(name);
  return i >= 0 && s.list[static_cast<std::size_t>(i)].role == TensorRole::Input;
}
constexpr bool well_formed(const Signature& s) {
  for (const TensorSpec& t : s.tensors()) {
    if (t.role == TensorRole::Input) continue;
    if (t.like == nullptr || !names_an_input(s, t.like)) return false;
    if (t.rows_of != nullptr && !names_an_input(s, t.rows_of)) return false;
    for (const char* in : t.in_place_of) {
      if (in != nullptr && !names_an_input(s, in)) return false;
    }
  }
  return s.count > 0;
}
constexpr bool signatures_well_formed() {
  for (const OpDescriptor& d : kDescriptors) {
    if (!well_formed(d.forward) || !well_formed(d.backward)) return false;
  }
  return true;
}
static_assert(signatures_well_formed(), "outputs refer to inputs of their signature");

}  // namespace

const OpDescriptor& descriptor(OpType op) {
  return kDescriptors[static_cast<int>(op)];
}

}  // namespace kernel_align::detail
