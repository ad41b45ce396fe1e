#include "reference/true_cfg.hpp"

#include "kernel_align/contract/cfg.hpp"
#include "kernel_align/contract/convert.hpp"
#include "reference/kernels.hpp"

namespace kernel_align::reference {
namespace {

// Element i of row r of a view, widened to fp32.
class RowLoader {
 public:
  explicit RowLoader(const ConstTensorView& v) : v_(v), rows_(v), step_(v.strides[v.rank - 1]) {}
  std::int64_t index(std::int64_t r, std::int64_t i) const { return rows_.offset(r) + i * step_; }
  float load(std::int64_t r, std::int64_t i) const {
    return contract::load_f32(v_.dtype, v_.data, index(r, i));
  }

 private:
  ConstTensorView v_;
  detail::RowIndexer rows_;
  std::int64_t step_;
};

int row_length(const ConstTensorView& v) {
  return static_cast<int>(v.shape[v.rank - 1]);
}

}  // namespace

void true_cfg_forward_rows(const detail::TrueCfgProblem& p, std::int64_t begin, std::int64_t end) {
  const RowLoader cond(p.cond), uncond(p.uncond), v{ConstTensorView(p.v)};
  const int d = row_length(p.cond);
  for (std::int64_t r = begin; r < end; ++r) {
    const contract::CfgRow row = contract::cfg_row(
        d, p.scale, [&](int i) { return cond.load(r, i); },
        [&](int i) { return uncond.load(r, i); });
    const float ratio = row.ratio();
    for (int i = 0; i < d; ++i) {
      const float combined = contract::cfg_combined(cond.load(r, i), uncond.load(r, i), p.scale);
      contract::store_output(p.v.dtype, p.v.data, v.index(r, i),
                             contract::cfg_output(combined, ratio));
    }
  }
}

void true_cfg_backward_rows(const detail::TrueCfgBackwardProblem& p, std::int64_t begin,
                            std::int64_t end) {
  const RowLoader cond(p.cond), uncond(p.uncond), dv(p.dv);
  // An absent output's rows: cond's (never indexed).
  const RowLoader dcond(p.dcond.data != nullptr ? ConstTensorView(p.dcond) : p.cond);
  const RowLoader duncond(p.duncond.data != nullptr ? ConstTensorView(p.duncond) : p.cond);
  const int d = row_length(p.cond);
  for (std::int64_t r = begin; r < end; ++r) {
    const auto c = [&](int i) { return cond.load(r, i); };
    const auto u = [&](int i) { return uncond.load(r, i); };
    const contract::CfgRow row = contract::cfg_row(d, p.scale, c, u);
    const float a = contract::tree_sum(d, [&](int i) {
      return contract::mul(dv.load(r, i), contract::cfg_combined(c(i), u(i), p.scale));
    });
    const contract::CfgGradient g = contract::cfg_gradient(row, a, p.scale);
    for (int i = 0; i < d; ++i) {
      const contract::CfgElementGradient e =
          contract::cfg_element_gradient(g, dv.load(r, i), c(i), u(i));
      if (p.dcond.data != nullptr)
        contract::store_output(p.dcond.dtype, p.dcond.data, dcond.index(r, i), e.dcond);
      if (p.duncond.data != nullptr)
        contract::store_output(p.duncond.dtype, p.duncond.data, duncond.index(r, i), e.duncond);
    }
  }
}

void add_true_cfg_kernels(registry::Kernels& k) {
  k.set<OpType::TrueCfg, Direction::Forward>(
      [](const detail::TrueCfgProblem& p, registry::Execution& exec) {
        const std::int64_t rows = detail::row_count(p.cond);
        record_scalar(exec, {rows});
        true_cfg_forward_rows(p, 0, rows);
      });
  k.set<OpType::TrueCfg, Direction::Backward>(
      [](const detail::TrueCfgBackwardProblem& p, registry::Execution& exec) {
        const std::int64_t rows = detail::row_count(p.cond);
        record_scalar(exec, {rows});
        true_cfg_backward_rows(p, 0, rows);
      });
}

}  // namespace kernel_align::reference
