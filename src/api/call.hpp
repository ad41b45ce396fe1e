// One call of an op as its validator returns it (api/ops/<op>.cpp): the record that the
// registry chooses a backend from and the trace writes (the op, its options, every
// tensor argument named once), and the problem the backend runs. A public function
// (ops.cpp) builds one per call and hands it on; nothing on the way allocates.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#include "api/descriptors.hpp"
#include "api/problems.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/registry.hpp"  // OpType, Direction

namespace kernel_align::detail {

// One tensor argument of a call.
struct TensorArg {
  const char* name = "";      // as the trace records it
  const char* argument = "";  // as errors name it: the API's argument, which differs for the
                              // fused op's weights ("weights.text_q", traced "weight_text_q")
  ConstTensorView view;
  bool output = false;
  // The inputs (by name) this output may be exactly, computing in place (contract
  // section 7); none for inputs.
  std::array<const char*, 2> in_place_of{};
};

using TensorArgs = FixedList<TensorArg, kMaxTensorArgs>;

// One option value of a call, named as its descriptor names it.
struct OptionValue {
  const char* name = "";
  OptionKind kind = OptionKind::Choice;
  const char* choice = "";   // Choice: the value's name ("bshd")
  float number = 0.0f;       // Float
  std::int64_t integer = 0;  // Integer
};
using OptionValues = FixedList<OptionValue, kMaxOptions>;

// A size of the contract's that a call used and the trace records ("dw_block_rows").
struct BlockSize {
  const char* name = "";
  std::int64_t value = 0;
};

// What the registry chooses a backend from and the trace writes: generic over the ops,
// so that a new op adds no field here.
struct CallRecord {
  OpType op = OpType::QkRmsNorm;
  Direction direction = Direction::Forward;
  TensorArgs tensors;    // in signature order
  OptionValues options;  // in the order of descriptor(op).options()
  Device device;         // the one device every tensor lives on
  DType output_dtype = DType::F32;
  FixedList<BlockSize, 2> block_sizes;  // those this call used

  // The option called `name`; null when the op has none.
  const OptionValue* option(std::string_view name) const {
    for (const OptionValue& o : options) {
      if (name == o.name) return &o;
    }
    return nullptr;
  }
};

template <class Problem>
struct Call {
  CallRecord record;
  Problem problem;
};

}  // namespace kernel_align::detail
