// The one list of the library's ops: each op named once, as its enumerator and as the
// name the trace, the registry table, verify and the bindings use. Everything that
// enumerates ops (OpType, op_type_name, kOpTypes, the registry's kernel slots, the
// configurations verify runs) is derived from this list, so adding an op is one row
// here plus its descriptor (src/api/descriptors.cpp).
//
// KERNEL_ALIGN_OPS(X) calls X(Enumerator, name) once per op, in enum order.
#pragma once

#define KERNEL_ALIGN_OPS(X)                 \
  X(QkRmsNorm, qk_rmsnorm)                  \
  X(MultiAxisRope, multi_axis_rope)         \
  X(QkNormRope, qk_norm_rope)               \
  X(Linear, linear)                         \
  X(Attention, attention)                   \
  X(AdaLnModulation, adaln_modulation)      \
  X(AdaLnGateResidual, adaln_gate_residual) \
  X(Activation, activation)                 \
  X(FlowSdeStep, flow_sde_step)             \
  X(FlowSdeLogp, flow_sde_logp)             \
  X(LatentNormalize, latent_normalize)      \
  X(LatentPack, latent_pack)                \
  X(TrueCfg, true_cfg)
