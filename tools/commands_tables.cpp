// kernel-align tables: the fp32 cos/sin tables of a positions file.
#include "commands.hpp"
#include "output_files.hpp"
#include "table_args.hpp"

namespace kernel_align::cli {
namespace {

void run_tables(const Args& args) {
  const std::string& cos_path = args.required("--cos");
  const std::string& sin_path = args.required("--sin");
  const CosSin tables = tables_from_positions(args);
  write_outputs(
      {{"--cos", cos_path, encode_npy(tables.cos)}, {"--sin", sin_path, encode_npy(tables.sin)}});
}

}  // namespace

Command tables_command() {
  return {"tables",
          "--positions pos.npy [--axes 16,56,56] [--theta 10000] --cos cos.npy --sin sin.npy",
          "fp32 cos/sin tables [S, D/2] of int32 positions [S, axes]",
          Args::flags(kPositionTableFlags, {file_flag("--cos"), file_flag("--sin")}), run_tables};
}

}  // namespace kernel_align::cli
