// Joint attention on the CPU (docs/contract.md, "Joint attention"): per sample and head,
// the valid tokens' rows gathered to fp32, and the contract's products run by the GEMM
// engine (cpu/gemm), whose linear tree is the contract's: scores Q K^T, l = 1 P^T,
// U = P V (backward: dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q); the softmax
// rows by the path's vectors. Every path and thread count produces the reference's
// bytes (reference/attention.hpp).
#pragma once

#include "api/attention_problem.hpp"
#include "kernel_align/runtime.hpp"

namespace kernel_align::cpu {

void attention_forward(const detail::AttentionProblem& p, int threads, Isa isa);
void attention_backward(const detail::AttentionBackwardProblem& p, int threads, Isa isa);

}  // namespace kernel_align::cpu
