// Each op's cells in `kernel-align verify` (verify.cpp): the inputs of a case, one
// function per op in its file of ops/, and the call, the op's OpCall with the outputs its
// signature declares. verify.cpp's table of them is built from op_list.hpp by the
// functions declared here (a missing one is a link error), and the configurations come
// from the op's descriptor, so an op adds only its own file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "api/call.hpp"  // OptionValue
#include "cases/configs.hpp"
#include "cases/shapes.hpp"
#include "kernel_align/op_list.hpp"
#include "kernel_align/tensor.hpp"
#include "npy.hpp"

namespace kernel_align::cli::verify_cases {

// Every activation or gradient of a case is a batch of kBatch whose element kSampleSlot
// is the sample the checks follow (element 0 holds other random data).
inline constexpr std::int64_t kBatch = 2;
inline constexpr std::int64_t kSampleSlot = 1;

// One input of a case, named as the op's signature (api/descriptors.hpp) names it. An op
// whose signature has cos and sin gets the shape's tables; an optional input not listed
// is absent (attention's mask).
struct InputShape {
  const char* name = "";
  std::vector<std::int64_t> shape;
  bool batched = true;  // an activation or gradient, dim 0 the batch of kBatch; else a weight
  bool fp32 = false;    // fp32 whatever the configuration's dtype (flow_sde_logp's dlogp)
};
using InputShapes = std::vector<InputShape>;

// One configuration at one shape with its inputs. One Case serves every configuration
// of a shape in turn, each filling the arrays the previous one left.
struct Case {
  const cases::Config* config = nullptr;
  const cases::Shape* shape = nullptr;
  const cases::ShapeTables* tables = nullptr;
  InputShapes inputs;
  std::vector<detail::OptionValue> options;  // OpCases::options
  std::vector<NpyArray> arrays;              // in `inputs`' order
  std::optional<std::uint64_t> seed;         // of the numbers in the arrays
};

struct Output {
  std::string name;  // as the signature names it
  NpyArray array;
  bool per_sample = true;  // false for a dw, which sums over the batch
};
using Outputs = std::vector<Output>;

// An op's cases: the inputs of `config` with `tables.seq` positions and `heads` heads. The
// call is the op's OpCall (op_calls.hpp), every output of the signature whose input of
// like shape the case has.
struct OpCases {
  InputShapes (*inputs)(const cases::Config& config, const cases::ShapeTables& tables,
                        std::int64_t heads) = nullptr;
  // Values of options no configuration enumerates (the SDE step's sigmas), set in every
  // case.
  std::vector<detail::OptionValue> options;
};

// Calls the op of `c` on the sample alone (element kSampleSlot of every batched input),
// or on the whole batch, into `outputs`: each zero-filled first, as a new array is, in
// the storage it had (reused_array).
void compute(const Case& c, bool whole_batch, Outputs& outputs);

// `array` as an array of `type` and `shape`, in the storage it had: a new allocation
// only when it grows. The full matrix spent a third of its time in the page faults of
// fresh arrays when every case and call allocated its own.
NpyArray& reused_array(NpyArray& array, NpyType type, std::vector<std::int64_t> shape);

// [kBatch, S, H, kHeadDim] in bshd, [kBatch, H, S, kHeadDim] in bhsd (the config's layout).
std::vector<std::int64_t> head_rows(const cases::Config& config, std::int64_t seq,
                                    std::int64_t heads);

#define KERNEL_ALIGN_DECLARE_CASES(Enumerator, name) OpCases name##_cases();
KERNEL_ALIGN_OPS(KERNEL_ALIGN_DECLARE_CASES)
#undef KERNEL_ALIGN_DECLARE_CASES

}  // namespace kernel_align::cli::verify_cases
