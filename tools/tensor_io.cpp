#include "tensor_io.hpp"

#include <stdexcept>

namespace kernel_align::cli {
namespace {

// Callers only build views of arrays float_dtype or read_optional_mask_input accepted.
DType dtype_of_array(const NpyArray& array) {
  switch (array.type) {
    case NpyType::F32:
      return DType::F32;
    case NpyType::F16:
      return DType::F16;
    case NpyType::BF16:
      return DType::BF16;
    case NpyType::Bool:
      return DType::Bool;
    case NpyType::I32:
      break;
  }
  throw std::logic_error("a tensor view of an int32 array");
}

template <class Pointer>
BasicTensorView<Pointer> row_major_view(Pointer data, const NpyArray& array) {
  BasicTensorView<Pointer> v;
  v.data = data;
  v.dtype = dtype_of_array(array);
  v.rank = static_cast<int>(array.shape.size());
  std::int64_t step = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    v.shape[d] = array.shape[d];
    v.strides[d] = step;
    step *= array.shape[d];
  }
  return v;
}

}  // namespace

NpyType npy_type_of(DType t) {
  switch (t) {
    case DType::F32:
      return NpyType::F32;
    case DType::F16:
      return NpyType::F16;
    case DType::BF16:
      return NpyType::BF16;
    case DType::Bool:
      return NpyType::Bool;
  }
  throw std::logic_error("unknown DType");
}

DType float_dtype(const NpyArray& array, const std::string& flag) {
  if (array.type == NpyType::I32 || array.type == NpyType::Bool) {
    throw Error(flag, "fp32 ('<f4'), fp16 ('<f2') or bf16 ('<u2') data",
                array.type == NpyType::I32 ? "int32 ('<i4')" : "bool ('|b1')");
  }
  return dtype_of_array(array);
}

NpyArray read_float_input(const Args& args, const std::string& flag) {
  NpyArray array = read_npy(args.required(flag), flag);
  float_dtype(array, flag);
  return array;
}

std::optional<NpyArray> read_optional_float_input(const Args& args, const std::string& flag) {
  if (!args.has(flag)) return std::nullopt;
  return read_float_input(args, flag);
}

std::optional<NpyArray> read_optional_mask_input(const Args& args, const std::string& flag) {
  if (!args.has(flag)) return std::nullopt;
  NpyArray array = read_npy(args.required(flag), flag);
  if (array.type != NpyType::Bool) {
    throw Error(flag, "bool ('|b1') data", std::string("descr '") + npy_descr(array.type) + "'");
  }
  return array;
}

NpyArray float_array_like(const NpyArray& like, DType t) {
  return make_npy_array(npy_type_of(t), like.shape);
}

ConstTensorView const_view(const NpyArray& array) {
  return row_major_view<const void*>(array.data.data(), array);
}

TensorView mutable_view(NpyArray& array) {
  return row_major_view<void*>(array.data.data(), array);
}

DType parse_dtype(const std::string& flag, const std::string& text) {
  return parse_choice<DType>(flag, text,
                             {{"fp32", DType::F32}, {"bf16", DType::BF16}, {"fp16", DType::F16}});
}

ImageGrid parse_image(const std::string& text) {
  const std::size_t x = text.find('x');
  if (x == std::string::npos) {
    throw Error("--image", "WxH in pixels (e.g. 1328x1328)", single_quoted(text));
  }
  const auto width = parse_int<std::int64_t>("--image", text.substr(0, x));
  const auto height = parse_int<std::int64_t>("--image", text.substr(x + 1));
  return call_library({{"width_px", "--image"}, {"height_px", "--image"}},
                      [&] { return ImageGrid::from_pixels(width, height); });
}

}  // namespace kernel_align::cli
