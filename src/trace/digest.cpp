#include "trace/digest.hpp"

#include <cstring>

#include "trace/digest_v1.hpp"

namespace kernel_align::trace {
namespace {

std::uint64_t load_le64(const unsigned char* p) {
  std::uint64_t word = 0;
  for (int i = 7; i >= 0; --i) word = (word << 8) | p[i];
  return word;
}

bool is_row_major(const ConstTensorView& v) {
  std::int64_t step = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    if (v.shape[d] != 1 && v.strides[d] != step) return false;
    step *= v.shape[d];
  }
  return true;
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

std::uint64_t digest_of(const ConstTensorView& v) {
  const std::size_t element = dtype_size(v.dtype);
  const auto* base = static_cast<const unsigned char*>(v.data);
  const std::int64_t count = v.numel();
  Digest digest(static_cast<std::uint64_t>(count) * element);
  if (is_row_major(v)) {
    digest.update(base, static_cast<std::size_t>(count) * element);
    return digest.finish();
  }
  // Element by element in row-major index order: index[] counts like an odometer.
  std::int64_t index[kMaxRank] = {};
  for (std::int64_t n = 0; n < count; ++n) {
    std::int64_t offset = 0;
    for (int d = 0; d < v.rank; ++d) offset += index[d] * v.strides[d];
    digest.update(base + offset * static_cast<std::int64_t>(element), element);
    for (int d = v.rank - 1; d >= 0 && ++index[d] == v.shape[d]; --d) index[d] = 0;
  }
  return digest.finish();
}

std::vector<std::uint64_t> batch_digests(const ConstTensorView& v) {
  if (v.rank != kMaxRank) return {digest_of(v)};
  std::vector<std::uint64_t> digests;
  for (std::int64_t b = 0; b < v.shape[0]; ++b)
    digests.push_back(digest_of(narrow(v, 0, b, b + 1)));
  return digests;
}

}  // namespace kernel_align::trace
