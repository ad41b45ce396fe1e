// kernel-align apply attention / attention-backward.
#include <array>
#include <optional>
#include <string>

#include "commands.hpp"
#include "kernel_align/ops.hpp"
#include "output_files.hpp"
#include "tensor_io.hpp"

namespace kernel_align::cli {
namespace {

// --q q.npy --k k.npy --v v.npy [--mask m.npy] [--layout L]
constexpr std::array<FlagSpec, 5> kAttentionFlags{
    {file_flag("--q"), file_flag("--k"), file_flag("--v"), file_flag("--mask"), {"--layout"}}};

const FlagNames kAttentionFlagNames{
    {"q", "--q"},       {"k", "--k"},   {"v", "--v"},   {"mask", "--mask"}, {"out", "--out"},
    {"dout", "--dout"}, {"dq", "--dq"}, {"dk", "--dk"}, {"dv", "--dv"},     {"layout", "--layout"}};

struct AttentionInputs {
  NpyArray q, k, v;
  std::optional<NpyArray> mask;
  AttentionOptions options;

  std::optional<ConstTensorView> mask_view() const {
    return mask ? std::optional<ConstTensorView>(const_view(*mask)) : std::nullopt;
  }
};

AttentionInputs read_attention_inputs(const Args& args) {
  AttentionInputs in{read_float_input(args, "--q"),
                     read_float_input(args, "--k"),
                     read_float_input(args, "--v"),
                     read_optional_mask_input(args, "--mask"),
                     {}};
  if (const auto layout = args.optional("--layout")) {
    in.options.layout = layout_from_name(*layout, "--layout");
  }
  return in;
}

void run_forward(const Args& args) {
  const std::string& out_path = args.required("--out");
  const AttentionInputs in = read_attention_inputs(args);
  NpyArray out = float_array_like(in.q, float_dtype(in.q, "--q"));
  call_library(kAttentionFlagNames, [&] {
    attention_forward(const_view(in.q), const_view(in.k), const_view(in.v), in.mask_view(),
                      mutable_view(out), in.options);
  });
  write_outputs({{"--out", out_path, encode_npy(out)}});
}

void run_backward(const Args& args) {
  const std::string& dq_path = args.required("--dq");
  const std::string& dk_path = args.required("--dk");
  const std::string& dv_path = args.required("--dv");
  const AttentionInputs in = read_attention_inputs(args);
  const NpyArray out = read_float_input(args, "--out");
  const NpyArray dout = read_float_input(args, "--dout");
  NpyArray dq = float_array_like(in.q, float_dtype(in.q, "--q"));
  NpyArray dk = float_array_like(in.k, float_dtype(in.k, "--k"));
  NpyArray dv = float_array_like(in.v, float_dtype(in.v, "--v"));
  call_library(kAttentionFlagNames, [&] {
    attention_backward(const_view(in.q), const_view(in.k), const_view(in.v), in.mask_view(),
                       const_view(out), const_view(dout), mutable_view(dq), mutable_view(dk),
                       mutable_view(dv), in.options);
  });
  write_outputs({{"--dq", dq_path, encode_npy(dq)},
                 {"--dk", dk_path, encode_npy(dk)},
                 {"--dv", dv_path, encode_npy(dv)}});
}

}  // namespace

Command attention_forward_command() {
  return {"apply attention",
          "--q q.npy --k k.npy --v v.npy [--mask mask.npy] [--layout " +
              choices_usage(OpType::Attention, "layout") + "] --out out.npy",
          "joint attention under the contract: q, k, v [B, S, H, D] (bshd) or [B, H, S, D] "
          "(bhsd), mask bool [B, S] (true: the token takes part); out in the dtype of q",
          Args::flags(kAttentionFlags, {file_flag("--out")}), run_forward};
}

Command attention_backward_command() {
  return {"apply attention-backward",
          "--q q.npy --k k.npy --v v.npy [--mask mask.npy] [--layout " +
              choices_usage(OpType::Attention, "layout") +
              "] --out out.npy --dout dout.npy --dq dq.npy --dk dk.npy --dv dv.npy",
          "gradients of attention from the forward's out and its gradient dout: dq, dk, dv, "
          "each in the dtype of its input",
          Args::flags(kAttentionFlags, {file_flag("--out"), file_flag("--dout"), file_flag("--dq"),
                                        file_flag("--dk"), file_flag("--dv")}),
          run_backward};
}

}  // namespace kernel_align::cli
