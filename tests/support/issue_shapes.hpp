// The issue's shapes (src/cases/shapes.hpp) as gtest parameters.
#pragma once

#include <ostream>
#include <vector>

#include "cases/shapes.hpp"

namespace kernel_align::cases {

// gtest names a parameter by its shape's name.
inline void PrintTo(const Shape& s, std::ostream* os) {
  *os << s.name;
}

}  // namespace kernel_align::cases

namespace kernel_align::test {

// The issue's text-to-image shapes: those of one image.
inline std::vector<cases::Shape> text_to_image_shapes() {
  std::vector<cases::Shape> shapes;
  for (const cases::Shape& s : cases::issue_shapes()) {
    if (s.images.size() == 1) shapes.push_back(s);
  }
  return shapes;
}

}  // namespace kernel_align::test
