// The CPU backend gives the reference backend's bytes for every op, input and
// output dtype, weight dtype (or none), norm mode, pairing, layout and head dim, on
// every forced ISA path at thread counts 1, 2, 3 and 7. Each output buffer is
// compared whole with memcmp (it starts as 0xA5 bytes on both sides, so a stray
// write shows too).
#include <gtest/gtest.h>

#include <optional>
#include <ostream>
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
using test::Rng;

struct MatrixParam {
  OpKind op;
  DType in;
  DType out;
  std::optional<DType> weight;
  Isa isa;
};

std::string param_name(const MatrixParam& p) {
  std::string name =
      std::string(test::op_name(p.op)) + "_" + dtype_name(p.in) + "_to_" + dtype_name(p.out) + "_";
  if (test::uses_norm(p.op))
    name += std::string("weight_") + (p.weight ? dtype_name(*p.weight) : "none") + "_";
  return name + isa_name(p.isa);
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
          for (Isa isa : test::kAllIsas) params.push_back({op, in, out, weight, isa});
        }
      }
    }
  }
  return params;
}

class CpuMatchesReference : public ::testing::TestWithParam<MatrixParam> {};

TEST_P(CpuMatchesReference, EveryModePairingLayoutHeadDimAndThreadCount) {
  const MatrixParam p = GetParam();
  if (p.isa > best_isa()) {
    GTEST_SKIP() << "ISA path " << isa_name(p.isa)
                 << " is above best_isa() = " << isa_name(best_isa())
                 << " on this CPU and build; it cannot be forced here";
  }
  const test::RuntimeGuard guard;
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
  // Weight gradients in fp32 and in the weight's dtype.
  std::vector<std::optional<DType>> dws{std::nullopt};
  if (test::is_backward(p.op) && p.weight) {
    dws = {DType::F32};
    if (*p.weight != DType::F32) dws.push_back(*p.weight);
  }
  Rng rng(20240601);
  int cases = 0;
  for (std::int64_t d : {2, 18, 128}) {
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
            c.seq = d == 128 ? 67 : 7;  // D = 128: enough rows for the pool to split (2-3 threads)
            c.heads = 3;
            c.k_heads = 2;
            c.d = d;
            c.text_len = 3;
            SCOPED_TRACE(c.name());
            test::with_case(p.op, c, rng, [&](const auto& one) {
              test::expect_configs_match_reference(one, test::cpu_configs(p.isa));
            });
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 0);
}

INSTANTIATE_TEST_SUITE_P(AllOps, CpuMatchesReference, ::testing::ValuesIn(all_params()),
                         [](const ::testing::TestParamInfo<MatrixParam>& param) {
                           return param_name(param.param);
                         });

}  // namespace
}  // namespace kernel_align
