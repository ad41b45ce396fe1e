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
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

 private:
  std::uint64_t state_;
};

}  // namespace kernel_align
