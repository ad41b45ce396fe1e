#include "reference/gate_residual.hpp"

#include "kernel_align/contract/gate_residual.hpp"
#include "reference/kernels.hpp"
#include "reference/strided_rows.hpp"

namespace kernel_align::reference {
namespace {

// A row's working arrays of D floats each, kept per thread.
struct RowScratch {
  std::vector<float> a, b, gate;
  explicit RowScratch(int d) {
    for (std::vector<float>* v : {&a, &b, &gate}) v->resize(static_cast<std::size_t>(d));
  }
};

RowScratch& scratch(int d) {
  thread_local RowScratch rows(0);
  if (rows.a.size() != static_cast<std::size_t>(d)) rows = RowScratch(d);
  return rows;
}

void gate_residual_forward_rows(const detail::GateResidualProblem& p, std::int64_t begin,
                                std::int64_t end) {
  RowScratch& w = scratch(p.dim);
  std::int64_t sample = -1;  // whose gate w.gate holds
  for (std::int64_t r = begin; r < end; ++r) {
    const std::int64_t b = r / p.seq;
    const std::int64_t s = r % p.seq;
    if (b != sample) {
      load_row(p.gate, b, 0, p.dim, w.gate.data());
      sample = b;
    }
    load_row(p.x, b, s, p.dim, w.a.data());
    load_row(p.y, b, s, p.dim, w.b.data());
    for (int i = 0; i < p.dim; ++i) {
      w.a[i] = contract::gate_residual_forward(w.a[i], w.gate[i], w.b[i], p.mode, p.out.dtype);
    }
    store_row(p.out, b, s, p.dim, w.a.data());
  }
}

void gate_token_block_sum(const detail::GateResidualBackwardProblem& p, std::int64_t b,
                          std::int64_t begin, std::int64_t end, float* const* parts) {
  RowScratch& w = scratch(p.dim);
  float* const dgate = parts[0];
  for (std::int64_t s = begin; s < end; ++s) {
    load_row(p.dout, b, s, p.dim, w.a.data());
    load_row(p.y, b, s, p.dim, w.b.data());
    for (int i = 0; i < p.dim; ++i)
      dgate[i] = contract::add(dgate[i], contract::mul(w.a[i], w.b[i]));
  }
}

void gate_residual_backward_rows(const detail::GateResidualBackwardProblem& p, std::int64_t begin,
                                 std::int64_t end) {
  RowScratch& w = scratch(p.dim);
  std::int64_t sample = -1;
  for (std::int64_t r = begin; r < end; ++r) {
    const std::int64_t b = r / p.seq;
    const std::int64_t s = r % p.seq;
    if (b != sample) {
      load_row(p.gate, b, 0, p.dim, w.gate.data());
      sample = b;
    }
    load_row(p.dout, b, s, p.dim, w.a.data());
    for (int i = 0; i < p.dim; ++i) w.a[i] = contract::gate_residual_dy(w.gate[i], w.a[i]);
    store_row(p.dy, b, s, p.dim, w.a.data());
  }
}

}  // namespace

TokenSums gate_token_sums_of(const detail::GateResidualBackwardProblem& p) {
  return {p.batch, p.seq, p.dim, p.dgate.data != nullptr ? 1 : 0};
}

void gate_store_token_sum(const detail::GateResidualBackwardProblem& p, std::int64_t b, int i,
                          float total) {
  contract::store_output(p.dgate.dtype, p.dgate.data, p.dgate.offset(b, 0, i), total);
}

void gate_residual_forward(const detail::GateResidualProblem& p) {
  gate_residual_forward_rows(p, 0, p.batch * p.seq);
}

void gate_residual_backward(const detail::GateResidualBackwardProblem& p) {
  const TokenSums sums = gate_token_sums_of(p);
  if (sums.outputs > 0) {
    std::vector<float> scratch;
    sum_over_tokens(
        sums, scratch, run_in_order,
        [&](std::int64_t b, std::int64_t begin, std::int64_t end, float* const* parts) {
          gate_token_block_sum(p, b, begin, end, parts);
        },
        [&](std::int64_t b, int, int i, float total) { gate_store_token_sum(p, b, i, total); });
  }
  // dy after every sum: dy may be dout or y.
  gate_residual_backward_rows(p, 0, p.batch * p.seq);
}

void add_adaln_gate_residual_kernels(registry::Kernels& k) {
  k.set<OpType::AdaLnGateResidual, Direction::Forward>(
      [](const detail::GateResidualProblem& p, registry::Execution& exec) {
        record_scalar(exec, {p.batch * p.seq});
        gate_residual_forward(p);
      });
  k.set<OpType::AdaLnGateResidual, Direction::Backward>(
      [](const detail::GateResidualBackwardProblem& p, registry::Execution& exec) {
        record_scalar(exec, {p.batch * p.seq});
        gate_residual_backward(p);
      });
}

}  // namespace kernel_align::reference
