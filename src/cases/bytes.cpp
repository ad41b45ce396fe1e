#include "cases/bytes.hpp"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "cases/parallel.hpp"

namespace kernel_align::cases {
namespace {

// Whether the two spans (of one size) hold the same bytes, compared on every core.
bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  std::atomic<bool> differ{false};
  split_over_cores(a.size(), kBytesPerThread, [&](std::size_t begin, std::size_t end) {
    // memcmp's pointers must not be null, even for no bytes.
    if (end > begin && std::memcmp(a.data() + begin, b.data() + begin, end - begin) != 0) {
      differ.store(true, std::memory_order_relaxed);
    }
  });
  return !differ.load(std::memory_order_relaxed);
}

std::uint32_t element_bits(std::span<const std::byte> bytes, std::size_t element,
                           std::size_t size) {
  std::uint32_t bits = 0;
  if (size == 4) {
    std::memcpy(&bits, bytes.data() + element * size, 4);
  } else {
    std::uint16_t half = 0;
    std::memcpy(&half, bytes.data() + element * size, 2);
    bits = half;
  }
  return bits;
}

std::string hex(std::uint32_t bits, std::size_t size) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%0*x", static_cast<int>(2 * size), bits);
  return text;
}

}  // namespace

std::string byte_difference(const std::string& name, std::size_t element_size,
                            std::span<const std::byte> expected, std::span<const std::byte> found) {
  if (expected.size() != found.size()) {
    return name + ": " + std::to_string(expected.size()) + " bytes expected, " +
           std::to_string(found.size()) + " found";
  }
  if (same_bytes(expected, found)) {
    return "";
  }
  const std::size_t elements = expected.size() / element_size;
  std::size_t differing = 0;
  std::size_t first = 0;
  for (std::size_t i = 0; i < elements; ++i) {
    if (element_bits(expected, i, element_size) == element_bits(found, i, element_size)) continue;
    if (differing++ == 0) first = i;
  }
  return name + ": " + std::to_string(differing) + " of " + std::to_string(elements) +
         " elements differ, first at element " + std::to_string(first) + ": expected " +
         hex(element_bits(expected, first, element_size), element_size) + ", found " +
         hex(element_bits(found, first, element_size), element_size);
}

}  // namespace kernel_align::cases
