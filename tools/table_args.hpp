// cos/sin tables from a positions file: shared by `tables` and `apply rope`.
#pragma once

#include <array>

#include "cli_args.hpp"
#include "npy.hpp"

namespace kernel_align::cli {

// --positions pos.npy [--axes 16,56,56] [--theta 10000]
inline constexpr std::array<FlagSpec, 3> kPositionTableFlags{
    {file_flag("--positions"), {"--axes"}, {"--theta"}}};

struct CosSin {
  NpyArray cos;  // fp32 [S, D/2]
  NpyArray sin;
};

// The tables of the int32 [S, axes] positions in --positions, with the axes of --axes
// (default 16,56,56) and --theta (default 10000).
CosSin tables_from_positions(const Args& args);

}  // namespace kernel_align::cli
