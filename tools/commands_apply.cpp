// kernel-align apply <op> / <op>-backward for every op of op_list.hpp, derived from its
// descriptor (api/descriptors.hpp): a flag per tensor (--name, '_' as '-'; the output of
// a forward with one output is --out) and per option, the outputs allocated by their
// signature's shape rule, the call made by the op's OpCall (tools/ops/<op>.cpp). An op's
// cos and sin may instead be built from --positions, as the `tables` command builds them.
#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kernel_align/ops.hpp"
#include "op_calls.hpp"
#include "output_files.hpp"
#include "table_args.hpp"
#include "tensor_io.hpp"

namespace kernel_align::cli {
namespace {

using detail::OptionKind;
using detail::OptionSpec;
using detail::Signature;
using detail::TensorKind;
using detail::TensorRole;
using detail::TensorSpec;

std::string dashed(std::string_view name) {
  std::string s(name);
  std::replace(s.begin(), s.end(), '_', '-');
  return s;
}

// A flag's name lives as long as the commands (FlagSpec holds a view of it).
std::string_view stable(std::string text) {
  static std::set<std::string, std::less<>> names;
  return *names.insert(std::move(text)).first;
}

// How one direction of one op reads its flags.
struct ApplyPlan {
  OpType op = OpType::QkRmsNorm;
  Direction direction = Direction::Forward;

  const Signature& signature() const { return detail::descriptor(op).signature(direction); }
  std::span<const OptionSpec> options() const { return detail::descriptor(op).options(); }

  int output_count() const {
    const auto tensors = signature().tensors();
    return static_cast<int>(std::count_if(tensors.begin(), tensors.end(), [](const TensorSpec& t) {
      return t.role == TensorRole::Output;
    }));
  }
  std::string flag(const TensorSpec& t) const {
    if (direction == Direction::Forward && t.role == TensorRole::Output && output_count() == 1) {
      return "--out";
    }
    return "--" + dashed(t.name);
  }
  const TensorSpec& tensor(std::string_view name) const {
    return signature().list[static_cast<std::size_t>(signature().index(name))];
  }
  // Whether cos and sin may come from --positions.
  bool takes_tables() const {
    return signature().index("cos") >= 0 && signature().index("sin") >= 0;
  }
};

std::string command_name(const ApplyPlan& plan) {
  return std::string("apply ") + dashed(op_type_name(plan.op)) +
         (plan.direction == Direction::Backward ? "-backward" : "");
}

// "[word]". (Appended, not "[" + word: g++ 12's -Wrestrict misfires on the latter.)
std::string bracketed(const std::string& word) {
  std::string s(1, '[');
  s.append(word).push_back(']');
  return s;
}

std::string option_usage(const ApplyPlan& plan, const OptionSpec& o) {
  std::string value = o.kind == OptionKind::Choice  ? choices_usage(plan.op, o.name)
                      : o.kind == OptionKind::Float ? "F"
                                                    : "N";
  return bracketed("--" + dashed(o.name) + " " + value);
}

std::string synopsis(const ApplyPlan& plan) {
  std::vector<std::string> words;
  for (const TensorSpec& t : plan.signature().tensors()) {
    if (t.role != TensorRole::Input) continue;
    if (plan.takes_tables() && std::string_view(t.name) == "sin") continue;
    std::string word = plan.flag(t) + " " + t.name + ".npy";
    if (plan.takes_tables() && std::string_view(t.name) == "cos") {
      word =
          "(--positions pos.npy [--axes 16,56,56] [--theta 10000] | --cos cos.npy --sin sin.npy)";
    }
    words.push_back(t.optional ? bracketed(word) : word);
  }
  for (const OptionSpec& o : plan.options()) words.push_back(option_usage(plan, o));
  for (const TensorSpec& t : plan.signature().tensors()) {
    if (t.role != TensorRole::Output) continue;
    if (t.dtype_free) words.push_back(bracketed(plan.flag(t) + "-dtype fp32|bf16|fp16"));
    const std::string word = plan.flag(t) + " " + t.name + ".npy";
    words.push_back(t.optional ? bracketed(word) : word);
  }
  std::string line;
  for (const std::string& w : words) line += (line.empty() ? "" : " ") + w;
  return line;
}

std::vector<FlagSpec> flags(const ApplyPlan& plan) {
  std::vector<FlagSpec> flags;
  for (const TensorSpec& t : plan.signature().tensors()) {
    flags.push_back(file_flag(stable(plan.flag(t))));
    if (t.dtype_free) flags.push_back({stable(plan.flag(t) + "-dtype")});
  }
  for (const OptionSpec& o : plan.options()) flags.push_back({stable("--" + dashed(o.name))});
  if (plan.takes_tables()) {
    flags.insert(flags.end(), kPositionTableFlags.begin(), kPositionTableFlags.end());
  }
  return flags;
}

// The value of the option's flag, checked as the descriptor declares it.
detail::OptionValue parse_option(const ApplyPlan& plan, const OptionSpec& o,
                                 const std::string& flag, const std::string& text) {
  switch (o.kind) {
    case OptionKind::Choice: {
      std::string names;
      for (const char* name : o.choice_names()) {
        if (text == name) return {.name = o.name, .kind = o.kind, .choice = name};
        names += (names.empty() ? "" : ", ") + std::string(name);
      }
      throw Error(flag, "one of " + names, single_quoted(text));
    }
    case OptionKind::Float:
      return {.name = o.name, .kind = o.kind, .number = parse_finite_float(flag, text)};
    case OptionKind::Integer:
      return {.name = o.name, .kind = o.kind, .integer = parse_int<std::int64_t>(flag, text)};
  }
  throw std::logic_error(std::string("an option kind of ") + op_type_name(plan.op));
}

// Tables built from --positions must fit the first input; the library would blame
// 'cos', which the user never named.
void check_tables_fit(const CosSin& tables, const NpyArray& input, const std::string& flag,
                      const std::optional<std::string>& layout) {
  if (input.shape.size() != 4) return;  // the library names the input's rank
  const std::int64_t d = input.shape[3];
  if (tables.cos.shape[1] * 2 != d) {
    throw Error("--axes",
                "axes summing to D = " + std::to_string(d) + " (the last dim of " + flag + ")",
                "a sum of " + std::to_string(tables.cos.shape[1] * 2));
  }
  const bool bhsd = layout && *layout == "bhsd";
  const std::int64_t seq = input.shape[bhsd ? 2 : 1];
  if (tables.cos.shape[0] != seq) {
    throw Error("--positions",
                std::to_string(seq) + " rows (S of " + flag + " in layout " +
                    (bhsd ? "bhsd" : "bshd") + ")",
                std::to_string(tables.cos.shape[0]));
  }
}

void run_apply(const ApplyPlan& plan, const Args& args) {
  const Signature& signature = plan.signature();
  const auto tensors = signature.tensors();
  std::vector<std::optional<NpyArray>> arrays(tensors.size());
  std::vector<std::string> output_paths(tensors.size());
  bool any_output = false;
  // The outputs' flags first: a missing one is reported before any file is read.
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& t = tensors[i];
    if (t.role != TensorRole::Output) continue;
    if (!t.optional) {
      output_paths[i] = args.required(plan.flag(t));
    } else if (const auto path = args.optional(plan.flag(t))) {
      output_paths[i] = *path;
    }
    any_output = any_output || !output_paths[i].empty();
  }
  if (!any_output) {  // every output is optional, and none was asked for
    std::vector<std::string> flags;
    for (const TensorSpec& t : tensors) {
      if (t.role == TensorRole::Output) flags.push_back(plan.flag(t));
    }
    std::string list;
    for (const std::string& f : flags) list += (list.empty() ? "" : ", ") + f;
    throw Error(flags.front(), "at least one of " + list, "none of them");
  }

  std::optional<CosSin> tables;
  if (plan.takes_tables() && args.has("--positions")) {
    for (const char* flag : {"--cos", "--sin"}) {
      if (args.has(flag)) {
        throw Error(flag, "either --positions or --cos and --sin",
                    "both --positions and " + std::string(flag));
      }
    }
    tables = tables_from_positions(args);
  } else if (plan.takes_tables()) {
    for (const char* flag : {"--axes", "--theta"}) {
      if (args.has(flag)) throw Error(flag, "--positions, which it configures", "--cos and --sin");
    }
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& t = tensors[i];
    if (t.role != TensorRole::Input) continue;
    const std::string flag = plan.flag(t);
    const std::string_view name = t.name;
    if (tables && (name == "cos" || name == "sin")) {
      arrays[i] = name == "cos" ? tables->cos : tables->sin;
    } else if (t.kind == TensorKind::Mask) {
      arrays[i] = read_optional_mask_input(args, flag);
    } else if (t.optional) {
      arrays[i] = read_optional_float_input(args, flag);
    } else {
      arrays[i] = read_float_input(args, flag);
    }
  }
  if (tables) {
    check_tables_fit(*tables, *arrays.front(), plan.flag(tensors.front()),
                     args.optional("--layout"));
  }

  OpCallArgs call(plan.op, plan.direction);
  FlagNames names;
  for (const OptionSpec& o : plan.options()) {
    const std::string flag = "--" + dashed(o.name);
    names.emplace(o.name, flag);
    if (const auto text = args.optional(flag)) call.set_option(parse_option(plan, o, flag, *text));
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& t = tensors[i];
    names.emplace(t.name, plan.flag(t));
    names.emplace(t.error_name(), plan.flag(t));
    if (t.role == TensorRole::Input) {
      if (arrays[i]) call.set_input(t.name, const_view(*arrays[i]));
      continue;
    }
    if (output_paths[i].empty()) continue;
    const int like_index = signature.index(t.like);
    const std::optional<NpyArray>& like = arrays[static_cast<std::size_t>(like_index)];
    if (!like) {
      const std::string like_flag = plan.flag(plan.tensor(t.like));
      throw Error(plan.flag(t),
                  like_flag + " as well (" + t.name + " has the shape of " + t.like + ")",
                  "no " + like_flag);
    }
    std::int64_t rows = 0;
    if (t.rows_of != nullptr) {
      const NpyArray& of = *arrays[static_cast<std::size_t>(signature.index(t.rows_of))];
      rows = of.shape.empty() ? 0 : of.shape.front();
    }
    const DType like_dtype = float_dtype(*like, plan.flag(plan.tensor(t.like)));
    OutputLayout layout;
    call_library(names, [&] { layout = output_layout(t, like->shape, like_dtype, rows, call); });
    if (t.dtype_free) {
      if (const auto text = args.optional(plan.flag(t) + "-dtype")) {
        layout.dtype = parse_dtype(plan.flag(t) + "-dtype", *text);
      }
    }
    arrays[i] = make_npy_array(npy_type_of(layout.dtype), std::move(layout.shape));
    call.set_output(t.name, mutable_view(*arrays[i]));
  }
  call_library(names, [&] { op_call(plan.op).call(call); });

  std::vector<OutputFile> outputs;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (output_paths[i].empty()) continue;
    outputs.push_back({plan.flag(tensors[i]), output_paths[i], encode_npy(*arrays[i])});
  }
  write_outputs(outputs);
}

}  // namespace

std::vector<Command> apply_commands() {
  std::vector<Command> commands;
  for (const OpType op : kOpTypes) {
    for (const Direction direction : kDirections) {
      const ApplyPlan plan{op, direction};
      commands.push_back({command_name(plan), synopsis(plan),
                          direction == Direction::Forward ? op_call(op).forward_summary
                                                          : op_call(op).backward_summary,
                          flags(plan), [plan](const Args& args) { run_apply(plan, args); }});
    }
  }
  return commands;
}

}  // namespace kernel_align::cli
