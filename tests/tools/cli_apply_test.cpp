// Every op's `apply` command, derived from its descriptor, writes the bytes the library
// computes: for each op and direction, verify's inputs (tools/ops/<op>.cpp) are written
// as .npy files, handed to the command under the flags the signature names, and its
// outputs compared with verify's own call of the op (verify_cases::compute).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "api/descriptors.hpp"
#include "cases/configs.hpp"
#include "cases/inputs.hpp"
#include "cases/shapes.hpp"
#include "cli_harness.hpp"
#include "kernel_align/registry.hpp"
#include "tensor_io.hpp"
#include "verify_cases.hpp"

namespace kernel_align::cli::test {
namespace {

using detail::TensorRole;
using detail::TensorSpec;

const verify_cases::OpCases& cases_of(OpType op) {
  static const std::vector<verify_cases::OpCases> all{
#define KERNEL_ALIGN_OP_CASES(Enumerator, name) verify_cases::name##_cases(),
      KERNEL_ALIGN_OPS(KERNEL_ALIGN_OP_CASES)
#undef KERNEL_ALIGN_OP_CASES
  };
  return all[static_cast<std::size_t>(op)];
}

std::string dashed(std::string text) {
  std::replace(text.begin(), text.end(), '_', '-');
  return text;
}

NpyArray fp32_table(const RopeTables& t, const std::vector<float>& values) {
  NpyArray a = make_npy_array(NpyType::F32, {t.rows, t.columns});
  std::memcpy(a.data.data(), values.data(), a.data.size());
  return a;
}

// The first configuration of each (op, direction) in bf16 (a dtype whose rounding a
// wrong output dtype would show), options as verify sets them.
TEST_F(CliTest, EveryOpsApplyCommandWritesTheLibrarysBytes) {
  const cases::Shape& shape = cases::quick_shapes().front();
  const cases::ShapeTables tables = cases::shape_tables(shape);
  write("cos.npy", fp32_table(tables.tables, tables.tables.cos));
  write("sin.npy", fp32_table(tables.tables, tables.tables.sin));
  std::vector<cases::Config> configs;
  for (const cases::Config& c : cases::all_configs()) {
    const bool seen = std::any_of(configs.begin(), configs.end(), [&](const cases::Config& s) {
      return s.op == c.op && s.direction == c.direction;
    });
    if (!seen && c.dtype == DType::BF16) configs.push_back(c);
  }
  ASSERT_EQ(configs.size(), static_cast<std::size_t>(2 * kOpCount));
  cases::Random random(7);
  for (const cases::Config& config : configs) {
    SCOPED_TRACE(cases::config_words(config));
    verify_cases::Case c;
    c.config = &config;
    c.shape = &shape;
    c.tables = &tables;
    c.inputs = cases_of(config.op).inputs(config, tables, shape.heads);
    c.options = cases_of(config.op).options;
    const detail::Signature& signature = detail::descriptor(config.op).signature(config.direction);
    const bool forward = config.direction == Direction::Forward;
    const auto outputs_of = [&] {
      return std::count_if(signature.tensors().begin(), signature.tensors().end(),
                           [](const TensorSpec& t) { return t.role == TensorRole::Output; });
    };
    const auto flag = [&](const TensorSpec& t) {
      return forward && t.role == TensorRole::Output && outputs_of() == 1 ? std::string("--out")
                                                                          : "--" + dashed(t.name);
    };
    std::vector<std::string> args{"apply",
                                  dashed(op_type_name(config.op)) + (forward ? "" : "-backward")};
    for (const verify_cases::InputShape& in : c.inputs) {
      const DType dtype = in.fp32 ? DType::F32 : DType::BF16;
      NpyArray& a = c.arrays.emplace_back(make_npy_array(npy_type_of(dtype), in.shape));
      cases::fill_uniform(random, dtype, a.data, in.batched ? -4.0f : 0.5f, 1.0f);
      write(std::string(in.name) + ".npy", a);
      args.insert(args.end(),
                  {flag(signature.list[signature.index(in.name)]), std::string(in.name) + ".npy"});
    }
    if (signature.index("cos") >= 0)
      args.insert(args.end(), {"--cos", "cos.npy", "--sin", "sin.npy"});
    for (const detail::OptionValue& o : c.options) {
      char number[32];
      std::snprintf(number, sizeof number, "%.9g", static_cast<double>(o.number));
      args.insert(args.end(), {"--" + dashed(o.name),
                               o.kind == detail::OptionKind::Float     ? std::string(number)
                               : o.kind == detail::OptionKind::Integer ? std::to_string(o.integer)
                                                                       : std::string(o.choice)});
    }
    if (config.mode) args.insert(args.end(), {"--mode", norm_mode_name(*config.mode)});
    if (config.pairing) args.insert(args.end(), {"--pairing", pairing_name(*config.pairing)});
    if (config.layout) args.insert(args.end(), {"--layout", layout_name(*config.layout)});
    if (config.activation) {
      args.insert(args.end(), {"--activation", activation_name(*config.activation)});
    }
    if (config.transform) {
      args.insert(args.end(), {"--transform", latent_transform_name(*config.transform)});
    }
    if (detail::descriptor(config.op).option("text_len") != nullptr) {
      args.insert(args.end(), {"--text-len", std::to_string(shape.text_len)});
    }
    verify_cases::Outputs expected;
    verify_cases::compute(c, true, expected);
    ASSERT_FALSE(expected.empty());
    for (const verify_cases::Output& o : expected) {
      args.insert(args.end(),
                  {flag(signature.list[signature.index(o.name)]), "out_" + o.name + ".npy"});
    }
    run_ok(args);
    for (const verify_cases::Output& o : expected) {
      const NpyArray found = read("out_" + o.name + ".npy");
      EXPECT_EQ(found.type, o.array.type) << o.name;
      EXPECT_EQ(found.shape, o.array.shape) << o.name;
      EXPECT_TRUE(found.data == o.array.data) << o.name << ": other bytes";
    }
  }
}

}  // namespace
}  // namespace kernel_align::cli::test
