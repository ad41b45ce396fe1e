// Each op's cells in `kernel-align verify` (verify.cpp): the inputs of a case and the
// call that computes it, one file per op (verify_cases/<op>.cpp). verify.cpp's table of
// them is built from op_list.hpp by the functions declared here (a missing one is a link
// error), and the configurations come from the op's descriptor, so an op adds only its
// own file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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

// The shapes of a case's inputs: its activations and gradients (dim 0 the batch of
// kBatch), in the order the op's call reads them, and its weights (no batch dim).
struct InputShapes {
  std::vector<std::vector<std::int64_t>> batched;
  std::vector<std::vector<std::int64_t>> weights;
};

// One configuration at one shape with its inputs. One Case serves every configuration
// of a shape in turn, each filling the arrays the previous one left.
struct Case {
  const cases::Config* config = nullptr;
  const cases::Shape* shape = nullptr;
  const cases::ShapeTables* tables = nullptr;
  std::vector<NpyArray> batched;  // in InputShapes' order
  std::vector<NpyArray> weights;
  std::optional<std::uint64_t> seed;  // of the numbers in the arrays
};

struct Output {
  std::string name;  // as the API names it
  NpyArray array;
  bool per_sample = true;  // false for a dw, which sums over the batch
};
using Outputs = std::vector<Output>;

// One call of a case, on the sample alone or on the whole batch: the op's inputs as
// views, and its outputs, added (zero-filled, in the storage they had) in the order the
// op writes them.
class CaseCall {
 public:
  CaseCall(const Case& c, bool whole_batch, Outputs& outputs)
      : case_(c), whole_batch_(whole_batch), outputs_(outputs) {}

  const cases::Config& config() const { return *case_.config; }
  const Case& of() const { return case_; }
  bool forward() const;
  // Input i: the sample's element, or the whole batch.
  ConstTensorView input(std::size_t i) const;
  ConstTensorView weight(std::size_t i) const;
  // The batch dim of an output: kBatch or 1.
  std::int64_t samples() const { return whole_batch_ ? kBatch : 1; }
  void add(const char* name, NpyType type, std::vector<std::int64_t> shape, bool per_sample);
  // An output of input 0's dtype and shape (the batch dim samples()).
  void add_like_input(const char* name);
  // A weight gradient of weight i's dtype and shape: a sum over the batch.
  void add_weight_grad(const char* name, std::size_t i);
  TensorView out(std::size_t i) const;
  std::size_t count() const { return count_; }

 private:
  const Case& case_;
  bool whole_batch_;
  Outputs& outputs_;
  std::size_t count_ = 0;
};

// An op's cases: the input shapes of `config` with `tables.seq` positions and `heads`
// heads, and the call.
struct OpCases {
  InputShapes (*inputs)(const cases::Config& config, const cases::ShapeTables& tables,
                        std::int64_t heads) = nullptr;
  void (*call)(CaseCall& call) = nullptr;
};

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
