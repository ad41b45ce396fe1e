// Inputs the SIMD paths handle apart from plain numbers: NaNs of any sign and
// payload (stored canonical), infinities, rows whose sum of squares overflows,
// subnormals, signed zeros, values at the rounding ties of bf16 and fp16 and at
// fp16's overflow threshold, and tables holding exact 0, 1 and -1. The CPU
// backend must store the reference's bytes for all of them.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernel_align/ops.hpp"
#include "kernel_align/runtime.hpp"
#include "support/op_cases.hpp"
#include "support/runtime_guard.hpp"

namespace kernel_align {
namespace {

using test::CaseSpec;
using test::OpKind;
using test::PlacedBuffer;
using test::Rng;

// Bit patterns of special values in `dtype`.
struct Specials {
  std::vector<std::uint32_t> bits;
};

Specials specials(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return {{
          0x7FC00000u,  // quiet NaN
          0xFFC00001u,  // negative quiet NaN with a payload
          0x7F800001u,  // signalling NaN
          0x7F800000u,  // +Inf
          0xFF800000u,  // -Inf
          0x7F7FFFFFu,  // largest finite: its square overflows
          0x00000001u,  // smallest subnormal
          0x807FFFFFu,  // largest negative subnormal
          0x80000000u,  // -0
          0x5F800000u,  // 2^64: the row's sum of squares overflows
      }};
    case DType::BF16:
      return {{0x7FC0u, 0xFFC1u, 0x7F81u, 0x7F80u, 0xFF80u, 0x7F7Fu, 0x0001u, 0x807Fu, 0x8000u,
               0x5F80u}};
    case DType::F16:
      return {{0x7E00u, 0xFE01u, 0x7C01u, 0x7C00u, 0xFC00u, 0x7BFFu, 0x0001u, 0x83FFu, 0x8000u,
               0x0400u}};
    case DType::Bool:
      break;
  }
  return {};
}

// Writes the special values into rows 0, 2, 4, ... of `b` (one per row, at a
// position that moves across vector lanes); odd rows stay finite.
void poke_specials(PlacedBuffer& b, std::int64_t d) {
  const Specials s = specials(b.dtype());
  const std::int64_t rows = b.numel() / d;
  std::size_t next = 0;
  for (std::int64_t r = 0; r < rows; r += 2) {
    const std::int64_t i = (r * 7 + 3) % d;
    b.set_bits(r * d + i, s.bits[next++ % s.bits.size()]);
  }
}

// Logical rows of a 4-D buffer in its own dim order have d elements each, so
// flat index r * d + i is element i of row r for every layout.
template <class Case>
void poke_inputs(Case& c, std::int64_t d);

template <>
void poke_inputs(test::NormForwardCase& c, std::int64_t d) {
  poke_specials(c.x, d);
}
template <>
void poke_inputs(test::NormBackwardCase& c, std::int64_t d) {
  poke_specials(c.x, d);
  poke_specials(c.dy, d);
}
template <>
void poke_inputs(test::RopeCase& c, std::int64_t d) {
  poke_specials(c.x, d);
}
template <>
void poke_inputs(test::FusedForwardCase& c, std::int64_t d) {
  poke_specials(c.q, d);
  poke_specials(c.k, d);
}
template <>
void poke_inputs(test::FusedBackwardCase& c, std::int64_t d) {
  poke_specials(c.q, d);
  poke_specials(c.k, d);
  poke_specials(c.dq_out, d);
  poke_specials(c.dk_out, d);
}

class SpecialValues : public ::testing::TestWithParam<OpKind> {};

TEST_P(SpecialValues, NaNsInfinitiesOverflowAndSubnormals) {
  const OpKind op = GetParam();
  Rng rng(21);
  for (DType in : {DType::F32, DType::BF16, DType::F16}) {
    for (DType out : {DType::F32, DType::BF16, DType::F16}) {
      for (std::int64_t d : {18, 128}) {
        CaseSpec c;
        c.in = in;
        c.out = out;
        c.weight = DType::BF16;
        c.dw = DType::F32;
        c.mode = NormMode::Diffusers;
        c.pairing = d == 18 ? Pairing::Half : Pairing::Interleaved;
        c.layout = d == 18 ? Layout::BHSD : Layout::BSHD;
        c.seq = 11;
        c.d = d;
        SCOPED_TRACE(std::string(test::op_name(op)) + " " + c.name());
        test::with_case(op, c, rng, [&](auto one) {
          poke_inputs(one, d);
          test::expect_configs_match_reference(one, test::all_cpu_configs());
        });
      }
    }
  }
}

// Special values in the weight (Inf, NaN, -0, a subnormal) and in the tables (NaN,
// Inf): the arithmetic is defined for them too.
TEST_P(SpecialValues, InWeightsAndTables) {
  const OpKind op = GetParam();
  Rng rng(22);
  for (DType wt : {DType::F32, DType::BF16, DType::F16}) {
    CaseSpec c;
    c.in = DType::BF16;
    c.out = DType::BF16;
    c.weight = wt;
    c.dw = wt;
    c.mode = NormMode::Diffusers;
    c.seq = 11;
    c.d = 64;
    SCOPED_TRACE(std::string(test::op_name(op)) + " " + c.name());
    const Specials s = specials(wt);
    const auto poke_weight = [&](std::optional<PlacedBuffer>& w) {
      if (!w) return;
      w->set_bits(5, s.bits[3]);   // +Inf
      w->set_bits(20, s.bits[1]);  // NaN
      w->set_bits(33, s.bits[8]);  // -0
      w->set_bits(47, s.bits[6]);  // subnormal
    };
    const auto poke_tables = [&](PlacedBuffer& cos, PlacedBuffer& sin) {
      cos.set_bits(7, 0x7FC00000u);
      sin.set_bits(40, 0xFF800000u);
      cos.set_bits(100, 0x00000000u);
      sin.set_bits(100, 0x80000000u);
    };
    test::with_case(op, c, rng, [&](auto one) {
      using Case = decltype(one);
      if constexpr (std::is_same_v<Case, test::NormForwardCase> ||
                    std::is_same_v<Case, test::NormBackwardCase>) {
        poke_weight(one.weight);
      } else if constexpr (std::is_same_v<Case, test::RopeCase>) {
        poke_tables(one.cos, one.sin);
      } else {
        for (auto& w : one.weights) poke_weight(w);
        poke_tables(one.cos, one.sin);
      }
      test::expect_configs_match_reference(one, test::all_cpu_configs());
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, SpecialValues, ::testing::ValuesIn(test::kAllOps),
                         [](const ::testing::TestParamInfo<OpKind>& param) {
                           return std::string(test::op_name(param.param));
                         });

// RoPE through table rows of exact rotations (cos, sin) = (1, 0), (0, 1), (-1, -0)
// passes values through unchanged up to sign, so fp32 inputs placed at the
// rounding ties of bf16 and fp16, at fp16's subnormal ties and at its overflow
// threshold exercise each narrowing conversion on its edges.
TEST(RoundingEdges, RopeNarrowsTiesSubnormalsAndOverflowLikeTheReference) {
  const std::vector<std::uint32_t> edges = {
      0x3F808000u,  // 1 + 2^-8: bf16 tie, rounds to even (down)
      0x3F818000u,  // bf16 tie, rounds to even (up)
      0xBF808000u,  // negative tie
      0x3F801000u,  // 1 + 2^-11: fp16 tie, rounds to even (down)
      0x3F803000u,  // fp16 tie, rounds to even (up)
      0x477FEFFFu,  // just below 65520: fp16 65504
      0x477FF000u,  // 65520: fp16 Inf
      0xC77FF000u,  // -65520: fp16 -Inf
      0x33000000u,  // 2^-25: fp16 subnormal tie to 0
      0x33400000u,  // 1.5 * 2^-25: rounds up to the smallest fp16 subnormal
      0x387FE000u,  // fp16 subnormal / normal boundary
      0x7F7FFFFFu,  // fp32 max: bf16 Inf
      0x00400000u,  // fp32 subnormal
      0x80000000u,  // -0
  };
  for (DType out : {DType::BF16, DType::F16, DType::F32}) {
    for (bool backward : {false, true}) {
      for (Pairing pairing : {Pairing::Half, Pairing::Interleaved}) {
        const std::int64_t seq = 3;
        const std::int64_t d = 32;
        Rng rng(23);
        CaseSpec c;
        c.in = DType::F32;
        c.out = out;
        c.pairing = pairing;
        c.batch = 1;
        c.seq = seq;
        c.heads = 2;
        c.d = d;
        SCOPED_TRACE(c.name() + (backward ? " backward" : " forward"));
        test::RopeCase rope = test::make_rope(c, backward, rng);
        // Table row s: (1, 0), (0, 1), (-1, -0) in every column.
        const std::uint32_t cos_bits[] = {0x3F800000u, 0x00000000u, 0xBF800000u};
        const std::uint32_t sin_bits[] = {0x00000000u, 0x3F800000u, 0x80000000u};
        for (std::int64_t s = 0; s < seq; ++s) {
          for (std::int64_t k = 0; k < d / 2; ++k) {
            rope.cos.set_bits(s * d / 2 + k, cos_bits[s]);
            rope.sin.set_bits(s * d / 2 + k, sin_bits[s]);
          }
        }
        for (std::int64_t i = 0; i < rope.x.numel(); ++i) {
          rope.x.set_bits(i, edges[static_cast<std::size_t>(i) % edges.size()]);
        }
        test::expect_configs_match_reference(rope, test::all_cpu_configs());
      }
    }
  }
}

}  // namespace
}  // namespace kernel_align
