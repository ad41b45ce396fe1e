// digest-v1 (docs/trace.md): 64-bit digests of the bytes a tensor holds, taken in
// logical index order whatever its strides, one per batch element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernel_align/tensor.hpp"

namespace kernel_align::trace {

// The hash of a byte stream of known length, fed in pieces of any size.
class Digest {
 public:
  explicit Digest(std::uint64_t byte_count);
  void update(const unsigned char* bytes, std::size_t count);
  // The digest; every announced byte must have been fed.
  std::uint64_t finish();

 private:
  void mix(std::uint64_t word);
  std::uint64_t state_;
  std::uint64_t pending_ = 0;  // bytes of the word being filled, little-endian
  int pending_bytes_ = 0;
};

// The digest of the elements of a strided array of any rank, in row-major index order:
// `base` points at element [0, ..., 0], strides count elements of `element_size` bytes.
// The one walk over strided memory that every host digest takes.
std::uint64_t digest_strided(const unsigned char* base, std::size_t element_size,
                             std::span<const std::int64_t> shape,
                             std::span<const std::int64_t> strides);

// The digest of every element of v, in row-major index order.
std::uint64_t digest_of(const ConstTensorView& v);

// One digest per index of dim 0 for a 4-D view, else one for the whole view.
std::vector<std::uint64_t> batch_digests(const ConstTensorView& v);

}  // namespace kernel_align::trace
