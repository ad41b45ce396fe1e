// The contract's floating-point environment holds on every thread of the CPU
// backend: a caller that enabled flush-to-zero and denormals-are-zero (as a library
// built with -ffast-math does when it loads) still gets the reference's bytes for
// subnormal inputs and results, at every thread count and on every path, and gets
// its own MXCSR back after the call.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kernel_align/ops.hpp"
#include "kernel_align/runtime.hpp"
#include "support/op_cases.hpp"
#include "support/runtime_guard.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace kernel_align {
namespace {

using test::CaseSpec;
using test::OpKind;
using test::Rng;

#if defined(__x86_64__) || defined(__i386__)

constexpr unsigned kFtzDaz = 0x8040u;  // MXCSR flush-to-zero | denormals-are-zero

// Sets MXCSR for the scope (the calling thread only).
class Mxcsr {
 public:
  explicit Mxcsr(unsigned value) : saved_(_mm_getcsr()) { _mm_setcsr(value); }
  ~Mxcsr() { _mm_setcsr(saved_); }
  Mxcsr(const Mxcsr&) = delete;
  Mxcsr& operator=(const Mxcsr&) = delete;

 private:
  unsigned saved_;
};

// [..., D] fp32 values that are mostly subnormal (and some normal ones nearby),
// so every product and sum in the op lands near or below 2^-126.
test::HostTensor subnormal_rows(std::vector<std::int64_t> shape, Rng& rng) {
  test::HostTensor x(DType::F32, std::move(shape));
  for (std::int64_t i = 0; i < x.elements(); ++i) {
    const int exponent = i % 5 == 0 ? -120 : -135;
    x.set(i, std::ldexp(rng.uniform(-1.0, 1.0), exponent));
  }
  return x;
}

class FlushToZeroCaller : public ::testing::TestWithParam<OpKind> {};

TEST_P(FlushToZeroCaller, GetsTheReferenceBytesAndItsMxcsrBack) {
  const OpKind op = GetParam();
  const test::RuntimeGuard guard;
  Rng rng(81);
  CaseSpec c;
  c.in = DType::F32;
  c.out = DType::F32;
  c.weight = DType::F32;
  c.dw = DType::F32;
  c.mode = NormMode::Single;
  // Large enough for the pool to use 7 threads.
  c.batch = 2;
  c.seq = 131;
  c.heads = 5;
  c.k_heads = 4;
  c.d = 128;
  c.text_len = 5;
  SCOPED_TRACE(std::string(test::op_name(op)));
  test::with_case(op, c, rng, [&](auto one) {
    // Replace the inputs by subnormal ones.
    const auto refill = [&](test::PlacedBuffer& b) {
      b.assign(subnormal_rows(b.shape(), rng).cview());
    };
    using Case = decltype(one);
    if constexpr (std::is_same_v<Case, test::NormForwardCase>) {
      refill(one.x);
    } else if constexpr (std::is_same_v<Case, test::NormBackwardCase>) {
      refill(one.x);
      refill(one.dy);
    } else if constexpr (std::is_same_v<Case, test::RopeCase>) {
      refill(one.x);
    } else if constexpr (std::is_same_v<Case, test::FusedForwardCase>) {
      refill(one.q);
      refill(one.k);
    } else {
      refill(one.q);
      refill(one.k);
      refill(one.dq_out);
      refill(one.dk_out);
    }
    test::RunConfig::reference().apply();
    const test::Outputs expected = one.run();
    for (const test::RunConfig& config : test::all_cpu_configs()) {
      config.apply();
      test::Outputs got;
      unsigned after = 0;
      {
        const Mxcsr ftz(_mm_getcsr() | kFtzDaz);
        const unsigned before = _mm_getcsr();
        got = one.run();
        after = _mm_getcsr();
        EXPECT_EQ(after, before) << "the caller's MXCSR was not restored, " << config.name();
      }
      EXPECT_TRUE(test::same_bytes(expected, got)) << config.name() << " with FTZ/DAZ set";
    }
    // The reference itself under FTZ/DAZ too.
    test::RunConfig::reference().apply();
    const Mxcsr ftz(_mm_getcsr() | kFtzDaz);
    EXPECT_TRUE(test::same_bytes(expected, one.run())) << "reference with FTZ/DAZ set";
  });
}

INSTANTIATE_TEST_SUITE_P(Ops, FlushToZeroCaller, ::testing::ValuesIn(test::kAllOps),
                         [](const ::testing::TestParamInfo<OpKind>& param) {
                           return std::string(test::op_name(param.param));
                         });

// The subnormal inputs matter: computed with FTZ/DAZ by plain code, they give
// different numbers (so the test above can fail).
TEST(FlushToZeroCaller, TheInputsAreSensitiveToFlushing) {
  Rng rng(82);
  const test::HostTensor x = subnormal_rows({1, 16}, rng);
  volatile float a = static_cast<float>(x.get(1));
  volatile float one = 1.0f;
  const float exact = a * one;
  float flushed = 0.0f;
  {
    const Mxcsr ftz(_mm_getcsr() | kFtzDaz);
    flushed = a * one;
  }
  EXPECT_NE(exact, 0.0f);
  EXPECT_EQ(flushed, 0.0f);
}

#else

TEST(FlushToZeroCaller, X86Only) {
  GTEST_SKIP() << "MXCSR flush-to-zero is an x86 setting";
}

#endif

}  // namespace
}  // namespace kernel_align
