#include "verify_cases.hpp"

#include <utility>

#include "cases/parallel.hpp"
#include "kernel_align/registry.hpp"
#include "tensor_io.hpp"

namespace kernel_align::cli::verify_cases {

NpyArray& reused_array(NpyArray& array, NpyType type, std::vector<std::int64_t> shape) {
  array.type = type;
  array.shape = std::move(shape);
  array.data.resize(static_cast<std::size_t>(array.numel()) * npy_type_size(type));
  return array;
}

std::vector<std::int64_t> head_rows(const cases::Config& config, std::int64_t seq,
                                    std::int64_t heads) {
  if (config.layout == Layout::BHSD) return {kBatch, heads, seq, cases::kHeadDim};
  return {kBatch, seq, heads, cases::kHeadDim};
}

bool CaseCall::forward() const {
  return case_.config->direction == Direction::Forward;
}

ConstTensorView CaseCall::input(std::size_t i) const {
  const ConstTensorView all = const_view(case_.batched[i]);
  return whole_batch_ ? all : narrow(all, 0, kSampleSlot, kSampleSlot + 1);
}

ConstTensorView CaseCall::weight(std::size_t i) const {
  return const_view(case_.weights[i]);
}

void CaseCall::add(const char* name, NpyType type, std::vector<std::int64_t> shape,
                   bool per_sample) {
  if (outputs_.size() == count_) outputs_.emplace_back();
  Output& o = outputs_[count_++];
  o.name = name;
  o.per_sample = per_sample;
  NpyArray& a = reused_array(o.array, type, std::move(shape));
  cases::zero_fill(a.data);
}

void CaseCall::add_like_input(const char* name) {
  std::vector<std::int64_t> shape = case_.batched[0].shape;
  shape[0] = samples();
  add(name, case_.batched[0].type, std::move(shape), true);
}

void CaseCall::add_weight_grad(const char* name, std::size_t i) {
  add(name, case_.weights[i].type, case_.weights[i].shape, false);
}

TensorView CaseCall::out(std::size_t i) const {
  return mutable_view(outputs_[i].array);
}

}  // namespace kernel_align::cli::verify_cases
