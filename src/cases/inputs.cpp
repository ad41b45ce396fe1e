#include "cases/inputs.hpp"

#include <stdexcept>

#include "cases/parallel.hpp"
#include "kernel_align/contract/convert.hpp"

namespace kernel_align::cases {
namespace {

// Enough draws (a millisecond or so) to be worth a thread of their own.
constexpr std::size_t kDrawsPerThread = std::size_t{1} << 18;

// The dtype a template argument, so that the loop has no dtype switch: verify fills
// billions of elements.
template <DType kType>
void fill_uniform_as(Random& random, std::byte* data, std::int64_t n, float lo, float width) {
  for (std::int64_t i = 0; i < n; ++i) {
    contract::store_output(kType, data, i, random.uniform(lo, width));
  }
}

}  // namespace

void fill_uniform(Random& random, DType dtype, std::span<std::byte> bytes, float lo, float width) {
  const std::size_t size = dtype_size(dtype);
  const std::size_t n = bytes.size() / size;
  // Each range draws from its own copy of the stream, moved on to the range's start.
  split_over_cores(n, kDrawsPerThread, [&](std::size_t begin, std::size_t end) {
    Random part = random;
    part.discard(begin);
    std::byte* data = bytes.data() + begin * size;
    const auto count = static_cast<std::int64_t>(end - begin);
    switch (dtype) {
      case DType::F32:
        return fill_uniform_as<DType::F32>(part, data, count, lo, width);
      case DType::BF16:
        return fill_uniform_as<DType::BF16>(part, data, count, lo, width);
      case DType::F16:
        return fill_uniform_as<DType::F16>(part, data, count, lo, width);
      case DType::Bool:  // masks are built, not drawn
        throw std::logic_error("fill_uniform: a bool array");
    }
  });
  random.discard(n);
}

std::uint64_t seed_of(std::string_view name) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace kernel_align::cases
