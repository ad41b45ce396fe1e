#include "reference/true_cfg.hpp"

#include "kernel_align/contract/cfg.hpp"
#include "kernel_align/contract/convert.hpp"
#include "reference/kernels.hpp"
#include "reference/view_rows.hpp"

namespace kernel_align::reference {
void true_cfg_forward_rows(const detail::TrueCfgProblem& p, std::int64_t begin, std::int64_t end) {
  const Rows cond(p.cond), uncond(p.uncond), v{ConstTensorView(p.v)};
  const int d = static_cast<int>(cond.d());
  for (std::int64_t r = begin; r < end; ++r) {
    const contract::CfgRow row = contract::cfg_row(
        d, p.scale, [&](int i) { return cond.load(r, i); },
        [&](int i) { return uncond.load(r, i); });
    const float ratio = row.ratio();
    for (int i = 0; i < d; ++i) {
      const float combined = contract::cfg_combined(cond.load(r, i), uncond.load(r, i), p.scale);
      store(p.v, v, r, i, contract::cfg_output(combined, ratio));
    }
  }
}

void true_cfg_backward_rows(const detail::TrueCfgBackwardProblem& p, std::int64_t begin,
                            std::int64_t end) {
  const Rows cond(p.cond), uncond(p.uncond), dv(p.dv);
  // An absent output's rows: cond's (never indexed).
  const Rows dcond(p.dcond.data != nullptr ? ConstTensorView(p.dcond) : p.cond);
  const Rows duncond(p.duncond.data != nullptr ? ConstTensorView(p.duncond) : p.cond);
  const int d = static_cast<int>(cond.d());
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
      if (p.dcond.data != nullptr) store(p.dcond, dcond, r, i, e.dcond);
      if (p.duncond.data != nullptr) store(p.duncond, duncond, r, i, e.duncond);
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
