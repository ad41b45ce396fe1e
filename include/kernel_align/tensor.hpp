// A non-owning strided view of up to 4 dimensions on one device. Strides count elements,
// not bytes, and may be any non-negative value: views of permuted or sliced tensors
// work without copies.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "kernel_align/device.hpp"
#include "kernel_align/dtype.hpp"

namespace kernel_align {

inline constexpr int kMaxRank = 4;

template <class Pointer>
struct BasicTensorView {
  Pointer data = nullptr;
  DType dtype = DType::F32;
  int rank = 0;
  std::array<std::int64_t, kMaxRank> shape{};
  std::array<std::int64_t, kMaxRank> strides{};
  Device device{};  // where `data` points: host memory, or a CUDA device's

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
  std::int64_t size(int dim) const { return shape[dim < 0 ? rank + dim : dim]; }
  std::int64_t stride(int dim) const { return strides[dim < 0 ? rank + dim : dim]; }

  // A row-major contiguous view.
  static BasicTensorView contiguous(Pointer data, DType dtype,
                                    std::initializer_list<std::int64_t> shape, Device device = {}) {
    BasicTensorView v;
    v.data = data;
    v.dtype = dtype;
    v.device = device;
    v.rank = static_cast<int>(shape.size());
    int i = 0;
    for (std::int64_t s : shape) v.shape[i++] = s;
    std::int64_t step = 1;
    for (int d = v.rank - 1; d >= 0; --d) {
      v.strides[d] = step;
      step *= v.shape[d];
    }
    return v;
  }

  // Implicit: a mutable view is usable wherever a read-only one is asked for.
  template <class Other>
  BasicTensorView(const BasicTensorView<Other>& other)  // NOLINT(google-explicit-constructor)
      : data(other.data),
        dtype(other.dtype),
        rank(other.rank),
        shape(other.shape),
        strides(other.strides),
        device(other.device) {}
  BasicTensorView() = default;
};

using TensorView = BasicTensorView<void*>;
using ConstTensorView = BasicTensorView<const void*>;

// Indices [begin, end) of dim `dim` (like torch.narrow); the caller keeps them in range.
template <class Pointer>
BasicTensorView<Pointer> narrow(BasicTensorView<Pointer> v, int dim, std::int64_t begin,
                                std::int64_t end) {
  using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<Pointer>>,
                                  const unsigned char, unsigned char>;
  v.data = static_cast<Byte*>(v.data) +
           begin * v.strides[dim] * static_cast<std::int64_t>(dtype_size(v.dtype));
  v.shape[dim] = end - begin;
  return v;
}

// "[1, 7145, 24, 128] bf16 strides [21949440, 3072, 128, 1]" (with " on cuda:0" for a
// view of device memory), for messages.
std::string describe(const ConstTensorView& v);
std::string shape_string(const ConstTensorView& v);

}  // namespace kernel_align
