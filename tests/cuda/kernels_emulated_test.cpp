// The CUDA backend's device code, proved without a GPU: its plans (cuda/plan.hpp) and
// kernel bodies (cuda/device/), the very source nvcc compiles, run by the grid emulator
// ("cuda-emulated") give the reference backend's bytes, every output buffer compared
// whole (each starts as 0xA5 bytes, so a stray write shows). The matrix covers every op,
// direction, input and output dtype, weight dtype (or none), norm mode, pairing, layout
// and head dim; strided, padded, permuted and unaligned views; row counts on both sides
// of every launch-configuration threshold (the fast path's block size at 16384 rows, the
// dw blocks of 256 rows, one row per block); and both paths (fast: D = 128, one dtype,
// vector-aligned rows; generic: everything else), checked in the trace's launch records.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cuda/emulator/emulated_backend.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/registry.hpp"
#include "support/op_cases.hpp"
#include "support/runtime_guard.hpp"

namespace kernel_align {
namespace {

using test::CaseSpec;
using test::OpKind;
using test::Rng;

const std::vector<test::RunConfig> kEmulated{{"cuda-emulated", Isa::Portable, 1}};

// Registers the emulated backend for the whole test binary.
class EmulatedBackend : public ::testing::Environment {
 public:
  void SetUp() override { registration_.emplace(cuda::emulation::emulated_cuda_backend()); }
  void TearDown() override { registration_.reset(); }

 private:
  std::optional<registry::ScopedRegistration> registration_;
};
const auto* const kEnvironment =
    ::testing::AddGlobalTestEnvironment(new EmulatedBackend);  // NOLINT: gtest owns it

template <class Case>
void expect_emulated_matches_reference(const Case& c) {
  test::expect_configs_match_reference(c, kEmulated);
}

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
  const std::optional<DType> weights[] = {std::nullopt, DType::F32, DType::BF16, DType::F16};
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

class EmulatedCudaMatchesReference : public ::testing::TestWithParam<MatrixParam> {};

TEST_P(EmulatedCudaMatchesReference, EveryModePairingLayoutAndHeadDim) {
  const MatrixParam p = GetParam();
  const bool norm = test::uses_norm(p.op);
  const bool rope = test::uses_rope(p.op);
  const std::vector<NormMode> modes =
      norm ? std::vector<NormMode>{NormMode::Single, NormMode::Diffusers}
           : std::vector<NormMode>{NormMode::Single};
  const std::vector<Pairing> pairings =
      rope ? std::vector<Pairing>{Pairing::Half, Pairing::Interleaved}
           : std::vector<Pairing>{Pairing::Interleaved};
  const std::vector<Layout> layouts =
      rope ? std::vector<Layout>{Layout::BSHD, Layout::BHSD} : std::vector<Layout>{Layout::BSHD};
  std::vector<std::optional<DType>> dws{std::nullopt};
  if (test::is_backward(p.op) && p.weight) {
    dws = {DType::F32};
    if (*p.weight != DType::F32) dws.push_back(*p.weight);
  }
  Rng rng(20261201);
  for (std::int64_t d : {2, 18, 40, 128}) {
    for (NormMode mode : modes) {
      for (Pairing pairing : pairings) {
        for (Layout layout : layouts) {
          for (const std::optional<DType>& dw : dws) {
            CaseSpec c;
            c.in = p.in;
            c.out = p.out;
            c.weight = p.weight;
            c.dw = dw;
            c.mode = mode;
            c.pairing = pairing;
            c.layout = layout;
            c.batch = 2;
            c.seq = d == 128 ? 45 : 7;  // D = 128: a dw block of 256 rows and a short one
            c.heads = 3;
            c.k_heads = 2;
            c.d = d;
            c.text_len = 3;
            SCOPED_TRACE(c.name());
            test::with_case(p.op, c, rng,
                            [&](const auto& one) { expect_emulated_matches_reference(one); });
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, EmulatedCudaMatchesReference, ::testing::ValuesIn(all_params()),
                         [](const ::testing::TestParamInfo<MatrixParam>& param) {
                           return param_name(param.param);
                         });

// Views the fast path cannot take (padded, every other element, permuted, unaligned),
// in place, and the ranks of the unfused norm: the generic path, the same bytes.
TEST(EmulatedCudaViews, StridedPermutedUnalignedAndInPlace) {
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
            test::with_case(op, c, rng,
                            [&](const auto& one) { expect_emulated_matches_reference(one); });
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
    expect_emulated_matches_reference(test::make_norm_forward(c, rng));
    expect_emulated_matches_reference(test::make_norm_backward(c, rng));
  }
}

// Row counts around every threshold of the launch configuration: the fast path's block
// of 128 or 256 threads (kLargeCallRows = 16384 rows), dw blocks of 256 rows (and the
// fused op's streams, whose row counts are text_len and S - text_len times the heads),
// and a single row.
TEST(EmulatedCudaThresholds, RowCountsOnBothSidesOfEveryThreshold) {
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
      expect_emulated_matches_reference(test::make_norm_forward(c, rng));
      if (rows <= 1024) expect_emulated_matches_reference(test::make_norm_backward(c, rng));
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
    expect_emulated_matches_reference(test::make_fused_forward(c, rng));
    expect_emulated_matches_reference(test::make_fused_backward(c, rng));
  }
}

// The trace of a call on the emulated backend names its launches; D = 128 in one dtype
// with aligned rows takes the fast path, an unaligned view the generic one; the digests
// computed by the device digest kernel are the host's.
TEST(EmulatedCudaTrace, LaunchRecordsPathsAndDeviceDigests) {
  const test::RuntimeGuard guard;
  const std::string path = testing::TempDir() + "cuda_emulated_trace.jsonl";
  std::remove(path.c_str());
  Rng rng(3);
  CaseSpec c;
  c.in = DType::BF16;
  c.out = DType::BF16;
  c.weight = DType::BF16;
  c.seq = 9;  // 2 x 9 x 3 = 54 rows: two blocks of 32 (128 threads, below 16384 rows)
  c.d = 128;
  const test::NormForwardCase aligned = test::make_norm_forward(c, rng);
  c.inputs.unaligned = true;
  const test::NormForwardCase unaligned = test::make_norm_forward(c, rng);
  set_backend("cuda-emulated");
  set_trace_path(path);
  aligned.run();
  unaligned.run();
  set_backend("reference");
  aligned.run();
  set_trace_path("");
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(
      lines[0].find(
          R"("launches":[{"kernel":"rmsnorm_forward","grid":[2,1,1],"block":[128,1,1],"rows_per_block":32,"path":"fast"}])"),
      std::string::npos)
      << lines[0];
  EXPECT_NE(lines[1].find(R"("path":"generic")"), std::string::npos) << lines[1];
  EXPECT_NE(lines[2].find(R"("launches":[])"), std::string::npos) << lines[2];
  const auto digests = [](const std::string& line) {
    return line.substr(line.find("\"digests\""));
  };
  EXPECT_EQ(digests(lines[0]), digests(lines[2])) << "device digests differ from the host's";
}

}  // namespace
}  // namespace kernel_align
