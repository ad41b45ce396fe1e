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
  Rng rng(20240601);
  // D = 128: enough rows for the pool to split (2-3 threads).
  const int cases = test::for_each_matrix_case(
      p.op, p.in, p.out, p.weight, {2, 18, 128}, [](std::int64_t d) { return d == 128 ? 67 : 7; },
      rng,
      [&](const auto& one) {
        test::expect_configs_match_reference(one, test::cpu_configs(p.isa));
      });
  EXPECT_GT(cases, 0);
}

INSTANTIATE_TEST_SUITE_P(AllOps, CpuMatchesReference, ::testing::ValuesIn(all_params()),
                         [](const ::testing::TestParamInfo<MatrixParam>& param) {
                           return param_name(param.param);
                         });

}  // namespace
}  // namespace kernel_align
