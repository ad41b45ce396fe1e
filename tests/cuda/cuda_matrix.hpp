// The matrix of the CUDA backend's tests, for any backend that runs its kernels: every
// op, direction, input and output dtype, weight dtype (or none), norm mode, pairing,
// layout and head dim; strided, padded, permuted, unaligned and in-place views; row
// counts on both sides of every launch-configuration threshold (the fast path's block
// size at 16384 rows, the dw blocks of 256 rows, one row). Each output buffer must equal
// the reference backend's byte for byte, compared whole (it starts as 0xA5 bytes, so a
// stray write shows). Included by kernels_emulated_test.cpp (the grid emulator, every
// build) and device_test.cpp (a GPU, CUDA builds).
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "kernel_align/ops.hpp"
#include "support/buffers.hpp"
#include "support/op_cases.hpp"
#include "support/runtime_guard.hpp"

namespace kernel_align {
namespace {

using test::CaseSpec;
using test::OpKind;
using test::Rng;

// The including file defines, before including this header:
//   const char* const kBackendUnderTest;  // a registry name
//   std::string unavailable();            // "" or why its tests must skip
template <class Case>
void expect_matches_reference(const Case& c) {
  test::expect_configs_match_reference(c, {test::RunConfig{kBackendUnderTest, Isa::Portable, 1}});
}

#define KA_SKIP_WITHOUT_BACKEND() \
  if (const std::string why = unavailable(); !why.empty()) GTEST_SKIP() << why

struct MatrixParam {
  OpKind op;
  DType in;
  DType out;
  std::optional<DType> weight;
};

std::string param_name(const MatrixParam& p) {
  std::string name =
      std::string(test::op_name(p.op)) + "_" + dtype_name(p.in) + "_to_" + dtype_name(p.out);
  if (test::uses_norm(p.op))
    name += std::string("_weight_") + (p.weight ? dtype_name(*p.weight) : "none");
  return name;
}
void PrintTo(const MatrixParam& p, std::ostream* os) {
  *os << param_name(p);
}

std::vector<MatrixParam> all_params() {
  const DType dtypes[] = {DType::F32, DType::BF16, DType::F16};
#if defined(KA_TEST_ASAN)
  // Under AddressSanitizer the emulated matrix checks every access of the kernels, not
  // their bytes (the release build compares those for every weight dtype): no weight and
  // one weight dtype reach every index computation, at half the time of all four (the
  // matrix was more than half of the sanitized suite's time).
  const std::optional<DType> weights[] = {std::nullopt, DType::BF16};
#else
  const std::optional<DType> weights[] = {std::nullopt, DType::F32, DType::BF16, DType::F16};
#endif
  std::vector<MatrixParam> params;
  for (OpKind op : test::kAllOps) {
    for (DType in : dtypes) {
      for (DType out : dtypes) {
        for (const std::optional<DType>& weight : weights) {
          if (!test::uses_norm(op) && weight) continue;
          params.push_back({op, in, out, weight});
        }
      }
    }
  }
  return params;
}

class CudaMatchesReference : public ::testing::TestWithParam<MatrixParam> {};

TEST_P(CudaMatchesReference, EveryModePairingLayoutAndHeadDim) {
  KA_SKIP_WITHOUT_BACKEND();
  const MatrixParam p = GetParam();
  Rng rng(20261201);
  // D = 128: a dw block of 256 rows and a short one.
  test::for_each_matrix_case(
      p.op, p.in, p.out, p.weight, {2, 18, 40, 128},
      [](std::int64_t d) { return d == 128 ? 45 : 7; }, rng,
      [&](const auto& one) { expect_matches_reference(one); });
}

INSTANTIATE_TEST_SUITE_P(AllOps, CudaMatchesReference, ::testing::ValuesIn(all_params()),
                         [](const ::testing::TestParamInfo<MatrixParam>& param) {
                           return param_name(param.param);
                         });

// Views the fast path cannot take (padded, every other element, permuted, unaligned),
// in place, and the ranks of the unfused norm: the generic path, the same bytes.
TEST(CudaViews, StridedPermutedUnalignedAndInPlace) {
  KA_SKIP_WITHOUT_BACKEND();
  using test::Placement;
  using test::Strides;
  const Placement placements[] = {{Strides::Contiguous, false}, {Strides::PaddedRows, false},
                                  {Strides::EveryOther, false}, {Strides::Permuted, false},
                                  {Strides::Contiguous, true},  {Strides::PaddedRows, true}};
  Rng rng(77);
  for (OpKind op : test::kAllOps) {
    for (const DType dtype : {DType::BF16, DType::F32}) {
      for (const Placement& inputs : placements) {
        for (const Placement& outputs : placements) {
          for (const bool in_place : {false, true}) {
            CaseSpec c;
            c.in = dtype;
            c.out = dtype;
            c.weight = DType::BF16;
            c.dw = test::is_backward(op) ? std::optional<DType>(DType::F32) : std::nullopt;
            c.mode = NormMode::Diffusers;
            c.pairing = op == OpKind::RopeBackward ? Pairing::Half : Pairing::Interleaved;
            c.layout = op == OpKind::FusedBackward ? Layout::BHSD : Layout::BSHD;
            c.seq = 5;
            c.d = 128;
            c.inputs = inputs;
            c.outputs = outputs;
            c.in_place = in_place;
            SCOPED_TRACE(std::string(test::op_name(op)) + " " + c.name());
            test::with_case(op, c, rng, [&](const auto& one) { expect_matches_reference(one); });
          }
        }
      }
    }
  }
  for (int rank : {1, 2, 3}) {
    CaseSpec c;
    c.in = DType::F16;
    c.out = DType::F16;
    c.weight = DType::F16;
    c.dw = DType::F16;
    c.batch = rank == 1 ? 1 : 2;
    c.seq = rank == 1 ? 1 : 5;
    c.heads = rank == 1 ? 1 : 3;
    c.d = 128;
    c.norm_rank = rank;
    SCOPED_TRACE(c.name());
    expect_matches_reference(test::make_norm_forward(c, rng));
    expect_matches_reference(test::make_norm_backward(c, rng));
  }
}

// Row counts around every threshold of the launch configuration: the fast path's block
// of 128 or 256 threads (kLargeCallRows = 16384 rows), dw blocks of 256 rows (and the
// fused op's streams, whose row counts are text_len and S - text_len times the heads),
// and a single row.
TEST(CudaThresholds, RowCountsOnBothSidesOfEveryThreshold) {
  KA_SKIP_WITHOUT_BACKEND();
  Rng rng(5);
  for (const std::int64_t rows : {1, 255, 256, 257, 511, 512, 513, 16383, 16384}) {
    for (const std::int64_t d : {std::int64_t{128}, std::int64_t{18}}) {
      if (d == 18 && rows > 1024) continue;  // the generic path has no such threshold
      CaseSpec c;
      c.in = DType::BF16;
      c.out = DType::BF16;
      c.weight = DType::BF16;
      c.dw = DType::F32;
      c.mode = NormMode::Diffusers;
      c.batch = 1;
      c.seq = rows;
      c.heads = 1;
      c.d = d;
      c.norm_rank = 2;
      SCOPED_TRACE(c.name());
      expect_matches_reference(test::make_norm_forward(c, rng));
      if (rows <= 1024) expect_matches_reference(test::make_norm_backward(c, rng));
    }
  }
  // The fused op with streams of 0, 1, 255, 256, 257 and more rows (2 heads).
  for (const std::int64_t text_len : {0, 1, 128, 129, 200}) {
    CaseSpec c;
    c.in = DType::F32;
    c.out = DType::F32;
    c.weight = DType::F32;
    c.dw = DType::F32;
    c.mode = NormMode::Diffusers;
    c.batch = 1;
    c.seq = 257;
    c.heads = 2;
    c.k_heads = 1;
    c.d = 128;
    c.text_len = text_len;
    SCOPED_TRACE(c.name());
    expect_matches_reference(test::make_fused_forward(c, rng));
    expect_matches_reference(test::make_fused_backward(c, rng));
  }
}

}  // namespace
}  // namespace kernel_align
