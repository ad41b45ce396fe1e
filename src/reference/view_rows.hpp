// A view's rows (its last dim a row) as the reference reads and writes them element by
// element: element i of row r through the view's row indexer, widened to fp32 or stored
// with the contract's one rounding. Shared by the ops whose rows are any rank and strides
// (flow_sde, true_cfg).
#pragma once

#include <cstdint>

#include "api/problems.hpp"
#include "kernel_align/contract/convert.hpp"

namespace kernel_align::reference {

class Rows {
 public:
  explicit Rows(const ConstTensorView& v)
      : v_(v), rows_(v), step_(v.strides[v.rank - 1]), d_(v.shape[v.rank - 1]) {}
  std::int64_t d() const { return d_; }
  std::int64_t index(std::int64_t r, std::int64_t i) const { return rows_.offset(r) + i * step_; }
  float load(std::int64_t r, std::int64_t i) const {
    return contract::load_f32(v_.dtype, v_.data, index(r, i));
  }

 private:
  ConstTensorView v_;
  detail::RowIndexer rows_;
  std::int64_t step_, d_;
};

// Element i of row r of `out`, whose rows `rows` indexes (a view of `out` itself).
inline void store(const TensorView& out, const Rows& rows, std::int64_t r, std::int64_t i,
                  float value) {
  contract::store_output(out.dtype, out.data, rows.index(r, i), value);
}

}  // namespace kernel_align::reference
