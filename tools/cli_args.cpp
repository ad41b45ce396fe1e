#include "cli_args.hpp"

#include <cmath>

#include "kernel_align/ops.hpp"

namespace kernel_align::cli {

std::string choices_usage(OpType op, std::string_view option) {
  std::string usage;
  for (const std::string& name : option_choices(op, option)) {
    usage += (usage.empty() ? "" : "|") + name;
  }
  return usage;
}
namespace {

const FlagSpec* find_flag(std::span<const FlagSpec> flags, std::string_view name) {
  for (const FlagSpec& f : flags) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string flag_names(std::span<const FlagSpec> flags) {
  std::string names;
  for (const FlagSpec& f : flags) names += (names.empty() ? "" : ", ") + std::string(f.name);
  return names;
}

// What a command expects in place of a token that is not one of its flags; a command
// without flags says that it takes none (an empty list of names would say nothing).
std::string expected_flag(std::span<const FlagSpec> flags) {
  if (flags.empty()) return "nothing after the command (it takes no flags)";
  return "one of the flags " + flag_names(flags);
}

}  // namespace

Args::Args(std::span<const std::string> tokens, std::span<const FlagSpec> flags) {
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::string& token = tokens[i];
    if (!token.starts_with("--")) {
      throw Error(token, expected_flag(flags), "a bare value");
    }
    const std::size_t equals = token.find('=');
    const std::string name = token.substr(0, equals);
    const FlagSpec* spec = find_flag(flags, name);
    if (spec == nullptr) {
      throw Error(name, expected_flag(flags), "an unknown flag");
    }
    std::string value;
    if (equals != std::string::npos) {
      value = token.substr(equals + 1);
    } else if (i + 1 < tokens.size() && !tokens[i + 1].starts_with("--")) {
      value = tokens[++i];
    } else {
      throw Error(name, "a value after it",
                  i + 1 < tokens.size() ? "the flag " + single_quoted(tokens[i + 1]) : "the end");
    }
    std::vector<std::string>& values = values_[name];
    if (!values.empty() && !spec->repeatable) {
      throw Error(name, "a single value", "a second one, " + single_quoted(value));
    }
    if (spec->file && values.empty()) file_flags_.push_back(name);
    values.push_back(std::move(value));
  }
}

const std::string& Args::required(std::string_view flag) const {
  const auto it = values_.find(flag);
  if (it == values_.end()) throw Error(std::string(flag), "a value (required flag)", "none");
  return it->second.front();
}

std::optional<std::string> Args::optional(std::string_view flag) const {
  const auto it = values_.find(flag);
  if (it == values_.end()) return std::nullopt;
  return it->second.front();
}

std::vector<std::string> Args::all(std::string_view flag) const {
  const auto it = values_.find(flag);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

std::vector<std::pair<std::string, std::string>> Args::file_paths() const {
  std::vector<std::pair<std::string, std::string>> paths;
  for (const std::string& flag : file_flags_) {
    for (const std::string& path : values_.find(flag)->second) paths.emplace_back(flag, path);
  }
  return paths;
}

std::vector<FlagSpec> Args::flags(std::span<const FlagSpec> base,
                                  std::initializer_list<FlagSpec> extra) {
  std::vector<FlagSpec> all(base.begin(), base.end());
  all.insert(all.end(), extra.begin(), extra.end());
  return all;
}

float parse_finite_float(std::string_view flag, std::string_view text) {
  double value = 0.0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc::result_out_of_range && ptr == end) {
    throw Error(std::string(flag), "a number within the fp32 range",
                single_quoted(text) + ", which is beyond even fp64's");
  }
  if (ec != std::errc() || ptr != end) {
    throw Error(std::string(flag), "a finite number", single_quoted(text));
  }
  return fp32_option(std::string(flag), value);
}

std::vector<int> parse_int_list(std::string_view flag, std::string_view text) {
  std::vector<int> values;
  std::size_t begin = 0;
  while (true) {
    const std::size_t comma = text.find(',', begin);
    int value = 0;
    if (!parse_whole(text.substr(begin, comma - begin), value)) {
      throw Error(std::string(flag), "comma-separated integers (e.g. 16,56,56)",
                  single_quoted(text));
    }
    values.push_back(value);
    if (comma == std::string_view::npos) return values;
    begin = comma + 1;
  }
}

}  // namespace kernel_align::cli
