// The configurations of the ops (op x direction x dtype x pairing x mode x layout) that
// verify runs, and the norm modes, pairings and layouts each op has, which the tests'
// backend matrices run too.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "kernel_align/ops.hpp"
#include "kernel_align/registry.hpp"

namespace kernel_align::cases {

// The norm modes of an op: none (one nullopt) for multi_axis_rope.
std::vector<std::optional<NormMode>> norm_modes_of(OpType op);
// The pairings of an op: none (one nullopt) for qk_rmsnorm.
std::vector<std::optional<Pairing>> pairings_of(OpType op);
// The layouts of an op: none (one nullopt) for qk_rmsnorm.
std::vector<std::optional<Layout>> layouts_of(OpType op);
// The activations of an op: every one for linear, none (one nullopt) for the others.
std::vector<std::optional<Activation>> activations_of(OpType op);
// The transforms of an op: both for latent_normalize, none (one nullopt) for the others.
std::vector<std::optional<LatentTransform>> transforms_of(OpType op);

inline constexpr DType kAllDTypes[] = {DType::F32, DType::BF16, DType::F16};

// One configuration of an op; pairing, mode, layout, activation and transform are set
// where the op has them.
struct Config {
  OpType op = OpType::QkRmsNorm;
  Direction direction = Direction::Forward;
  DType dtype = DType::F32;
  std::optional<Pairing> pairing;
  std::optional<NormMode> mode;
  std::optional<Layout> layout;
  std::optional<Activation> activation;
  std::optional<LatentTransform> transform;
  std::size_t row = 0;  // the index of its (op, direction, dtype) among all_configs()'
};

// "qk_norm_rope backward bf16 half diffusers bhsd"
std::string config_words(const Config& c);

// Every configuration, grouped by (op, direction, dtype) in the order of kOpTypes,
// kDirections and kAllDTypes; within a group pairing, then mode, then layout, then
// activation, then transform.
std::vector<Config> all_configs();

}  // namespace kernel_align::cases
