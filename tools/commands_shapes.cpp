// kernel-align shapes: the Qwen-Image shapes of verify, the benchmark and `run`
// (src/cases/shapes.hpp) as JSON, so that the scripts that run the same shapes
// (bench/compare_torch.py, bench/compare_peers.py) take them from the one list.
#include <cstdio>
#include <string>
#include <vector>

#include "cases/shapes.hpp"
#include "commands.hpp"

namespace kernel_align::cli {
namespace {

std::string json_list(const std::vector<cases::Shape>& shapes) {
  std::string j = "[";
  for (const cases::Shape& s : shapes) {
    j += (j.size() == 1 ? "\n    " : ",\n    ") + cases::shape_json(s);
  }
  return j + "\n  ]";
}

void run_shapes(const Args&) {
  std::printf("{\n  \"issue\": %s,\n  \"quick\": %s\n}\n", json_list(cases::issue_shapes()).c_str(),
              json_list(cases::quick_shapes()).c_str());
}

}  // namespace

Command shapes_command() {
  return {"shapes",
          "",
          "the Qwen-Image shapes of verify, the benchmark and run, as JSON: {\"issue\": [...], "
          "\"quick\": [...]}, each {name, batch, heads, head_dim, text_len, images: [{height, "
          "width}]} with image grids in tokens",
          {},
          run_shapes};
}

}  // namespace kernel_align::cli
