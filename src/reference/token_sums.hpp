// Sums over each sample's tokens (adaln_modulation's dscale and dshift, the gate's
// dgate): contract section 3's dw partition applied to a sample's S tokens. Each
// (sample, block of kDwBlockRows consecutive tokens) is a task that sums its tokens in
// order from +0; a sample's sums are then its blocks' sums added in block order from +0.
// The reference runs the tasks in order, the CPU backend on its pool: one code path, so
// the order of every addition is the same.
#pragma once

#include <cstdint>
#include <vector>

#include "kernel_align/contract/float_ops.hpp"
#include "kernel_align/contract/rmsnorm.hpp"  // the dw partition

namespace kernel_align::reference {

// The shape of a call's sums: B samples of S tokens, `outputs` sums of D values each
// (one or two).
struct TokenSums {
  std::int64_t batch = 0;
  std::int64_t seq = 0;
  int dim = 0;
  int outputs = 1;

  std::int64_t blocks() const { return contract::dw_block_count(seq); }
  std::int64_t tasks() const { return batch * blocks(); }
  // Task t's sample and its tokens [begin, end).
  std::int64_t sample(std::int64_t t) const { return t / blocks(); }
  std::int64_t begin(std::int64_t t) const { return contract::dw_block_begin(seq, t % blocks()); }
  std::int64_t end(std::int64_t t) const { return contract::dw_block_end(seq, t % blocks()); }
};

// run_tasks for the reference: every task on the calling thread, in order.
struct RunInOrder {
  template <class Task>
  void operator()(std::int64_t tasks, const Task& task) const {
    for (std::int64_t t = 0; t < tasks; ++t) task(t);
  }
};
inline constexpr RunInOrder run_in_order{};

// Runs the sums: run_tasks(count, task) calls task(t) once for each t in [0, count), in
// any order and on any threads; block_sum(b, begin, end, parts) adds the terms of sample
// b's tokens [begin, end) in token order into parts[o][0..D) (o < outputs, zeroed
// before; a task's parts are adjacent, parts[1] = parts[0] + D); store(b, o, i, total) writes
// sample b's sum i of output o. `scratch` holds the block sums (tasks x outputs x D floats), kept
// by the caller between calls.
template <class RunTasks, class BlockSum, class Store>
void sum_over_tokens(const TokenSums& s, std::vector<float>& scratch, const RunTasks& run_tasks,
                     const BlockSum& block_sum, const Store& store) {
  const std::int64_t tasks = s.tasks();
  const auto stride = static_cast<std::int64_t>(s.outputs) * s.dim;  // floats a task
  scratch.assign(static_cast<std::size_t>(tasks * stride), 0.0f);
  float* const base = scratch.data();  // the tasks see the caller's scratch by this pointer
  run_tasks(tasks, [&](std::int64_t t) {
    float* parts[2] = {base + t * stride, base + t * stride + s.dim};
    block_sum(s.sample(t), s.begin(t), s.end(t), parts);
  });
  const std::int64_t blocks = s.blocks();
  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (int o = 0; o < s.outputs; ++o) {
      for (int i = 0; i < s.dim; ++i) {
        float total = 0.0f;
        for (std::int64_t k = 0; k < blocks; ++k) {
          total = contract::add(total, base[(b * blocks + k) * stride + o * s.dim + i]);
        }
        store(b, o, i, total);
      }
    }
  }
}

}  // namespace kernel_align::reference
