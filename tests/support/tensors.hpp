// Test helpers: owning host tensors, reproducible random data, and logical
// (stride-aware) reads of views for bitwise comparisons and for the oracle.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <utility>
#include <vector>

#include "core/splitmix64.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/tensor.hpp"

namespace kernel_align::test {

// Test inputs from splitmix64 (src/core/splitmix64.hpp).
class Rng : public SplitMix64 {
 public:
  using SplitMix64::SplitMix64;

  // Uniform in [lo, hi), 53 random bits.
  double uniform(double lo, double hi) {
    return lo + (hi - lo) * (static_cast<double>(next() >> 11) * 0x1p-53);
  }
  // Uniform in [0, n).
  std::int64_t below(std::int64_t n) {
    return static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(n));
  }
  // Uniform in (-1, 1) times 2^k, k uniform in [-spread, spread]: activations with
  // a dynamic range, so that roundings land in several binades.
  double spread(int spread) {
    const auto k = static_cast<int>(below(2 * spread + 1)) - spread;
    return std::ldexp(uniform(-1.0, 1.0), k);
  }
};

// The element offset of a logical index in a view.
inline std::int64_t view_offset(const ConstTensorView& v, const std::array<std::int64_t, 4>& idx) {
  std::int64_t offset = 0;
  for (int d = 0; d < v.rank; ++d) offset += idx[d] * v.strides[d];
  return offset;
}

// Calls f(flat, index) for every element of a view's shape in row-major order.
template <class F>
void for_each_index(const ConstTensorView& v, const F& f) {
  std::array<std::int64_t, 4> idx{};
  const std::int64_t n = v.numel();
  for (std::int64_t flat = 0; flat < n; ++flat) {
    f(flat, idx);
    for (int d = v.rank - 1; d >= 0; --d) {
      if (++idx[d] < v.shape[d]) break;
      idx[d] = 0;
    }
  }
}

// The stored bit pattern of an element (16 or 32 bits).
inline std::uint32_t element_bits(const ConstTensorView& v, std::int64_t offset) {
  if (v.dtype == DType::F32) return contract::bits_of(static_cast<const float*>(v.data)[offset]);
  return static_cast<const std::uint16_t*>(v.data)[offset];
}

// Every element's bits in logical row-major order, whatever the strides.
inline std::vector<std::uint32_t> logical_bits(const ConstTensorView& v) {
  std::vector<std::uint32_t> out(static_cast<std::size_t>(v.numel()));
  for_each_index(v, [&](std::int64_t flat, const std::array<std::int64_t, 4>& idx) {
    out[static_cast<std::size_t>(flat)] = element_bits(v, view_offset(v, idx));
  });
  return out;
}

// Copies every element's bits from `src` to the same logical element of `dst`
// (same dtype and shape, any strides).
inline void copy_into(const ConstTensorView& src, const TensorView& dst) {
  for_each_index(src, [&](std::int64_t, const std::array<std::int64_t, 4>& idx) {
    const std::uint32_t bits = element_bits(src, view_offset(src, idx));
    const std::int64_t offset = view_offset(dst, idx);
    if (dst.dtype == DType::F32) {
      std::memcpy(static_cast<float*>(dst.data) + offset, &bits, sizeof bits);
    } else {
      static_cast<std::uint16_t*>(dst.data)[offset] = static_cast<std::uint16_t>(bits);
    }
  });
}

// Every element's exact value in logical row-major order.
inline std::vector<double> logical_values(const ConstTensorView& v) {
  std::vector<double> out(static_cast<std::size_t>(v.numel()));
  for_each_index(v, [&](std::int64_t flat, const std::array<std::int64_t, 4>& idx) {
    out[static_cast<std::size_t>(flat)] = contract::load_f32(v.dtype, v.data, view_offset(v, idx));
  });
  return out;
}

// An owning, zero-filled, row-major buffer of `shape`.
class HostTensor {
 public:
  HostTensor(DType dtype, std::vector<std::int64_t> shape)
      : dtype_(dtype), shape_(std::move(shape)) {
    std::int64_t n = 1;
    for (std::int64_t s : shape_) n *= s;
    bytes_.assign(static_cast<std::size_t>(n) * dtype_size(dtype), std::byte{0});
  }

  DType dtype() const { return dtype_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::int64_t elements() const {
    return static_cast<std::int64_t>(bytes_.size() / dtype_size(dtype_));
  }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }

  TensorView view() { return contiguous_view<TensorView>(data()); }
  ConstTensorView cview() const { return contiguous_view<ConstTensorView>(data()); }

  // Element `offset` of the buffer, read exactly; written rounded to fp32, then
  // stored as an op stores its results.
  double get(std::int64_t offset) const { return contract::load_f32(dtype_, data(), offset); }
  void set(std::int64_t offset, double v) {
    contract::store_output(dtype_, data(), offset, static_cast<float>(v));
  }
  std::vector<double> values() const { return logical_values(cview()); }
  void fill_bytes(std::byte b) { std::fill(bytes_.begin(), bytes_.end(), b); }
  bool operator==(const HostTensor& other) const = default;

 private:
  template <class View, class Pointer>
  View contiguous_view(Pointer p) const {
    View v;
    v.data = p;
    v.dtype = dtype_;
    v.rank = static_cast<int>(shape_.size());
    std::int64_t step = 1;
    for (int d = v.rank - 1; d >= 0; --d) {
      v.shape[d] = shape_[d];
      v.strides[d] = step;
      step *= shape_[d];
    }
    return v;
  }

  DType dtype_;
  std::vector<std::int64_t> shape_;
  std::vector<std::byte> bytes_;
};

// A tensor of `shape` filled with rng.spread(spread) * scale, rounded to dtype.
inline HostTensor random_tensor(DType dtype, std::vector<std::int64_t> shape, Rng& rng,
                                double scale = 1.0, int spread = 3) {
  HostTensor t(dtype, std::move(shape));
  for (std::int64_t i = 0; i < t.elements(); ++i) t.set(i, scale * rng.spread(spread));
  return t;
}

// A view of `base` with the given logical shape and element strides.
template <class View>
View strided(View base, std::initializer_list<std::int64_t> shape,
             std::initializer_list<std::int64_t> strides) {
  base.rank = static_cast<int>(shape.size());
  std::copy(shape.begin(), shape.end(), base.shape.begin());
  std::copy(strides.begin(), strides.end(), base.strides.begin());
  return base;
}

}  // namespace kernel_align::test
