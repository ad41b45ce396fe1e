// The CPU backend gives the reference's bytes whatever the memory looks like: row
// counts that do not divide among the threads (and the dw block partition around
// its blocks of 256 rows), data pointers 2 or 4 bytes off alignment, strided inputs and
// outputs (a BHSD view of a BSHD buffer and the reverse, a last dim of stride 2,
// padded rows), ranks 1 to 4, and outputs that are their inputs (in place).
#include <gtest/gtest.h>

#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernel_align/ops.hpp"
#include "kernel_align/runtime.hpp"
#include "support/op_cases.hpp"
#include "support/runtime_guard.hpp"

namespace kernel_align {
namespace {

using test::CaseSpec;
using test::HostTensor;
using test::OpKind;
using test::Placement;
using test::Rng;
using test::Strides;

// Runs op `op` of `c` on every available ISA path and thread count against the
// reference.
void expect_all_cpu_configs_match(OpKind op, const CaseSpec& c, Rng& rng) {
  SCOPED_TRACE(std::string(test::op_name(op)) + " " + c.name());
  test::with_case(op, c, rng, [&](const auto& one) {
    test::expect_configs_match_reference(one, test::all_cpu_configs());
  });
}

const DType kDtypes[] = {DType::F32, DType::BF16, DType::F16};

class EveryOp : public ::testing::TestWithParam<OpKind> {};

// Rows N of one stream around the dw partition (blocks of 256 rows: fewer rows
// than a block, exactly one block, one more, the same around two blocks) with a
// head dim large enough that the pool splits the rows over 7 threads, plus a prime
// row count and a few thousand rows (more blocks than threads, the last block of
// one row) at D = 128.
TEST_P(EveryOp, RowCountsThatDoNotDivideAmongThreadsOrDwBlocks) {
  const OpKind op = GetParam();
  Rng rng(7);
  struct Rows {
    std::int64_t rows;
    std::int64_t d;
  };
  for (const Rows r : {Rows{1, 4096}, Rows{2, 4096}, Rows{7, 4096}, Rows{255, 4096},
                       Rows{256, 4096}, Rows{257, 4096}, Rows{511, 4096}, Rows{512, 4096},
                       Rows{513, 4096}, Rows{1031, 128}, Rows{2817, 128}}) {
    CaseSpec c;
    c.in = DType::BF16;
    c.out = DType::BF16;
    c.weight = DType::BF16;
    c.dw = DType::F32;
    c.mode = NormMode::Diffusers;
    c.pairing = Pairing::Interleaved;
    c.batch = 1;
    c.heads = 1;
    c.k_heads = 1;
    c.d = r.d;
    // Fused ops: 3 text rows, then the image stream with the row count under test.
    const bool fused = op == OpKind::FusedForward || op == OpKind::FusedBackward;
    c.text_len = fused ? 3 : 0;
    c.seq = r.rows + c.text_len;
    expect_all_cpu_configs_match(op, c, rng);
    if (HasFailure()) return;
  }
}

TEST_P(EveryOp, UnalignedDataPointers) {
  const OpKind op = GetParam();
  Rng rng(8);
  for (DType dtype : kDtypes) {
    for (std::int64_t d : {18, 128}) {
      for (Layout layout : {Layout::BSHD, Layout::BHSD}) {
        CaseSpec c;
        c.in = dtype;
        c.out = dtype == DType::F32 ? DType::BF16 : DType::F32;
        c.weight = dtype;
        c.dw = dtype;
        c.mode = NormMode::Diffusers;
        c.pairing = d == 18 ? Pairing::Half : Pairing::Interleaved;
        c.layout = layout;
        c.seq = 9;
        c.d = d;
        c.inputs = {Strides::Contiguous, true};
        c.outputs = {Strides::Contiguous, true};
        expect_all_cpu_configs_match(op, c, rng);
      }
    }
  }
}

TEST_P(EveryOp, StridedInputsAndOutputs) {
  const OpKind op = GetParam();
  Rng rng(9);
  struct Placements {
    Placement in;
    Placement out;
  };
  const Placements placements[] = {
      {{Strides::PaddedRows, false}, {Strides::Contiguous, false}},
      {{Strides::EveryOther, false}, {Strides::PaddedRows, false}},
      {{Strides::Permuted, false}, {Strides::EveryOther, false}},
      {{Strides::Contiguous, false}, {Strides::Permuted, false}},
      {{Strides::Permuted, true}, {Strides::Permuted, true}},
      {{Strides::EveryOther, true}, {Strides::PaddedRows, true}},
  };
  for (const Placements& p : placements) {
    for (DType dtype : {DType::BF16, DType::F32}) {
      for (Layout layout : {Layout::BSHD, Layout::BHSD}) {
        CaseSpec c;
        c.in = dtype;
        c.out = DType::F16;
        c.weight = DType::BF16;
        c.dw = DType::F32;
        c.mode = NormMode::Diffusers;
        c.pairing = layout == Layout::BSHD ? Pairing::Interleaved : Pairing::Half;
        c.layout = layout;
        c.seq = 9;
        c.d = 128;
        c.inputs = p.in;
        c.outputs = p.out;
        expect_all_cpu_configs_match(op, c, rng);
      }
    }
  }
}

// In place on each backend gives the bytes of the out-of-place call with the same
// placement, and the CPU backend's in-place bytes are the reference's.
TEST_P(EveryOp, InPlaceGivesTheOutOfPlaceBytes) {
  const OpKind op = GetParam();
  const test::RuntimeGuard guard;
  for (DType dtype : kDtypes) {
    for (const Placement placement :
         {Placement{Strides::Contiguous, false}, Placement{Strides::PaddedRows, true},
          Placement{Strides::Permuted, false}, Placement{Strides::EveryOther, true}}) {
      CaseSpec c;
      c.in = dtype;
      c.out = dtype;
      c.weight = DType::F32;
      c.dw = DType::F32;
      c.mode = NormMode::Diffusers;
      c.layout = Layout::BHSD;
      c.seq = 9;
      c.d = 128;
      c.inputs = placement;
      c.outputs = placement;
      CaseSpec in_place = c;
      in_place.in_place = true;
      SCOPED_TRACE(std::string(test::op_name(op)) + " " + in_place.name());
      Rng rng_out(10);
      Rng rng_in(10);
      test::with_case(op, c, rng_out, [&](const auto& out_of_place) {
        test::with_case(op, in_place, rng_in, [&](const auto& same) {
          for (const test::RunConfig& config :
               {test::RunConfig::reference(), test::RunConfig::cpu(best_isa(), 3)}) {
            config.apply();
            EXPECT_TRUE(test::same_bytes(out_of_place.run(), same.run())) << config.name();
          }
          test::expect_configs_match_reference(same, test::all_cpu_configs());
        });
      });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, EveryOp, ::testing::ValuesIn(test::kAllOps),
                         [](const ::testing::TestParamInfo<OpKind>& param) {
                           return std::string(test::op_name(param.param));
                         });

// qk_rmsnorm takes x of rank 1 to 4; rows are the leading indices whatever the rank.
TEST(NormRanks, EveryRankMatchesTheReference) {
  Rng rng(11);
  for (OpKind op : {OpKind::NormForward, OpKind::NormBackward}) {
    for (int rank : {1, 2, 3}) {
      for (std::int64_t d : {2, 128, 4096}) {
        CaseSpec c;
        c.in = DType::F16;
        c.out = DType::BF16;
        c.weight = DType::F16;
        c.dw = DType::F16;
        c.mode = NormMode::Diffusers;
        c.norm_rank = rank;
        c.d = d;
        if (rank == 1) c.batch = c.seq = c.heads = 1;
        if (rank == 2) c.inputs = {Strides::PaddedRows, true};
        expect_all_cpu_configs_match(op, c, rng);
      }
    }
  }
}

// A weight given but its gradient not asked for: dx alone, as the reference.
TEST(NormBackward, WeightWithoutDw) {
  Rng rng(12);
  for (OpKind op : {OpKind::NormBackward, OpKind::FusedBackward}) {
    CaseSpec c;
    c.in = DType::BF16;
    c.out = DType::BF16;
    c.weight = DType::BF16;
    c.dw = std::nullopt;
    c.mode = NormMode::Diffusers;
    c.seq = 40;
    c.heads = 6;
    c.d = 128;
    expect_all_cpu_configs_match(op, c, rng);
  }
}

// q and k as disjoint views of one buffer, whose byte ranges interleave (issue 34, defect
// 8; validation once refused them all as overlapping): the packed QKV layout
// [B, S, 3, H, D] (q and k the slices 0 and 1 of dim 2, v untouched), the halves of rows
// of 2D, and elements interleaved ([..., D, 2]). The fused forward in place, and the norm
// from the q view into the k view, give on every CPU configuration the bytes of the
// same calls on separate tensors, and leave every other element of the buffer as it was.
TEST(DisjointViewsOfOneBuffer, GiveTheBytesOfSeparateTensors) {
  const test::RuntimeGuard guard;
  constexpr std::int64_t kB = 2, kS = 5, kH = 3, kD = 128, kText = 2;
  struct Packing {
    const char* name;
    std::int64_t buffer_elements;
    std::array<std::int64_t, 4> strides;  // of q and k, [B, S, H, D]
    std::int64_t k_offset;                // elements from q's first
  };
  const Packing packings[] = {
      {"packed qkv", kB * kS * 3 * kH * kD, {{kS * 3 * kH * kD, 3 * kH * kD, kD, 1}}, kH * kD},
      {"row halves", kB * kS * kH * 2 * kD, {{kS * kH * 2 * kD, kH * 2 * kD, 2 * kD, 1}}, kD},
      {"interleaved", kB * kS * kH * kD * 2, {{kS * kH * kD * 2, kH * kD * 2, kD * 2, 2}}, 1},
  };
  Rng rng(34);
  const test::TablePair t = test::random_tables(kS, kD, rng);
  const HostTensor w_q = test::random_weight(DType::BF16, kD, rng);
  const HostTensor w_k = test::random_weight(DType::BF16, kD, rng);
  const QkNormWeights weights{w_q.cview(), w_k.cview(), w_q.cview(), w_k.cview()};
  const QkNormRopeOptions options{1e-6f, NormMode::Diffusers, Pairing::Interleaved, Layout::BSHD,
                                  kText};
  std::vector<test::RunConfig> configs = test::all_cpu_configs();
  configs.insert(configs.begin(), test::RunConfig::reference());
  for (const Packing& p : packings) {
    SCOPED_TRACE(p.name);
    const HostTensor original = test::random_tensor(DType::BF16, {p.buffer_elements}, rng);
    // The q and k views of a buffer.
    const auto views = [&](HostTensor& buffer) {
      TensorView q = TensorView::contiguous(buffer.data(), DType::BF16, {kB, kS, kH, kD});
      q.strides = p.strides;
      TensorView k = q;
      k.data = static_cast<std::uint16_t*>(buffer.data()) + p.k_offset;
      return std::pair{q, k};
    };
    // The expected buffers: the calls on contiguous copies, copied back into the views.
    HostTensor fused_expected = original;
    HostTensor norm_expected = original;
    {
      test::RunConfig::reference().apply();
      const auto [q, k] = views(fused_expected);
      HostTensor q_alone(DType::BF16, {kB, kS, kH, kD});
      HostTensor k_alone(DType::BF16, {kB, kS, kH, kD});
      test::copy_into(q, q_alone.view());
      test::copy_into(k, k_alone.view());
      HostTensor q_out(DType::BF16, {kB, kS, kH, kD});
      HostTensor k_out(DType::BF16, {kB, kS, kH, kD});
      qk_norm_rope_forward(q_alone.cview(), k_alone.cview(), weights, t.cos.cview(), t.sin.cview(),
                           q_out.view(), k_out.view(), options);
      test::copy_into(q_out.cview(), q);
      test::copy_into(k_out.cview(), k);
      HostTensor y(DType::BF16, {kB, kS, kH, kD});
      qk_rmsnorm_forward(q_alone.cview(), w_q.cview(), y.view(), {});
      test::copy_into(y.cview(), views(norm_expected).second);
    }
    for (const test::RunConfig& config : configs) {
      config.apply();
      HostTensor fused = original;
      const auto [q, k] = views(fused);
      ASSERT_NO_THROW(
          qk_norm_rope_forward(q, k, weights, t.cos.cview(), t.sin.cview(), q, k, options))
          << config.name();
      EXPECT_TRUE(fused == fused_expected) << "fused, in place: " << config.name();
      HostTensor norm = original;
      const auto [x, y] = views(norm);
      ASSERT_NO_THROW(qk_rmsnorm_forward(x, w_q.cview(), y, {})) << config.name();
      EXPECT_TRUE(norm == norm_expected) << "norm, q into k: " << config.name();
    }
  }
}

}  // namespace
}  // namespace kernel_align
