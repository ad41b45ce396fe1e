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
  std::string text =
      join(v.shape, v.rank) + " " + dtype_name(v.dtype) + " strides " + join(v.strides, v.rank);
  if (v.device != Device::cpu()) text += " on " + device_name(v.device);
  return text;
}

const char* platform_name(Platform p) {
  switch (p) {
    case Platform::Cpu:
      return "cpu";
    case Platform::Cuda:
      return "cuda";
    case Platform::Rocm:
      return "rocm";
    case Platform::Musa:
      return "musa";
    case Platform::Npu:
      return "npu";
  }
  return "?";
}

std::string device_name(Device d) {
  if (d.platform == Platform::Cpu) return "cpu";
  return std::string(platform_name(d.platform)) + ":" + std::to_string(d.ordinal);
}

}  // namespace kernel_align
