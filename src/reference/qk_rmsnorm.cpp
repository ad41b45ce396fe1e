#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/rmsnorm.hpp"
#include "reference/kernels.hpp"
#include "reference/reference.hpp"

namespace kernel_align::reference {
namespace {

using contract::load_f32;

// A [D] vector read once per call; an absent weight is fp32 ones (contract).
struct Weight {
  std::vector<float> values;
  DType dtype = DType::F32;

  Weight(const std::optional<ConstTensorView>& w, int d)
      : values(static_cast<std::size_t>(d), 1.0f) {
    if (!w) return;
    dtype = w->dtype;
    for (int i = 0; i < d; ++i) values[i] = load_f32(w->dtype, w->data, i * w->strides[0]);
  }
};

// Row r of a view, widened to fp32.
void load_row(const ConstTensorView& v, const detail::RowIndexer& rows, std::int64_t r,
              std::vector<float>& out) {
  const std::int64_t base = rows.offset(r);
  const std::int64_t step = v.strides[v.rank - 1];
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = load_f32(v.dtype, v.data, base + static_cast<std::int64_t>(i) * step);
  }
}

}  // namespace

void qk_rmsnorm_forward(const detail::RmsNormForwardProblem& p) {
  const Weight weight(p.weight, p.d);
  const detail::RowIndexer x_rows(p.x);
  const detail::RowIndexer y_rows(p.y);
  const std::int64_t y_step = p.y.strides[p.y.rank - 1];
  std::vector<float> x(static_cast<std::size_t>(p.d));
  for (std::int64_t r = 0; r < x_rows.rows(); ++r) {
    load_row(p.x, x_rows, r, x);
    const float rstd = contract::row_rstd(p.d, p.options.eps, [&](int i) { return x[i]; });
    const std::int64_t y_base = y_rows.offset(r);
    for (int i = 0; i < p.d; ++i) {
      const float y =
          contract::rms_forward(x[i], rstd, weight.values[i], p.options.mode, weight.dtype);
      contract::store_output(p.y.dtype, p.y.data, y_base + i * y_step, y);
    }
  }
}

void qk_rmsnorm_backward(const detail::RmsNormBackwardProblem& p) {
  const Weight weight(p.weight, p.d);
  const detail::RowIndexer x_rows(p.x);
  const detail::RowIndexer dy_rows(p.dy);
  const detail::RowIndexer dx_rows(p.dx);
  const std::int64_t rows = x_rows.rows();
  const std::int64_t dx_step = p.dx.strides[p.dx.rank - 1];
  const auto d = static_cast<std::size_t>(p.d);
  std::vector<float> x(d), dy(d), g(d);
  std::vector<float> dw_block(d), dw_total(d, 0.0f);

  // Rows in order; dw block sums close at the contract's fixed block boundaries.
  const std::int64_t blocks = contract::dw_block_count(rows);
  for (std::int64_t block = 0; block < blocks; ++block) {
    std::fill(dw_block.begin(), dw_block.end(), 0.0f);
    const std::int64_t end = contract::dw_block_end(rows, block);
    for (std::int64_t r = contract::dw_block_begin(rows, block); r < end; ++r) {
      load_row(p.x, x_rows, r, x);
      load_row(p.dy, dy_rows, r, dy);
      for (std::size_t i = 0; i < d; ++i) g[i] = contract::mul(dy[i], weight.values[i]);
      const auto row = contract::rms_backward_row(
          p.d, p.options.eps, [&](int i) { return x[i]; }, [&](int i) { return g[i]; });
      const std::int64_t dx_base = dx_rows.offset(r);
      for (int i = 0; i < p.d; ++i) {
        contract::store_output(p.dx.dtype, p.dx.data, dx_base + i * dx_step,
                               contract::rms_backward_dx(x[i], g[i], row));
        const float normalized =
            contract::rms_normalized(x[i], row.rstd, p.options.mode, weight.dtype);
        dw_block[i] = contract::add(dw_block[i], contract::mul(dy[i], normalized));
      }
    }
    for (std::size_t i = 0; i < d; ++i) dw_total[i] = contract::add(dw_total[i], dw_block[i]);
  }
  if (p.dw) {
    for (int i = 0; i < p.d; ++i) {
      contract::store_output(p.dw->dtype, p.dw->data, i * p.dw->strides[0], dw_total[i]);
    }
  }
}

void add_qk_rmsnorm_kernels(registry::Kernels& k) {
  k.set<OpType::QkRmsNorm, Direction::Forward>(
      [](const detail::RmsNormForwardProblem& p, registry::Execution& exec) {
        record_scalar(exec, {detail::row_count(p.x)});
        qk_rmsnorm_forward(p);
      });
  k.set<OpType::QkRmsNorm, Direction::Backward>(
      [](const detail::RmsNormBackwardProblem& p, registry::Execution& exec) {
        record_scalar(exec, {detail::row_count(p.x)});
        qk_rmsnorm_backward(p);
      });
}

}  // namespace kernel_align::reference
