// kernel-align apply qk-rmsnorm / qk-rmsnorm-backward.
#include <array>
#include <optional>
#include <string>

#include "commands.hpp"
#include "kernel_align/ops.hpp"
#include "output_files.hpp"
#include "tensor_io.hpp"

namespace kernel_align::cli {
namespace {

// --x x.npy [--weight w.npy] [--eps E] [--mode M]
constexpr std::array<FlagSpec, 4> kRmsNormFlags{
    {file_flag("--x"), file_flag("--weight"), {"--eps"}, {"--mode"}}};

const FlagNames kRmsNormFlagNames{{"x", "--x"},   {"weight", "--weight"}, {"eps", "--eps"},
                                  {"y", "--out"}, {"dy", "--dy"},         {"dx", "--dx"},
                                  {"dw", "--dw"}};

struct RmsNormInputs {
  NpyArray x;
  std::optional<NpyArray> weight;
  RmsNormOptions options;

  std::optional<ConstTensorView> weight_view() const {
    return weight ? std::optional<ConstTensorView>(const_view(*weight)) : std::nullopt;
  }
};

RmsNormInputs read_rmsnorm_inputs(const Args& args) {
  RmsNormInputs in{read_float_input(args, "--x"), read_optional_float_input(args, "--weight"), {}};
  if (const auto eps = args.optional("--eps")) {
    in.options.eps = parse_finite_float("--eps", *eps);
  }
  if (const auto mode = args.optional("--mode")) {
    in.options.mode = norm_mode_from_name(*mode, "--mode");
  }
  return in;
}

void run_forward(const Args& args) {
  const std::string& out_path = args.required("--out");
  const RmsNormInputs in = read_rmsnorm_inputs(args);
  const auto out_dtype = args.optional("--out-dtype");
  NpyArray y = float_array_like(
      in.x, out_dtype ? parse_dtype("--out-dtype", *out_dtype) : float_dtype(in.x, "--x"));
  call_library(kRmsNormFlagNames, [&] {
    qk_rmsnorm_forward(const_view(in.x), in.weight_view(), mutable_view(y), in.options);
  });
  write_outputs({{"--out", out_path, encode_npy(y)}});
}

void run_backward(const Args& args) {
  const std::string& dx_path = args.required("--dx");
  const std::optional<std::string> dw_path = args.optional("--dw");
  if (dw_path && !args.has("--weight")) {
    throw Error("--dw", "--weight as well (dw is the gradient of the weight)", "no --weight");
  }
  const RmsNormInputs in = read_rmsnorm_inputs(args);
  const NpyArray dy = read_float_input(args, "--dy");
  NpyArray dx = float_array_like(in.x, float_dtype(in.x, "--x"));
  std::optional<NpyArray> dw;
  if (dw_path) dw = float_array_like(*in.weight, float_dtype(*in.weight, "--weight"));
  call_library(kRmsNormFlagNames, [&] {
    qk_rmsnorm_backward(const_view(in.x), const_view(dy), in.weight_view(), mutable_view(dx),
                        dw ? std::optional<TensorView>(mutable_view(*dw)) : std::nullopt,
                        in.options);
  });
  std::vector<OutputFile> outputs{{"--dx", dx_path, encode_npy(dx)}};
  if (dw) outputs.push_back({"--dw", *dw_path, encode_npy(*dw)});
  write_outputs(outputs);
}

}  // namespace

Command rmsnorm_forward_command() {
  const std::string modes = choices_usage(OpType::QkRmsNorm, "mode");
  return {"apply qk-rmsnorm",
          "--x x.npy [--weight w.npy] [--eps 1e-6] [--mode " + modes +
              "] [--out-dtype fp32|bf16|fp16] --out y.npy",
          "per-head RMSNorm over the last dim; the output dtype defaults to that of x",
          Args::flags(kRmsNormFlags, {{"--out-dtype"}, file_flag("--out")}), run_forward};
}

Command rmsnorm_backward_command() {
  const std::string modes = choices_usage(OpType::QkRmsNorm, "mode");
  return {
      "apply qk-rmsnorm-backward",
      "--x x.npy --dy dy.npy [--weight w.npy] [--eps 1e-6] [--mode " + modes +
          "] --dx dx.npy [--dw dw.npy]",
      "gradients of qk-rmsnorm: dx in the dtype of x, dw (needs --weight) in that of the weight",
      Args::flags(kRmsNormFlags, {file_flag("--dy"), file_flag("--dx"), file_flag("--dw")}),
      run_backward};
}

}  // namespace kernel_align::cli
