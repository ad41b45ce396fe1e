// The contract assumes IEEE defaults: round to nearest-even, subnormals kept.
// A process may have changed them (a library built with -ffast-math sets
// flush-to-zero when it loads), so every op runs under the defaults and puts the
// caller's state back afterwards.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#else
#include <cfenv>
#endif

namespace kernel_align::detail {

class ContractFloatEnvironment {
 public:
#if defined(__x86_64__) || defined(__i386__)
  // MXCSR: all exceptions masked, round to nearest, FTZ and DAZ off.
  static constexpr unsigned kIeeeDefault = 0x1F80u;
  ContractFloatEnvironment() : saved_(_mm_getcsr()) {
    _mm_setcsr(kIeeeDefault);
  }
  ~ContractFloatEnvironment() {
    _mm_setcsr(saved_);
  }
#else
  // Elsewhere only the rounding mode is portable to set; flush-to-zero control is
  // per architecture and added with the backend for that architecture.
  ContractFloatEnvironment() : saved_(static_cast<unsigned>(std::fegetround())) {
    std::fesetround(FE_TONEAREST);
  }
  ~ContractFloatEnvironment() {
    std::fesetround(static_cast<int>(saved_));
  }
#endif
  ContractFloatEnvironment(const ContractFloatEnvironment&) = delete;
  ContractFloatEnvironment& operator=(const ContractFloatEnvironment&) = delete;

 private:
  unsigned saved_;
};

}  // namespace kernel_align::detail
