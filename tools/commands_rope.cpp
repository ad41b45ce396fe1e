// kernel-align apply rope / rope-backward.
#include <array>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kernel_align/ops.hpp"
#include "output_files.hpp"
#include "table_args.hpp"
#include "tensor_io.hpp"

namespace kernel_align::cli {
namespace {

// The flag and library names of one direction's input and output.
struct Direction {
  const char* in_flag;
  const char* out_flag;
  const char* in_name;
  const char* out_name;
  void (*op)(const ConstTensorView&, const ConstTensorView&, const ConstTensorView&,
             const TensorView&, const RopeOptions&, const ExecutionContext&);
};

constexpr Direction kForward{"--x", "--out", "x", "y", multi_axis_rope_forward};
constexpr Direction kBackward{"--dy", "--dx", "dy", "dx", multi_axis_rope_backward};

RopeOptions parse_rope_options(const Args& args) {
  return {pairing_from_name(args.required("--pairing"), "--pairing"),
          layout_from_name(args.required("--layout"), "--layout")};
}

// Tables built from --positions must fit the input; the library would blame
// 'cos', which the user never named.
void check_tables_fit(const CosSin& tables, const NpyArray& input, const Direction& dir,
                      Layout layout) {
  if (input.shape.size() != 4) return;  // the library names the input's rank
  const std::int64_t d = input.shape[3];
  if (tables.cos.shape[1] * 2 != d) {
    throw Error(
        "--axes",
        "axes summing to D = " + std::to_string(d) + " (the last dim of " + dir.in_flag + ")",
        "a sum of " + std::to_string(tables.cos.shape[1] * 2));
  }
  const std::int64_t seq = input.shape[layout == Layout::BSHD ? 1 : 2];
  if (tables.cos.shape[0] != seq) {
    throw Error("--positions",
                std::to_string(seq) + " rows (S of " + dir.in_flag + " in layout " +
                    layout_name(layout) + ")",
                std::to_string(tables.cos.shape[0]));
  }
}

// Either --positions (with --axes, --theta) or --cos and --sin.
CosSin read_tables(const Args& args, const NpyArray& input, const Direction& dir, Layout layout) {
  if (args.has("--positions")) {
    for (const char* flag : {"--cos", "--sin"}) {
      if (args.has(flag)) {
        throw Error(flag, "either --positions or --cos and --sin",
                    "both --positions and " + std::string(flag));
      }
    }
    CosSin tables = tables_from_positions(args);
    check_tables_fit(tables, input, dir, layout);
    return tables;
  }
  for (const char* flag : {"--axes", "--theta"}) {
    if (args.has(flag)) throw Error(flag, "--positions, which it configures", "--cos and --sin");
  }
  return {read_float_input(args, "--cos"), read_float_input(args, "--sin")};
}

void run_rope(const Args& args, const Direction& dir) {
  const std::string& out_path = args.required(dir.out_flag);
  const RopeOptions options = parse_rope_options(args);
  const NpyArray input = read_float_input(args, dir.in_flag);
  const CosSin tables = read_tables(args, input, dir, options.layout);
  NpyArray out = float_array_like(input, float_dtype(input, dir.in_flag));
  call_library({{dir.in_name, dir.in_flag},
                {dir.out_name, dir.out_flag},
                {"cos", "--cos"},
                {"sin", "--sin"}},
               [&] {
                 dir.op(const_view(input), const_view(tables.cos), const_view(tables.sin),
                        mutable_view(out), options, {});
               });
  write_outputs({{dir.out_flag, out_path, encode_npy(out)}});
}

constexpr std::array<FlagSpec, 4> kRopeFlags{
    {file_flag("--cos"), file_flag("--sin"), {"--pairing"}, {"--layout"}}};

Command rope_command(std::string name, std::string summary, const Direction& dir,
                     void (*run)(const Args&)) {
  std::vector<FlagSpec> flags =
      Args::flags(kPositionTableFlags, {file_flag(dir.in_flag), file_flag(dir.out_flag)});
  flags.insert(flags.end(), kRopeFlags.begin(), kRopeFlags.end());
  return {std::move(name),
          std::string(dir.in_flag) + " " + dir.in_name +
              ".npy (--positions pos.npy [--axes 16,56,56] [--theta 10000] | --cos cos.npy "
              "--sin sin.npy) --pairing " +
              choices_usage(OpType::MultiAxisRope, "pairing") + " --layout " +
              choices_usage(OpType::MultiAxisRope, "layout") + " " + dir.out_flag + " " +
              dir.out_name + ".npy",
          std::move(summary), std::move(flags), run};
}

}  // namespace

Command rope_forward_command() {
  return rope_command("apply rope",
                      "multi-axis RoPE of a 4-D x; tables from positions or given as fp32 [S, D/2]",
                      kForward, [](const Args& args) { run_rope(args, kForward); });
}

Command rope_backward_command() {
  return rope_command("apply rope-backward",
                      "gradient of rope (the transpose rotation), dx in the dtype of dy", kBackward,
                      [](const Args& args) { run_rope(args, kBackward); });
}

}  // namespace kernel_align::cli
