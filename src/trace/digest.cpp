#include "trace/digest.hpp"

#include <cstring>
#include <string>

#include "kernel_align/error.hpp"
#include "kernel_align/trace.hpp"

#include "trace/digest_v1.hpp"

namespace kernel_align::trace {
namespace {

std::uint64_t load_le64(const unsigned char* p) {
  std::uint64_t word = 0;
  for (int i = 7; i >= 0; --i) word = (word << 8) | p[i];
  return word;
}

}  // namespace

Digest::Digest(std::uint64_t byte_count) : state_(digest_v1::start(byte_count)) {}

void Digest::mix(std::uint64_t word) {
  state_ = digest_v1::mix(state_, word);
}

void Digest::update(const unsigned char* bytes, std::size_t count) {
  while (count > 0 && pending_bytes_ != 0) {
    pending_ |= static_cast<std::uint64_t>(*bytes++) << (8 * pending_bytes_);
    --count;
    if (++pending_bytes_ == 8) {
      mix(pending_);
      pending_ = 0;
      pending_bytes_ = 0;
    }
  }
  for (; count >= 8; bytes += 8, count -= 8) mix(load_le64(bytes));
  for (; count > 0; --count) {
    pending_ |= static_cast<std::uint64_t>(*bytes++) << (8 * pending_bytes_++);
  }
}

std::uint64_t Digest::finish() {
  if (pending_bytes_ != 0) mix(pending_);  // zero-padded last word
  pending_ = 0;
  pending_bytes_ = 0;
  return digest_v1::finish(state_);
}

std::uint64_t digest_strided(const unsigned char* base, std::size_t element_size,
                             std::span<const std::int64_t> shape,
                             std::span<const std::int64_t> strides) {
  const auto rank = static_cast<int>(shape.size());
  std::int64_t count = 1;
  for (const std::int64_t n : shape) count *= n;
  Digest digest(static_cast<std::uint64_t>(count) * element_size);
  if (count == 0) return digest.finish();
  // The trailing dims [inner, rank) that are row-major contiguous are fed as one run of
  // `run` elements: the whole array in one update when it is contiguous, and far fewer
  // updates than elements for the views of sliced or permuted tensors.
  int inner = rank;
  std::int64_t run = 1;
  while (inner > 0 && (shape[inner - 1] == 1 || strides[inner - 1] == run)) {
    --inner;
    run *= shape[inner];
  }
  const std::size_t run_bytes = static_cast<std::size_t>(run) * element_size;
  const auto element = static_cast<std::int64_t>(element_size);
  // The outer dims [0, inner) count like an odometer, in row-major order.
  std::vector<std::int64_t> index(static_cast<std::size_t>(inner), 0);
  for (std::int64_t done = 0; done < count; done += run) {
    std::int64_t offset = 0;
    for (int d = 0; d < inner; ++d) offset += index[d] * strides[d];
    digest.update(base + offset * element, run_bytes);
    for (int d = inner - 1; d >= 0 && ++index[d] == shape[d]; --d) index[d] = 0;
  }
  return digest.finish();
}

std::uint64_t digest_of(const ConstTensorView& v) {
  const auto rank = static_cast<std::size_t>(v.rank);
  return digest_strided(static_cast<const unsigned char*>(v.data), dtype_size(v.dtype),
                        std::span(v.shape.data(), rank), std::span(v.strides.data(), rank));
}

std::vector<std::uint64_t> batch_digests(const ConstTensorView& v) {
  if (v.rank != kMaxRank) return {digest_of(v)};
  std::vector<std::uint64_t> digests;
  for (std::int64_t b = 0; b < v.shape[0]; ++b)
    digests.push_back(digest_of(narrow(v, 0, b, b + 1)));
  return digests;
}

}  // namespace kernel_align::trace

namespace kernel_align {

std::vector<std::uint64_t> digests_along(const StridedBytes& array,
                                         std::optional<std::size_t> batch_dim) {
  const std::size_t rank = array.shape.size();
  if (array.strides.size() != rank) {
    throw Error("strides", std::to_string(rank) + " strides (one per dim of the shape)",
                std::to_string(array.strides.size()));
  }
  for (std::size_t d = 0; d < rank; ++d) {
    if (array.strides[d] < 0 || array.shape[d] < 0) {
      throw Error("strides", "non-negative shape and strides",
                  "dim " + std::to_string(d) + ": size " + std::to_string(array.shape[d]) +
                      ", stride " + std::to_string(array.strides[d]));
    }
  }
  const auto* base = static_cast<const unsigned char*>(array.data);
  if (!batch_dim) {
    return {trace::digest_strided(base, array.element_size, array.shape, array.strides)};
  }
  if (*batch_dim >= rank) {
    throw Error("batch_dim", "a dim below the rank " + std::to_string(rank),
                std::to_string(*batch_dim));
  }
  // Element b of the batch: the slice at index b of batch_dim, whose size there is 1.
  std::vector<std::int64_t> shape(array.shape.begin(), array.shape.end());
  shape[*batch_dim] = 1;
  const std::int64_t step =
      array.strides[*batch_dim] * static_cast<std::int64_t>(array.element_size);
  std::vector<std::uint64_t> digests;
  for (std::int64_t b = 0; b < array.shape[*batch_dim]; ++b) {
    digests.push_back(
        trace::digest_strided(base + b * step, array.element_size, shape, array.strides));
  }
  return digests;
}

}  // namespace kernel_align
