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

// The largest rank a view has (the ops take 1 to 4 dims).
inline constexpr int kMaxRank = 4;

// The view, over `void*` (TensorView: an op's outputs) or `const void*` (ConstTensorView:
// its inputs). A plain aggregate: nothing is checked until an op validates it (an Error
// naming the argument for a rank, shape, stride, null or misaligned pointer it refuses).
template <class Pointer>
struct BasicTensorView {
  Pointer data = nullptr;  // the first element; aligned to dtype_size(dtype)
  DType dtype = DType::F32;
  int rank = 0;                                  // dims in use, 0 to kMaxRank
  std::array<std::int64_t, kMaxRank> shape{};    // sizes of dims 0 .. rank-1 (ops: each > 0)
  std::array<std::int64_t, kMaxRank> strides{};  // in elements, >= 0
  Device device{};  // where `data` points: host memory, or a CUDA device's

  // The product of the sizes (1 for rank 0).
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
  // Size and stride of dim `dim`, negative counting from the last (-1); unchecked.
  std::int64_t size(int dim) const { return shape[dim < 0 ? rank + dim : dim]; }
  std::int64_t stride(int dim) const { return strides[dim < 0 ? rank + dim : dim]; }

  // A row-major contiguous view of `shape` (at most kMaxRank sizes; unchecked).
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
  // An empty view: null data, rank 0, fp32 on the CPU.
  BasicTensorView() = default;
};

// The two views: writable (outputs) and read-only (inputs; a TensorView converts to it).
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
std::string shape_string(const ConstTensorView& v);  // "[1, 7145, 24, 128]"

}  // namespace kernel_align
