// Between .npy arrays and the library's tensor views, and between the library's
// argument names and the flags a user typed.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "cli_args.hpp"
#include "kernel_align/dtype.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/positions.hpp"
#include "kernel_align/tensor.hpp"
#include "npy.hpp"

namespace kernel_align::cli {

NpyType npy_type_of(DType t);

// The floating-point dtype of an array read from `flag`; int32 arrays are refused.
DType float_dtype(const NpyArray& array, const std::string& flag);

// Reads the .npy file named by `flag` (required) and checks it holds floats.
NpyArray read_float_input(const Args& args, const std::string& flag);
std::optional<NpyArray> read_optional_float_input(const Args& args, const std::string& flag);
// Reads the .npy file named by `flag`, if given, and checks it holds bools (a mask).
std::optional<NpyArray> read_optional_mask_input(const Args& args, const std::string& flag);

// A zero-filled array of `t` with the shape of `like`.
NpyArray float_array_like(const NpyArray& like, DType t);

// Row-major views of a float or bool array (see float_dtype, read_optional_mask_input).
ConstTensorView const_view(const NpyArray& array);
TensorView mutable_view(NpyArray& array);

// "--out-dtype fp32|bf16|fp16"
DType parse_dtype(const std::string& flag, const std::string& text);

// The value of an --image flag, "1328x1328": width x height in pixels, 16 per token.
ImageGrid parse_image(const std::string& text);

// Library argument name -> flag, e.g. {"y", "--out"}.
using FlagNames = std::map<std::string, std::string, std::less<>>;

// Runs a library call; its errors name the flag the user typed rather than the
// library's parameter (names absent from `names` stay as they are).
template <class Call>
auto call_library(const FlagNames& names, const Call& call) -> decltype(call()) {
  try {
    return call();
  } catch (const Error& e) {
    const auto it = names.find(e.argument());
    if (it == names.end()) throw;
    throw Error(it->second, e.expected(), e.found());
  }
}

}  // namespace kernel_align::cli
