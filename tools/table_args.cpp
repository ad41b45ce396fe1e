#include "table_args.hpp"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernel_align/error.hpp"
#include "kernel_align/tables.hpp"
#include "tensor_io.hpp"

namespace kernel_align::cli {
namespace {

RopeTableSpec parse_table_spec(const Args& args) {
  RopeTableSpec spec;
  if (const auto axes = args.optional("--axes")) spec.axes_dim = parse_int_list("--axes", *axes);
  if (const auto theta = args.optional("--theta")) {
    spec.theta = parse_finite_float("--theta", *theta);
  }
  return spec;
}

// int32 [S, axes], copied out of the file's bytes into properly typed storage.
std::vector<std::int32_t> read_positions(const Args& args, std::size_t axes) {
  const NpyArray file = read_npy(args.required("--positions"), "--positions");
  if (file.type != NpyType::I32 || file.shape.size() != 2 ||
      file.shape[1] != static_cast<std::int64_t>(axes)) {
    throw Error("--positions",
                "int32 ('<i4') [S, " + std::to_string(axes) + "] (one column per axis of --axes)",
                std::string("'") + npy_descr(file.type) + "' " + shape_tuple(file.shape));
  }
  std::vector<std::int32_t> positions(static_cast<std::size_t>(file.numel()));
  std::memcpy(positions.data(), file.data.data(), file.data.size());
  return positions;
}

NpyArray fp32_matrix(std::int64_t rows, std::int64_t columns, const std::vector<float>& values) {
  NpyArray array = make_npy_array(NpyType::F32, {rows, columns});
  std::memcpy(array.data.data(), values.data(), array.data.size());
  return array;
}

}  // namespace

CosSin tables_from_positions(const Args& args) {
  const RopeTableSpec spec = parse_table_spec(args);
  const std::vector<std::int32_t> positions = read_positions(args, spec.axes_dim.size());
  FlagNames names{{"spec.axes_dim", "--axes"}, {"spec.theta", "--theta"}, {"rows", "--positions"}};
  for (std::size_t a = 0; a < spec.axes_dim.size(); ++a) {
    names.emplace("spec.axes_dim[" + std::to_string(a) + "]", "--axes");
  }
  const RopeTables tables = call_library(names, [&] {
    return build_rope_tables(
        positions.data(), static_cast<std::int64_t>(positions.size() / spec.axes_dim.size()), spec);
  });
  return {fp32_matrix(tables.rows, tables.columns, tables.cos),
          fp32_matrix(tables.rows, tables.columns, tables.sin)};
}

}  // namespace kernel_align::cli
