// Test storage for views with any strides at a chosen misalignment, and bytewise
// comparison of everything a call may have written (including the gaps a strided
// output must leave alone).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cases/bytes.hpp"
#include "kernel_align/tensor.hpp"
#include "support/tensors.hpp"

// Under AddressSanitizer the bytes around a PlacedBuffer's span are poisoned, so a
// kernel that reads or writes past a tensor's first or last element fails loudly.
#if defined(__SANITIZE_ADDRESS__)
#define KA_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KA_TEST_ASAN 1
#endif
#endif
#if defined(KA_TEST_ASAN)
#include <sanitizer/asan_interface.h>
#endif

namespace kernel_align::test {

// Row-major element strides of `shape`, with `pad` unused elements after every
// row of the last dim (pad 0: contiguous).
inline std::vector<std::int64_t> padded_strides(const std::vector<std::int64_t>& shape,
                                                std::int64_t pad = 0) {
  std::vector<std::int64_t> strides(shape.size());
  std::int64_t step = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = step;
    step *= shape[i];
    if (i + 1 == shape.size()) step += pad;
  }
  return strides;
}

// Whether a view is row-major contiguous.
inline bool is_row_major(const ConstTensorView& v) {
  std::int64_t step = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    if (v.shape[d] != 1 && v.strides[d] != step) return false;
    step *= v.shape[d];
  }
  return true;
}

// The byte offset of a buffer's first element past a 64-byte boundary that makes
// its data pointer as badly aligned as its dtype allows: 2 for 16-bit types, 4 for
// fp32.
inline std::size_t unaligned_offset(DType dtype) {
  return dtype_size(dtype);
}

// Owning storage of a view with the given shape and element strides, whose first
// element sits `misalign` bytes past a 64-byte boundary. Every byte of the span the
// view covers (gaps included) starts as `fill`. Movable, not copyable (the views
// point into it).
class PlacedBuffer {
 public:
  PlacedBuffer(DType dtype, std::vector<std::int64_t> shape, std::vector<std::int64_t> strides,
               std::size_t misalign = 0, std::byte fill = std::byte{0xA5})
      : dtype_(dtype), shape_(std::move(shape)), strides_(std::move(strides)) {
    std::int64_t last = 0;
    for (std::size_t i = 0; i < shape_.size(); ++i) last += (shape_[i] - 1) * strides_[i];
    span_bytes_ = static_cast<std::size_t>(last + 1) * dtype_size(dtype_);
    storage_.assign(span_bytes_ + 64 + misalign, std::byte{0});
    const auto address = reinterpret_cast<std::uintptr_t>(storage_.data());
    offset_ = static_cast<std::size_t>((64 - address % 64) % 64) + misalign;
    std::fill(storage_.begin() + static_cast<std::ptrdiff_t>(offset_),
              storage_.begin() + static_cast<std::ptrdiff_t>(offset_ + span_bytes_), fill);
    poison_margins(true);
  }
  // A contiguous row-major buffer of `shape`.
  PlacedBuffer(DType dtype, const std::vector<std::int64_t>& shape, std::size_t misalign = 0)
      : PlacedBuffer(dtype, shape, padded_strides(shape), misalign) {}

  // Moving keeps the heap block (and its poisoned margins); a moved-from buffer
  // holds nothing.
  PlacedBuffer(PlacedBuffer&& other) noexcept
      : dtype_(other.dtype_),
        shape_(std::move(other.shape_)),
        strides_(std::move(other.strides_)),
        storage_(std::move(other.storage_)),
        offset_(other.offset_),
        span_bytes_(other.span_bytes_) {
    other.storage_.clear();
  }
  PlacedBuffer& operator=(PlacedBuffer&& other) noexcept {
    if (this == &other) return *this;
    poison_margins(false);
    dtype_ = other.dtype_;
    shape_ = std::move(other.shape_);
    strides_ = std::move(other.strides_);
    storage_ = std::move(other.storage_);
    other.storage_.clear();
    offset_ = other.offset_;
    span_bytes_ = other.span_bytes_;
    return *this;
  }
  PlacedBuffer(const PlacedBuffer&) = delete;
  PlacedBuffer& operator=(const PlacedBuffer&) = delete;
  ~PlacedBuffer() { poison_margins(false); }

  DType dtype() const { return dtype_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  void* data() { return storage_.data() + offset_; }
  const void* data() const { return storage_.data() + offset_; }

  TensorView view() { return make_view<TensorView>(data()); }
  ConstTensorView cview() const { return make_view<ConstTensorView>(data()); }

  // Every byte of the covered span, gaps included.
  std::vector<std::byte> bytes() const {
    const auto begin = storage_.begin() + static_cast<std::ptrdiff_t>(offset_);
    return {begin, begin + static_cast<std::ptrdiff_t>(span_bytes_)};
  }

  // Copies the logical elements of `src` (same dtype and shape) in; gaps keep
  // their bytes.
  void assign(const ConstTensorView& src) {
    if (is_row_major(src) && is_row_major(cview())) {
      std::memcpy(data(), src.data, span_bytes_);  // same shape and dtype: same bytes
      return;
    }
    copy_into(src, view());
  }

  // Stores a bit pattern (16 or 32 bits, by dtype) at logical element `flat`
  // (row-major over the shape).
  void set_bits(std::int64_t flat, std::uint32_t bits) {
    std::int64_t offset = 0;
    for (std::size_t d = shape_.size(); d-- > 0;) {
      offset += (flat % shape_[d]) * strides_[d];
      flat /= shape_[d];
    }
    auto* p =
        static_cast<std::byte*>(data()) + offset * static_cast<std::int64_t>(dtype_size(dtype_));
    if (dtype_ == DType::F32) {
      std::memcpy(p, &bits, 4);
    } else {
      const auto half = static_cast<std::uint16_t>(bits);
      std::memcpy(p, &half, 2);
    }
  }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (std::int64_t s : shape_) n *= s;
    return n;
  }

 private:
  template <class View, class Pointer>
  View make_view(Pointer p) const {
    View v;
    v.data = p;
    v.dtype = dtype_;
    v.rank = static_cast<int>(shape_.size());
    for (int d = 0; d < v.rank; ++d) {
      v.shape[d] = shape_[d];
      v.strides[d] = strides_[d];
    }
    return v;
  }

  // Marks the bytes before the first element and after the span as off limits
  // (AddressSanitizer builds only), or lifts that again before the block is freed.
  void poison_margins([[maybe_unused]] bool poison) {
#if defined(KA_TEST_ASAN)
    if (storage_.empty()) return;
    std::byte* begin = storage_.data();
    std::byte* end = begin + storage_.size();
    if (!poison) {
      ASAN_UNPOISON_MEMORY_REGION(begin, storage_.size());
      return;
    }
    ASAN_POISON_MEMORY_REGION(begin, offset_);
    ASAN_POISON_MEMORY_REGION(begin + offset_ + span_bytes_,
                              static_cast<std::size_t>(end - (begin + offset_ + span_bytes_)));
#endif
  }

  DType dtype_;
  std::vector<std::int64_t> shape_;
  std::vector<std::int64_t> strides_;
  std::vector<std::byte> storage_;
  std::size_t offset_ = 0;
  std::size_t span_bytes_ = 0;
};

// A copy of `src` (contiguous HostTensor or any view) in a PlacedBuffer of the
// given strides and misalignment.
inline PlacedBuffer placed_copy(const ConstTensorView& src, std::vector<std::int64_t> strides,
                                std::size_t misalign = 0) {
  std::vector<std::int64_t> shape(src.shape.begin(), src.shape.begin() + src.rank);
  PlacedBuffer b(src.dtype, std::move(shape), std::move(strides), misalign);
  b.assign(src);
  return b;
}

// One output of a call: its name and every byte it covers.
struct NamedBytes {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::byte> bytes;
};
using Outputs = std::vector<NamedBytes>;

inline NamedBytes named_bytes(std::string name, const PlacedBuffer& b) {
  return {std::move(name), b.dtype(), b.bytes()};
}
inline NamedBytes named_bytes(std::string name, const HostTensor& t) {
  const auto* p = static_cast<const std::byte*>(t.data());
  return {std::move(name), t.dtype(),
          std::vector<std::byte>(
              p, p + static_cast<std::size_t>(t.elements()) * dtype_size(t.dtype()))};
}
// The logical elements of a view, as the bytes of its dtype in row-major order.
inline NamedBytes logical_named_bytes(std::string name, const ConstTensorView& v) {
  const std::vector<std::uint32_t> bits = logical_bits(v);
  const std::size_t size = dtype_size(v.dtype);
  std::vector<std::byte> bytes(bits.size() * size);
  for (std::size_t i = 0; i < bits.size(); ++i) {
    if (size == 4) {
      std::memcpy(bytes.data() + 4 * i, &bits[i], 4);
    } else {
      const auto half = static_cast<std::uint16_t>(bits[i]);
      std::memcpy(bytes.data() + 2 * i, &half, 2);
    }
  }
  return {std::move(name), v.dtype, std::move(bytes)};
}

// Every output byte for byte (memcmp); on failure names the output, the first
// differing element (of its dtype) and how many differ.
inline ::testing::AssertionResult same_bytes(const Outputs& expected, const Outputs& actual) {
  if (expected.size() != actual.size()) {
    return ::testing::AssertionFailure()
           << expected.size() << " expected outputs, " << actual.size() << " actual";
  }
  std::string failures;
  for (std::size_t o = 0; o < expected.size(); ++o) {
    const NamedBytes& e = expected[o];
    const std::string d = cases::byte_difference(e.name + " (" + dtype_name(e.dtype) + ")",
                                                 dtype_size(e.dtype), e.bytes, actual[o].bytes);
    if (!d.empty()) failures += "\n  " + d;
  }
  if (failures.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "outputs differ:" << failures;
}

}  // namespace kernel_align::test
