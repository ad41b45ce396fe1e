// A problem whose every tensor view is moved to other memory by a Mirror: the cuda-host
// fallback runs the reference on host copies of device tensors, the on-device tests run
// the CUDA backend on device copies of host tensors. A Mirror provides
//   template <class View> View map(View v, bool output);  // the same view, elsewhere
// (the same memory for views of the same data and extent, so in place stays in place).
#pragma once

#include <optional>

#include "api/problems.hpp"

namespace kernel_align::cuda {

template <class Mirror, class View>
std::optional<View> map(Mirror& m, const std::optional<View>& v, bool output) {
  if (!v) return std::nullopt;
  return m.map(*v, output);
}

template <class Mirror>
detail::RmsNormForwardProblem rebased(const detail::RmsNormForwardProblem& p, Mirror& m) {
  detail::RmsNormForwardProblem r = p;
  r.x = m.map(p.x, false);
  r.weight = map(m, p.weight, false);
  r.y = m.map(p.y, true);
  return r;
}

template <class Mirror>
detail::RmsNormBackwardProblem rebased(const detail::RmsNormBackwardProblem& p, Mirror& m) {
  detail::RmsNormBackwardProblem r = p;
  r.x = m.map(p.x, false);
  r.dy = m.map(p.dy, false);
  r.weight = map(m, p.weight, false);
  r.dx = m.map(p.dx, true);
  r.dw = map(m, p.dw, true);
  return r;
}

template <class Mirror>
detail::RopeProblem rebased(const detail::RopeProblem& p, Mirror& m) {
  detail::RopeProblem r = p;
  r.in = m.map(p.in, false);
  r.cos = m.map(p.cos, false);
  r.sin = m.map(p.sin, false);
  r.out = m.map(p.out, true);
  return r;
}

template <class Mirror>
detail::QkNormRopeForwardProblem rebased(const detail::QkNormRopeForwardProblem& p, Mirror& m) {
  detail::QkNormRopeForwardProblem r = p;
  for (detail::NormRopeForwardProblem& s : r.streams) {
    s.x = m.map(s.x, false);
    s.weight = map(m, s.weight, false);
    s.cos = m.map(s.cos, false);
    s.sin = m.map(s.sin, false);
    s.y = m.map(s.y, true);
  }
  return r;
}

template <class Mirror>
detail::QkNormRopeBackwardProblem rebased(const detail::QkNormRopeBackwardProblem& p, Mirror& m) {
  detail::QkNormRopeBackwardProblem r = p;
  for (TensorView& dw : r.empty_stream_grads) dw = m.map(dw, true);
  for (detail::NormRopeBackwardProblem& s : r.streams) {
    s.x = m.map(s.x, false);
    s.dy = m.map(s.dy, false);
    s.weight = map(m, s.weight, false);
    s.cos = m.map(s.cos, false);
    s.sin = m.map(s.sin, false);
    s.dx = m.map(s.dx, true);
    s.dw = map(m, s.dw, true);
  }
  return r;
}

}  // namespace kernel_align::cuda
