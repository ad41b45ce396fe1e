// true_cfg on the CPU: ranges of rows over the pool, each row through the reference's row
// function (reference/true_cfg.hpp: contract/cfg.hpp's scalar functions), so the bytes are
// the reference's by construction. The same baseline code runs on every path: a call
// reports the selected one.
#include "reference/true_cfg.hpp"
#include "cpu/cpu_backend.hpp"
#include "cpu/pool_passes.hpp"

namespace kernel_align::cpu {
namespace {

void true_cfg_forward(const detail::TrueCfgProblem& p, registry::Execution& exec) {
  exec.isa = isa_name(isa());
  for_rows(detail::row_count(p.cond), static_cast<int>(p.cond.shape[p.cond.rank - 1]), exec,
           [&](RowRange r) { reference::true_cfg_forward_rows(p, r.begin, r.end); });
}

void true_cfg_backward(const detail::TrueCfgBackwardProblem& p, registry::Execution& exec) {
  exec.isa = isa_name(isa());
  for_rows(detail::row_count(p.cond), static_cast<int>(p.cond.shape[p.cond.rank - 1]), exec,
           [&](RowRange r) { reference::true_cfg_backward_rows(p, r.begin, r.end); });
}

}  // namespace

void add_true_cfg_kernels(registry::Kernels& k) {
  k.set<OpType::TrueCfg, Direction::Forward>(true_cfg_forward);
  k.set<OpType::TrueCfg, Direction::Backward>(true_cfg_backward);
}

}  // namespace kernel_align::cpu
