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

namespace {

// The four kinds of grid verify and the benchmark run, at the pixel sizes given: an even
// square, an odd square (its token count), a wide image, and the Edit pipeline's target
// plus one reference image of the even square's size. Names say the pixels:
// "t2i_<width>x<height>", "edit_<w>x<h>+ref<w>x<h>".
std::vector<Shape> grid_kinds(std::int64_t heads, std::int64_t text_len, int square_px,
                              int odd_square_px, int wide_px, int wide_height_px) {
  const auto pixels = [](int width, int height) {
    return std::to_string(width) + "x" + std::to_string(height);
  };
  const auto t2i = [&](int width, int height) {
    return Shape{
        "t2i_" + pixels(width, height), heads, text_len, {ImageGrid::from_pixels(width, height)}};
  };
  const ImageGrid square = ImageGrid::from_pixels(square_px, square_px);
  const std::string edit_name =
      "edit_" + pixels(square_px, square_px) + "+ref" + pixels(square_px, square_px);
  return {t2i(square_px, square_px), t2i(odd_square_px, odd_square_px),
          t2i(wide_px, wide_height_px), Shape{edit_name, heads, text_len, {square, square}}};
}

}  // namespace

// 1024 px: 64 x 64 tokens; 1328: 83 x 83; 1664 x 928: 104 wide, 58 high.
const std::vector<Shape>& issue_shapes() {
  static const std::vector<Shape> shapes = grid_kinds(24, 256, 1024, 1328, 1664, 928);
  return shapes;
}

// 128 px: 8 x 8 tokens; 144: 9 x 9; 192 x 112: 12 wide, 7 high. 8 heads, not fewer: the
// image rows then fill 3 threads, which the CPU backend only starts for 16384 elements
// each (verify's thread check compares 1, 2 and 3 threads).
const std::vector<Shape>& quick_shapes() {
  static const std::vector<Shape> shapes = grid_kinds(8, 16, 128, 144, 192, 112);
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
