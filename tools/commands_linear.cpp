// kernel-align apply linear / linear-backward.
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kernel_align/ops.hpp"
#include "output_files.hpp"
#include "tensor_io.hpp"

namespace kernel_align::cli {
namespace {

// --x x.npy --weight w.npy [--bias b.npy] [--activation A]
constexpr std::array<FlagSpec, 4> kLinearFlags{
    {file_flag("--x"), file_flag("--weight"), file_flag("--bias"), {"--activation"}}};

const FlagNames kLinearFlagNames{{"x", "--x"},   {"weight", "--weight"}, {"bias", "--bias"},
                                 {"y", "--out"}, {"dy", "--dy"},         {"dx", "--dx"},
                                 {"dw", "--dw"}, {"db", "--db"}};

struct LinearInputs {
  NpyArray x;
  NpyArray weight;
  std::optional<NpyArray> bias;
  LinearOptions options;

  std::optional<ConstTensorView> bias_view() const {
    return bias ? std::optional<ConstTensorView>(const_view(*bias)) : std::nullopt;
  }
};

LinearInputs read_linear_inputs(const Args& args) {
  LinearInputs in{read_float_input(args, "--x"),
                  read_float_input(args, "--weight"),
                  read_optional_float_input(args, "--bias"),
                  {}};
  if (const auto activation = args.optional("--activation")) {
    in.options.activation = activation_from_name(*activation, "--activation");
  }
  return in;
}

// An array of x's dtype and leading shape with `last` as its last dim.
NpyArray rows_like(const NpyArray& x, DType dtype, std::int64_t last) {
  NpyArray out = float_array_like(x, dtype);
  out.shape.back() = last;
  out.data.resize(static_cast<std::size_t>(out.numel()) * dtype_size(dtype));
  return out;
}

void run_forward(const Args& args) {
  const std::string& out_path = args.required("--out");
  const LinearInputs in = read_linear_inputs(args);
  const auto out_dtype = args.optional("--out-dtype");
  const std::int64_t n = in.weight.shape.empty() ? 0 : in.weight.shape.front();
  NpyArray y = rows_like(
      in.x, out_dtype ? parse_dtype("--out-dtype", *out_dtype) : float_dtype(in.x, "--x"), n);
  call_library(kLinearFlagNames, [&] {
    linear_forward(const_view(in.x), const_view(in.weight), in.bias_view(), mutable_view(y),
                   in.options);
  });
  write_outputs({{"--out", out_path, encode_npy(y)}});
}

void run_backward(const Args& args) {
  const std::optional<std::string> dx_path = args.optional("--dx");
  const std::optional<std::string> dw_path = args.optional("--dw");
  const std::optional<std::string> db_path = args.optional("--db");
  if (!dx_path && !dw_path && !db_path) {
    throw Error("--dx", "at least one of --dx, --dw, --db", "none of them");
  }
  if (db_path && !args.has("--bias")) {
    throw Error("--db", "--bias as well (db is the gradient of the bias)", "no --bias");
  }
  const LinearInputs in = read_linear_inputs(args);
  const NpyArray dy = read_float_input(args, "--dy");
  std::optional<NpyArray> dx, dw, db;
  if (dx_path) dx = float_array_like(in.x, float_dtype(in.x, "--x"));
  if (dw_path) dw = float_array_like(in.weight, float_dtype(in.weight, "--weight"));
  if (db_path) db = float_array_like(*in.bias, float_dtype(*in.bias, "--bias"));
  const auto view = [](std::optional<NpyArray>& a) {
    return a ? std::optional<TensorView>(mutable_view(*a)) : std::nullopt;
  };
  call_library(kLinearFlagNames, [&] {
    linear_backward(const_view(in.x), const_view(in.weight), in.bias_view(), const_view(dy),
                    view(dx), view(dw), view(db), in.options);
  });
  std::vector<OutputFile> outputs;
  if (dx) outputs.push_back({"--dx", *dx_path, encode_npy(*dx)});
  if (dw) outputs.push_back({"--dw", *dw_path, encode_npy(*dw)});
  if (db) outputs.push_back({"--db", *db_path, encode_npy(*db)});
  write_outputs(outputs);
}

}  // namespace

Command linear_forward_command() {
  return {"apply linear",
          "--x x.npy --weight w.npy [--bias b.npy] [--activation " +
              choices_usage(OpType::Linear, "activation") +
              "] [--out-dtype fp32|bf16|fp16] --out y.npy",
          "y = act(x w^T + b) under the contract's linear tree; the output dtype defaults to "
          "that of x",
          Args::flags(kLinearFlags, {{"--out-dtype"}, file_flag("--out")}), run_forward};
}

Command linear_backward_command() {
  return {"apply linear-backward",
          "--x x.npy --weight w.npy [--bias b.npy] [--activation " +
              choices_usage(OpType::Linear, "activation") +
              "] --dy dy.npy [--dx dx.npy] [--dw dw.npy] [--db db.npy]",
          "gradients of linear: dx, dw, db (needs --bias), each in the dtype of its tensor",
          Args::flags(kLinearFlags,
                      {file_flag("--dy"), file_flag("--dx"), file_flag("--dw"), file_flag("--db")}),
          run_backward};
}

}  // namespace kernel_align::cli
