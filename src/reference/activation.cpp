#include "reference/activation.hpp"

#include "kernel_align/contract/activation.hpp"
#include "kernel_align/contract/convert.hpp"
#include "reference/kernels.hpp"

namespace kernel_align::reference {

void activation_forward_rows(const detail::ActivationProblem& p, std::int64_t begin,
                             std::int64_t end) {
  const detail::RowIndexer x_rows(p.x), y_rows(p.y);
  const std::int64_t d = p.x.shape[p.x.rank - 1];
  const std::int64_t x_step = p.x.strides[p.x.rank - 1], y_step = p.y.strides[p.y.rank - 1];
  for (std::int64_t r = begin; r < end; ++r) {
    const std::int64_t x0 = x_rows.offset(r), y0 = y_rows.offset(r);
    for (std::int64_t i = 0; i < d; ++i) {
      const float z = contract::load_f32(p.x.dtype, p.x.data, x0 + i * x_step);
      contract::store_output(p.y.dtype, p.y.data, y0 + i * y_step,
                             contract::activate(p.activation, z));
    }
  }
}

void activation_backward_rows(const detail::ActivationBackwardProblem& p, std::int64_t begin,
                              std::int64_t end) {
  const detail::RowIndexer x_rows(p.x), dy_rows(p.dy), dx_rows(p.dx);
  const std::int64_t d = p.x.shape[p.x.rank - 1];
  const std::int64_t x_step = p.x.strides[p.x.rank - 1];
  const std::int64_t dy_step = p.dy.strides[p.dy.rank - 1];
  const std::int64_t dx_step = p.dx.strides[p.dx.rank - 1];
  for (std::int64_t r = begin; r < end; ++r) {
    const std::int64_t x0 = x_rows.offset(r), dy0 = dy_rows.offset(r), dx0 = dx_rows.offset(r);
    for (std::int64_t i = 0; i < d; ++i) {
      const float z = contract::load_f32(p.x.dtype, p.x.data, x0 + i * x_step);
      const float g = contract::load_f32(p.dy.dtype, p.dy.data, dy0 + i * dy_step);
      contract::store_output(p.dx.dtype, p.dx.data, dx0 + i * dx_step,
                             contract::activate_backward(p.activation, g, z));
    }
  }
}

void add_activation_kernels(registry::Kernels& k) {
  k.set<OpType::Activation, Direction::Forward>(
      [](const detail::ActivationProblem& p, registry::Execution& exec) {
        const std::int64_t rows = detail::row_count(p.x);
        record_scalar(exec, {rows});
        activation_forward_rows(p, 0, rows);
      });
  k.set<OpType::Activation, Direction::Backward>(
      [](const detail::ActivationBackwardProblem& p, registry::Execution& exec) {
        const std::int64_t rows = detail::row_count(p.x);
        record_scalar(exec, {rows});
        activation_backward_rows(p, 0, rows);
      });
}

}  // namespace kernel_align::reference
