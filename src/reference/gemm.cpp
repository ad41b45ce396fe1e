#include "reference/gemm.hpp"
#include "reference/kernels.hpp"

#include <utility>

#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/linear.hpp"

namespace kernel_align::reference {

void gemm(const detail::GemmProblem& p) {
  for (std::int64_t m = 0; m < p.m; ++m) {
    for (std::int64_t n = 0; n < p.n; ++n) {
      const float sum = contract::linear_sum(p.r, [&](std::int64_t k) {
        return std::pair{
            contract::load_f32(p.a.dtype, p.a.data, m * p.a.row_stride + k * p.a.col_stride),
            contract::load_f32(p.b.dtype, p.b.data, k * p.b.row_stride + n * p.b.col_stride)};
      });
      float bias = 0.0f;
      if (p.bias) bias = contract::load_f32(p.bias->dtype, p.bias->data, n * p.bias->col_stride);
      const float* bias_or_null = p.bias ? &bias : nullptr;
      const float out =
          p.grad_out
              ? contract::linear_activation_grad(
                    sum, bias_or_null, p.activation,
                    contract::load_f32(p.grad_out->dtype, p.grad_out->data,
                                       m * p.grad_out->row_stride + n * p.grad_out->col_stride))
              : contract::linear_output(sum, bias_or_null, p.activation);
      contract::store_output(p.c_dtype, p.c, m * p.c_row_stride + n * p.c_col_stride, out);
    }
  }
}

void add_linear_kernels(registry::Kernels& k) {
  k.set<OpType::Linear, Direction::Forward>(
      [](const detail::GemmProblem& p, registry::Execution& exec) {
        record_scalar(exec, {p.m});
        gemm(p);
      });
  k.set<OpType::Linear, Direction::Backward>(
      [](const detail::LinearBackwardProblem& p, registry::Execution& exec) {
        record_scalar(exec, {});
        linear_backward(p, [&](const detail::GemmProblem& g) {
          if (exec.traced) exec.partition.push_back({{0, g.m}});
          gemm(g);
        });
      });
}

}  // namespace kernel_align::reference
