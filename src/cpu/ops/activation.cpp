// The elementwise activation on the CPU: rows in ranges over the pool, each row widened to
// fp32, through the GEMM engine's vector activation of the selected path (the lanes of
// cpu/gemm/activation_simd.hpp: the contract's scalar functions' bits), and stored.
#include <vector>

#include "cpu/cpu_backend.hpp"
#include "cpu/gemm/gemm.hpp"
#include "cpu/pool_passes.hpp"

namespace kernel_align::cpu {
namespace {

// A row of `v` widened to fp32 into out[0..d).
void load_row(const ConstTensorView& v, const detail::RowIndexer& rows, std::int64_t r,
              std::int64_t d, float* out) {
  const std::int64_t base = rows.offset(r), step = v.strides[v.rank - 1];
  for (std::int64_t i = 0; i < d; ++i)
    out[i] = contract::load_f32(v.dtype, v.data, base + i * step);
}

void store_row(const TensorView& v, const detail::RowIndexer& rows, std::int64_t r, std::int64_t d,
               const float* values) {
  const std::int64_t base = rows.offset(r), step = v.strides[v.rank - 1];
  for (std::int64_t i = 0; i < d; ++i)
    contract::store_output(v.dtype, v.data, base + i * step, values[i]);
}

// out = act(x) (dy absent) or act'(x) dy, row by row on `path`.
void activation_rows(const ConstTensorView& x, const ConstTensorView* dy, const TensorView& out,
                     contract::Activation activation, registry::Execution& exec) {
  const Isa path = gemm_isa(isa());
  exec.isa = isa_name(path);
  const std::int64_t d = x.shape[x.rank - 1];
  const detail::RowIndexer x_rows(x), out_rows{ConstTensorView(out)};
  const detail::RowIndexer dy_rows = dy != nullptr ? detail::RowIndexer(*dy) : x_rows;
  for_rows(detail::row_count(x), static_cast<int>(d), exec, [&](RowRange range) {
    thread_local std::vector<float> z, g, result;
    z.resize(static_cast<std::size_t>(d));
    g.resize(static_cast<std::size_t>(d));
    result.resize(static_cast<std::size_t>(d));
    for (std::int64_t r = range.begin; r < range.end; ++r) {
      load_row(x, x_rows, r, d, z.data());
      if (dy != nullptr) load_row(*dy, dy_rows, r, d, g.data());
      gemm_epilogue_activation(path, activation, z.data(), dy != nullptr ? g.data() : nullptr,
                               result.data(), d);
      store_row(out, out_rows, r, d, result.data());
    }
  });
}

void activation_forward(const detail::ActivationProblem& p, registry::Execution& exec) {
  activation_rows(p.x, nullptr, p.y, p.activation, exec);
}

void activation_backward(const detail::ActivationBackwardProblem& p, registry::Execution& exec) {
  activation_rows(p.x, &p.dy, p.dx, p.activation, exec);
}

}  // namespace

void add_activation_kernels(registry::Kernels& k) {
  k.set<OpType::Activation, Direction::Forward>(activation_forward);
  k.set<OpType::Activation, Direction::Backward>(activation_backward);
}

}  // namespace kernel_align::cpu
