#include "cases/inputs.hpp"

#include "kernel_align/contract/convert.hpp"

namespace kernel_align::cases {
namespace {

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
  const auto n = static_cast<std::int64_t>(bytes.size() / dtype_size(dtype));
  switch (dtype) {
    case DType::F32:
      return fill_uniform_as<DType::F32>(random, bytes.data(), n, lo, width);
    case DType::BF16:
      return fill_uniform_as<DType::BF16>(random, bytes.data(), n, lo, width);
    case DType::F16:
      return fill_uniform_as<DType::F16>(random, bytes.data(), n, lo, width);
  }
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
