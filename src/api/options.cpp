// The options' spellings and checks shared by every front end (kernel_align/options.hpp,
// fp32_option in kernel_align/ops.hpp). Each op's public functions are in
// api/ops/<op>.cpp.
#include "kernel_align/ops.hpp"

#include <cmath>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "api/descriptors.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/options.hpp"
#include "kernel_align/registry.hpp"

namespace kernel_align {

float fp32_option(const std::string& argument, double value) {
  if (!std::isfinite(value)) throw Error(argument, "a finite number", std::to_string(value));
  const auto rounded = static_cast<float>(value);
  char text[40];
  std::snprintf(text, sizeof text, "%.9g", value);
  if (std::isinf(rounded)) {
    throw Error(argument, "a number within the fp32 range (magnitude at most 3.40282347e+38)",
                std::string(text) + ", which overflows fp32 to infinity");
  }
  if (rounded == 0.0f && value != 0.0) {
    throw Error(argument,
                "zero or a number of magnitude at least 1.4e-45 (the smallest fp32 subnormal)",
                std::string(text) + ", which underflows fp32 to 0");
  }
  return rounded;
}

// The descriptors' spellings (api/descriptors.cpp), one list for every front end: an
// option's choices in the order of its enum.
namespace {

const detail::OptionSpec& choice_option(OpType op, const char* name) {
  return *detail::descriptor(op).option(name);
}

template <class Enum>
const char* choice_name(OpType op, const char* option, Enum value) {
  return choice_option(op, option).choices.at(static_cast<std::size_t>(value));
}

template <class Enum>
Enum choice_from_name(OpType op, const char* option, std::string_view text,
                      const std::string& argument) {
  const std::span<const char* const> names = choice_option(op, option).choice_names();
  std::string listed;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (text == names[i]) return static_cast<Enum>(i);
    listed += (i == 0 ? "" : ", ") + std::string(names[i]);
  }
  throw Error(argument, "one of " + listed, "'" + std::string(text) + "'");
}

}  // namespace

const char* pairing_name(Pairing p) {
  return choice_name(OpType::MultiAxisRope, "pairing", p);
}
const char* layout_name(Layout l) {
  return choice_name(OpType::MultiAxisRope, "layout", l);
}
const char* norm_mode_name(NormMode m) {
  return choice_name(OpType::QkRmsNorm, "mode", m);
}
const char* activation_name(Activation a) {
  return choice_name(OpType::Linear, "activation", a);
}
const char* latent_transform_name(LatentTransform t) {
  return choice_name(OpType::LatentNormalize, "transform", t);
}

std::vector<std::string> option_choices(OpType op, std::string_view option) {
  const detail::OptionSpec* spec = detail::descriptor(op).option(option);
  if (spec == nullptr) return {};
  const std::span<const char* const> names = spec->choice_names();
  return {names.begin(), names.end()};
}

NormMode norm_mode_from_name(std::string_view text, const std::string& argument) {
  return choice_from_name<NormMode>(OpType::QkRmsNorm, "mode", text, argument);
}
Pairing pairing_from_name(std::string_view text, const std::string& argument) {
  return choice_from_name<Pairing>(OpType::MultiAxisRope, "pairing", text, argument);
}
Layout layout_from_name(std::string_view text, const std::string& argument) {
  return choice_from_name<Layout>(OpType::MultiAxisRope, "layout", text, argument);
}
Activation activation_from_name(std::string_view text, const std::string& argument) {
  return choice_from_name<Activation>(OpType::Linear, "activation", text, argument);
}
LatentTransform latent_transform_from_name(std::string_view text, const std::string& argument) {
  return choice_from_name<LatentTransform>(OpType::LatentNormalize, "transform", text, argument);
}

}  // namespace kernel_align
