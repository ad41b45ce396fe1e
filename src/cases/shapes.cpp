#include "cases/shapes.hpp"

#include <algorithm>
#include <stdexcept>

#include "core/json_text.hpp"

namespace kernel_align::cases {

PositionRequest Shape::positions() const {
  PositionRequest request;
  request.layout = PositionLayout::Diffusers;
  request.text_len = text_len;
  request.images = images;
  return request;
}

const std::vector<Shape>& issue_shapes() {
  static const std::vector<Shape> shapes = [] {
    const ImageGrid square = ImageGrid::from_pixels(1024, 1024);  // 64 x 64 tokens
    return std::vector<Shape>{
        {"t2i_1024x1024", 24, 256, {square}},
        {"t2i_1328x1328", 24, 256, {ImageGrid::from_pixels(1328, 1328)}},  // 83 x 83
        {"t2i_1664x928", 24, 256, {ImageGrid::from_pixels(1664, 928)}},    // 104 wide, 58 high
        {"edit_1024x1024+ref1024x1024", 24, 256, {square, square}}};
  }();
  return shapes;
}

// 8 heads, not fewer: the image rows then fill 3 threads, which the CPU backend only
// starts for 16384 elements each (verify's thread check compares 1, 2 and 3 threads).
const std::vector<Shape>& quick_shapes() {
  static const std::vector<Shape> shapes = [] {
    const ImageGrid square = ImageGrid::from_pixels(128, 128);  // 8 x 8 tokens
    return std::vector<Shape>{
        {"t2i_128x128", 8, 16, {square}},
        {"t2i_144x144", 8, 16, {ImageGrid::from_pixels(144, 144)}},  // 9 x 9
        {"t2i_192x112", 8, 16, {ImageGrid::from_pixels(192, 112)}},  // 12 wide, 7 high
        {"edit_128x128+ref128x128", 8, 16, {square, square}}};
  }();
  return shapes;
}

const Shape& issue_shape(std::string_view name) {
  const std::vector<Shape>& shapes = issue_shapes();
  const auto it =
      std::find_if(shapes.begin(), shapes.end(), [&](const Shape& s) { return s.name == name; });
  if (it == shapes.end()) throw std::out_of_range("no issue shape " + std::string(name));
  return *it;
}

ConstTensorView ShapeTables::cos() const {
  return ConstTensorView::contiguous(tables.cos.data(), DType::F32, {seq, tables.columns});
}

ConstTensorView ShapeTables::sin() const {
  return ConstTensorView::contiguous(tables.sin.data(), DType::F32, {seq, tables.columns});
}

ShapeTables shape_tables(const Shape& shape) {
  const std::vector<Position> positions = build_positions(shape.positions());
  const auto seq = static_cast<std::int64_t>(positions.size());
  return {seq, build_rope_tables(positions.front().data(), seq)};
}

std::string shape_json(const Shape& shape) {
  std::string j = "{\"name\": ";
  append_json_string(j, shape.name);
  j += ", \"batch\": 1, \"heads\": " + std::to_string(shape.heads) +
       ", \"head_dim\": " + std::to_string(kHeadDim) +
       ", \"text_len\": " + std::to_string(shape.text_len) + ", \"images\": [";
  for (std::size_t i = 0; i < shape.images.size(); ++i) {
    j += (i == 0 ? "{\"height\": " : ", {\"height\": ") + std::to_string(shape.images[i].height) +
         ", \"width\": " + std::to_string(shape.images[i].width) + "}";
  }
  return j + "]}";
}

}  // namespace kernel_align::cases
