// Every (op, direction) the CUDA kernels run, and its plan: the device backend
// (cuda_backend.cu) and the emulated one (emulator/emulated_backend.cpp) set their kernels
// from this one list, so the emulator proves exactly what a GPU runs: every op of
// op_list.hpp (an op absent here would run on a device only through the host fallback,
// "cuda-host").
//
// KERNEL_ALIGN_CUDA_PLANS(X) calls X(OpType enumerator, Direction enumerator, plan) once
// per kernel; the problem type is detail::Problem<op, direction>.
#pragma once

#include "cuda/attention_plan.hpp"
#include "cuda/cfg_plan.hpp"
#include "cuda/flow_sde_plan.hpp"
#include "cuda/latent_plan.hpp"
#include "cuda/modulation_plan.hpp"
#include "cuda/plan.hpp"

#define KERNEL_ALIGN_CUDA_PLANS(X)                       \
  X(QkRmsNorm, Forward, rmsnorm_forward)                 \
  X(QkRmsNorm, Backward, rmsnorm_backward)               \
  X(MultiAxisRope, Forward, rope)                        \
  X(MultiAxisRope, Backward, rope)                       \
  X(QkNormRope, Forward, qk_norm_rope_forward)           \
  X(QkNormRope, Backward, qk_norm_rope_backward)         \
  X(Linear, Forward, gemm)                               \
  X(Linear, Backward, linear_backward)                   \
  X(Attention, Forward, attention_forward)               \
  X(Attention, Backward, attention_backward)             \
  X(AdaLnModulation, Forward, adaln_forward)             \
  X(AdaLnModulation, Backward, adaln_backward)           \
  X(AdaLnGateResidual, Forward, gate_residual_forward)   \
  X(AdaLnGateResidual, Backward, gate_residual_backward) \
  X(Activation, Forward, activation_forward)             \
  X(Activation, Backward, activation_backward)           \
  X(FlowSdeStep, Forward, flow_sde_step_forward)         \
  X(FlowSdeStep, Backward, flow_sde_step_backward)       \
  X(FlowSdeLogp, Forward, flow_sde_logp_forward)         \
  X(FlowSdeLogp, Backward, flow_sde_logp_backward)       \
  X(LatentNormalize, Forward, latent_normalize)          \
  X(LatentNormalize, Backward, latent_normalize)         \
  X(LatentPack, Forward, latent_pack)                    \
  X(LatentPack, Backward, latent_unpack)                 \
  X(TrueCfg, Forward, true_cfg_forward)                  \
  X(TrueCfg, Backward, true_cfg_backward)
