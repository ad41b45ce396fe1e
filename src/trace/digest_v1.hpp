// The steps of digest-v1 (docs/trace.md), host and device: the host Digest
// (trace/digest.hpp) and the CUDA digest kernel (cuda/device/digest.cuh) both call these.
#pragma once

#include <cstdint>

#include "kernel_align/contract/float_ops.hpp"  // KA_HD

namespace kernel_align::trace::digest_v1 {

inline constexpr std::uint64_t kSeed = 0x9E3779B97F4A7C15ull;
inline constexpr std::uint64_t kWordMultiplier = 0xBF58476D1CE4E5B9ull;
inline constexpr std::uint64_t kStateMultiplier = 0x94D049BB133111EBull;
inline constexpr std::uint64_t kFinalMultiplier = 0xD6E8FEDA2F3F19D5ull;

KA_HD static inline std::uint64_t start(std::uint64_t byte_count) {
  return kSeed ^ byte_count;
}

// One 64-bit little-endian word of the byte stream.
KA_HD static inline std::uint64_t mix(std::uint64_t state, std::uint64_t word) {
  const std::uint64_t x = state ^ (word * kWordMultiplier);
  return ((x << 27) | (x >> 37)) * kStateMultiplier;
}

KA_HD static inline std::uint64_t finish(std::uint64_t state) {
  std::uint64_t h = state;
  h ^= h >> 31;
  h *= kFinalMultiplier;
  h ^= h >> 29;
  return h;
}

}  // namespace kernel_align::trace::digest_v1
