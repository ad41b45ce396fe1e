// The CPU GEMM engine (docs/contract.md, "Linear (GEMM)"): BLIS-style packing and one
// register-blocked micro-kernel per instruction-set path, tiles of C spread over the
// thread pool. Every path and thread count produces the reference's bytes
// (reference/gemm.hpp).
#pragma once

#include "api/gemm_problem.hpp"
#include "cpu/gemm/flow_sde_row.hpp"
#include "cpu/gemm/latent_row.hpp"
#include "kernel_align/runtime.hpp"

namespace kernel_align::cpu {

// The path `gemm` runs for a requested one: Avx2 needs FMA besides AVX2 (the row kernels'
// Avx2 does not), and falls to Portable without it.
Isa gemm_isa(Isa requested);

// C of `p` with at most `threads` threads on the micro-kernel of gemm_isa(isa). `isa`
// must be supported by this CPU (at most best_isa()). Packing buffers are kept between
// calls (per calling thread and per worker), so a warm call allocates nothing.
void gemm(const detail::GemmProblem& p, int threads, Isa isa);

// out[i] = contract::activate(activation, z[i]) (dy null) or
// contract::activate_backward(activation, dy[i], z[i]), computed by the vector epilogue of
// gemm_isa(isa)'s path (for the tests: it must give the scalar functions' bits).
void gemm_epilogue_activation(Isa isa, contract::Activation activation, const float* z,
                              const float* dy, float* out, std::int64_t count);

// One score row of joint attention on gemm_isa(isa)'s path: row[j] = mul(row[j], scale),
// then the probabilities exp_f32(sub(s, m)) of the row's maximum m (contract/attention.hpp).
void gemm_attention_probabilities(Isa isa, float* row, std::int64_t n, float scale);

// The SDE step's row kernels of gemm_isa(isa)'s path (flow_sde_simd.hpp).
const FlowSdeKernels& gemm_flow_sde_kernels(Isa isa);

// latent_normalize's row kernel of gemm_isa(isa)'s path (latent_simd.hpp).
LatentNormalizeRow gemm_latent_normalize_row(Isa isa);
// latent_pack's fp32 pair kernel of gemm_isa(isa)'s path (run null on portable).
const LatentPackPairs& gemm_latent_pack_pairs(Isa isa);

}  // namespace kernel_align::cpu
