#include "kernel_align/tensor.hpp"

#include <string>

namespace kernel_align {
namespace {

std::string join(const std::array<std::int64_t, kMaxRank>& values, int rank) {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(values[i]);
  }
  return s + "]";
}

}  // namespace

std::string shape_string(const ConstTensorView& v) {
  return join(v.shape, v.rank);
}

std::string describe(const ConstTensorView& v) {
  return join(v.shape, v.rank) + " " + dtype_name(v.dtype) + " strides " + join(v.strides, v.rank);
}

}  // namespace kernel_align
