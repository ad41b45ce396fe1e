// splitmix64: a fixed, platform-independent pseudo-random stream, for generated inputs
// that must be the same on every platform and standard library (the std::
// distributions are implementation-defined). The CLI's jobs and the tests draw from it.
#pragma once

#include <cstdint>

namespace kernel_align {

class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += kGamma);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  // Skips the next n numbers: the state only counts, so a stream can be cut into
  // ranges drawn apart (on several threads) that join into the same numbers.
  void discard(std::uint64_t n) { state_ += n * kGamma; }

 private:
  static constexpr std::uint64_t kGamma = 0x9E3779B97F4A7C15ull;
  std::uint64_t state_;
};

}  // namespace kernel_align
