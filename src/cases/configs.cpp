#include "cases/configs.hpp"

#include "api/descriptors.hpp"

namespace kernel_align::cases {

// An op has a norm mode, a pairing or a layout when its descriptor lists that option.
namespace {
bool has_option(OpType op, const char* name) {
  return detail::descriptor(op).option(name) != nullptr;
}
}  // namespace

std::vector<std::optional<NormMode>> norm_modes_of(OpType op) {
  if (!has_option(op, "mode")) return {std::nullopt};
  return {NormMode::Single, NormMode::Diffusers};
}

std::vector<std::optional<Pairing>> pairings_of(OpType op) {
  if (!has_option(op, "pairing")) return {std::nullopt};
  return {Pairing::Half, Pairing::Interleaved};
}

std::vector<std::optional<Layout>> layouts_of(OpType op) {
  if (!has_option(op, "layout")) return {std::nullopt};
  return {Layout::BSHD, Layout::BHSD};
}

std::vector<std::optional<Activation>> activations_of(OpType op) {
  if (!has_option(op, "activation")) return {std::nullopt};
  return {Activation::None, Activation::GeluTanh, Activation::Silu};
}

std::vector<std::optional<LatentTransform>> transforms_of(OpType op) {
  if (!has_option(op, "transform")) return {std::nullopt};
  return {LatentTransform::Normalize, LatentTransform::Denormalize};
}

std::string config_words(const Config& c) {
  std::string words = std::string(op_type_name(c.op)) + " " + direction_name(c.direction) + " " +
                      dtype_name(c.dtype);
  if (c.pairing) words += std::string(" ") + pairing_name(*c.pairing);
  if (c.mode) words += std::string(" ") + norm_mode_name(*c.mode);
  if (c.layout) words += std::string(" ") + layout_name(*c.layout);
  if (c.activation) words += std::string(" ") + activation_name(*c.activation);
  if (c.transform) words += std::string(" ") + latent_transform_name(*c.transform);
  return words;
}

std::vector<Config> all_configs() {
  std::vector<Config> configs;
  std::size_t row = 0;
  for (const OpType op : kOpTypes) {
    for (const Direction direction : kDirections) {
      for (const DType dtype : kAllDTypes) {
        for (const auto& pairing : pairings_of(op)) {
          for (const auto& mode : norm_modes_of(op)) {
            for (const auto& layout : layouts_of(op)) {
              for (const auto& activation : activations_of(op)) {
                for (const auto& transform : transforms_of(op)) {
                  configs.push_back(
                      {op, direction, dtype, pairing, mode, layout, activation, transform, row});
                }
              }
            }
          }
        }
        ++row;
      }
    }
  }
  return configs;
}

}  // namespace kernel_align::cases
