// The Qwen-Image shapes at which verify, the benchmark (bench/), `kernel-align run`, the
// tests and the Python benchmark scripts (through `kernel-align shapes`) run the ops:
// listed here and nowhere else.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernel_align/positions.hpp"
#include "kernel_align/tables.hpp"
#include "kernel_align/tensor.hpp"

namespace kernel_align::cases {

inline constexpr int kHeadDim = 128;  // Qwen-Image; the sum of the axes 16 + 56 + 56

// One sample (batch 1) of the attention front end: `heads` heads of kHeadDim, text_len
// text tokens, then the images' tokens.
struct Shape {
  std::string name;
  std::int64_t heads = 0;
  std::int64_t text_len = 0;
  std::vector<ImageGrid> images;

  // Its diffusers-layout positions: [text, image 0, image 1, ...].
  PositionRequest positions() const;
  std::int64_t seq() const { return sequence_length(positions()); }
};

// The issue's shapes: the three text-to-image resolutions and the Edit pipeline's target
// plus one reference image.
const std::vector<Shape>& issue_shapes();

// The same kinds of grid (even square, odd square, wide, two images) small enough for CI.
const std::vector<Shape>& quick_shapes();

// The issue shape named `name` (std::out_of_range when there is none).
const Shape& issue_shape(std::string_view name);

// The positions and correctly rounded cos/sin tables of a shape.
struct ShapeTables {
  std::int64_t seq = 0;
  RopeTables tables;

  ConstTensorView cos() const;
  ConstTensorView sin() const;
};
ShapeTables shape_tables(const Shape& shape);

// {"name": ..., "batch": 1, "heads": ..., "head_dim": ..., "text_len": ..., "images":
// [{"height": ..., "width": ...}, ...]}: grids in tokens, on one line.
std::string shape_json(const Shape& shape);

}  // namespace kernel_align::cases
