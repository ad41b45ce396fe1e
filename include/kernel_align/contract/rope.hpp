// The rotation of multi_axis_rope (docs/contract.md, "multi_axis_rope").
#pragma once

#include "kernel_align/contract/float_ops.hpp"

namespace kernel_align::contract {

struct RotatedPair {
  float first;
  float second;
};

// (a, b) rotated by the angle whose table values are (c, s):
//   first = a*c - b*s, second = a*s + b*c; products rounded, then the sum.
// The order of the second sum is that of a complex product (a + ib)(c + is) in
// PyTorch, which diffusers uses; the sum is commutative, so the bits do not depend
// on it except for NaN payloads, which store_output canonicalises.
KA_HD static inline RotatedPair rope_rotate(float a, float b, float c, float s) {
  return {sub(mul(a, c), mul(b, s)), add(mul(a, s), mul(b, c))};
}

// The backward is the transpose rotation: the same code with sin negated
// (negation is exact, so this is a*c + b*s and b*c - a*s rounded as above).
KA_HD static inline RotatedPair rope_rotate_transpose(float a, float b, float c, float s) {
  return rope_rotate(a, b, c, -s);
}

}  // namespace kernel_align::contract
