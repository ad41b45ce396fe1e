// `kernel-align` commands that succeed: their outputs are the library's results on
// the same inputs, byte for byte, and positions follow the model's layout.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cases/shapes.hpp"
#include "cli_harness.hpp"
#include "json.hpp"
#include "kernel_align/contract/version.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/positions.hpp"
#include "kernel_align/tables.hpp"

namespace kernel_align::cli::test {
namespace {

using kernel_align::test::Rng;

std::vector<std::int32_t> int32_values(const NpyArray& array) {
  EXPECT_EQ(array.type, NpyType::I32);
  std::vector<std::int32_t> values(static_cast<std::size_t>(array.numel()));
  std::memcpy(values.data(), array.data.data(), array.data.size());
  return values;
}

std::vector<std::byte> float_bytes(const std::vector<float>& values) {
  std::vector<std::byte> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// The library's positions for `request`, as the bytes of an int32 [S, 3] array.
std::vector<std::byte> library_positions(const PositionRequest& request) {
  const std::vector<Position> positions = build_positions(request);
  std::vector<std::byte> bytes(positions.size() * sizeof(Position));
  std::memcpy(bytes.data(), positions.data(), bytes.size());
  return bytes;
}

ImageGrid grid(std::int64_t height, std::int64_t width, std::optional<std::int32_t> frame = {}) {
  ImageGrid g;
  g.height = height;
  g.width = width;
  g.frame = frame;
  return g;
}

TEST_F(CliTest, HelpListsEveryCommand) {
  for (const char* help : {"--help", "help", "-h"}) {
    const std::string out = run_ok({help});
    std::vector<std::string> commands{"positions", "tables", "run", "shapes"};
    // An apply command per op and direction, named from op_list.hpp ('_' as '-').
    for (const OpType op : kOpTypes) {
      std::string name = op_type_name(op);
      std::replace(name.begin(), name.end(), '_', '-');
      commands.push_back("apply " + name + " ");
      commands.push_back("apply " + name + "-backward ");
    }
    for (const std::string& command : commands) {
      EXPECT_NE(out.find("usage: kernel-align " + command), std::string::npos) << command;
    }
  }
}

TEST_F(CliTest, CommandHelpShowsItsUsage) {
  const std::string out = run_ok({"apply", "multi-axis-rope", "--help"});
  EXPECT_EQ(out.find("usage: kernel-align apply multi-axis-rope --x"), 0u) << out;
  EXPECT_EQ(run_ok({"help", "apply", "multi-axis-rope"}), out);
  EXPECT_NE(run_ok({"tables", "-h"}).find("--theta"), std::string::npos);
}

TEST_F(CliTest, VersionNamesProjectAndContract) {
  const std::string out = run_ok({"--version"});
  EXPECT_NE(out.find(KA_PROJECT_VERSION), std::string::npos) << out;
  EXPECT_NE(out.find(contract::kVersionString), std::string::npos) << out;
}

// `shapes` prints the lists that verify, the benchmark and run use (src/cases/shapes.hpp),
// every field of every shape, for the Python scripts that run the same shapes.
TEST_F(CliTest, ShapesPrintsTheIssueAndQuickShapes) {
  const json::Value document = json::parse(run_ok({"shapes"}));
  for (const auto& [key, shapes] :
       {std::pair{"issue", &cases::issue_shapes()}, std::pair{"quick", &cases::quick_shapes()}}) {
    SCOPED_TRACE(key);
    const json::Value* list = document.find(key);
    ASSERT_NE(list, nullptr);
    ASSERT_EQ(list->items.size(), shapes->size());
    for (std::size_t i = 0; i < shapes->size(); ++i) {
      const cases::Shape& shape = (*shapes)[i];
      const json::Value& entry = list->items[i];
      EXPECT_EQ(entry.find("name")->text, shape.name);
      EXPECT_EQ(entry.find("batch")->text, "1");
      EXPECT_EQ(entry.find("heads")->text, std::to_string(shape.heads));
      EXPECT_EQ(entry.find("head_dim")->text, std::to_string(cases::kHeadDim));
      EXPECT_EQ(entry.find("text_len")->text, std::to_string(shape.text_len));
      const json::Value* images = entry.find("images");
      ASSERT_EQ(images->items.size(), shape.images.size()) << shape.name;
      for (std::size_t k = 0; k < shape.images.size(); ++k) {
        EXPECT_EQ(images->items[k].find("height")->text, std::to_string(shape.images[k].height));
        EXPECT_EQ(images->items[k].find("width")->text, std::to_string(shape.images[k].width));
      }
    }
  }
}

TEST_F(CliTest, DiffusersPositionsOf1328ImageAnd256TextTokens) {
  run_ok({"positions", "--layout", "diffusers", "--image", "1328x1328", "--text-len", "256",
          "--out", "pos.npy"});
  const NpyArray array = read("pos.npy");
  ASSERT_EQ(array.shape, (std::vector<std::int64_t>{7145, 3}));  // 256 + 83 * 83
  const std::vector<std::int32_t> p = int32_values(array);
  const auto row = [&](std::size_t r) {
    return std::vector<std::int32_t>(p.begin() + 3 * r, p.begin() + 3 * r + 3);
  };
  // Text first, at m + j with m = max(83 / 2, 83 / 2) = 41.
  for (std::int32_t j = 0; j < 256; ++j) {
    EXPECT_EQ(row(j), (std::vector<std::int32_t>{41 + j, 41 + j, 41 + j})) << j;
  }
  // Then the image, centred: 83 rows sit at -42 .. 40.
  EXPECT_EQ(row(256), (std::vector<std::int32_t>{0, -42, -42}));
  EXPECT_EQ(row(257), (std::vector<std::int32_t>{0, -42, -41}));
  EXPECT_EQ(row(256 + 83), (std::vector<std::int32_t>{0, -41, -42}));
  EXPECT_EQ(row(7144), (std::vector<std::int32_t>{0, 40, 40}));
}

TEST_F(CliTest, SeedPositionsPutTextOnTheDiagonalThenTheImageFromZero) {
  // 64x32 pixels: 2 rows of 4 tokens.
  run_ok(
      {"positions", "--layout", "seed", "--image", "64x32", "--text-len", "3", "--out", "pos.npy"});
  const NpyArray array = read("pos.npy");
  ASSERT_EQ(array.shape, (std::vector<std::int64_t>{11, 3}));
  EXPECT_EQ(int32_values(array),
            (std::vector<std::int32_t>{0, 0, 0, 1, 1, 1, 2, 2, 2, 0, 0, 0, 0, 0, 1, 0, 0,
                                       2, 0, 0, 3, 0, 1, 0, 0, 1, 1, 0, 1, 2, 0, 1, 3}));
}

TEST_F(CliTest, PositionsOfSeveralFramedImagesAndASliceMatchTheLibrary) {
  run_ok({"positions", "--layout", "diffusers", "--image", "1664x928", "--image", "1024x1024",
          "--frame", "2", "--frame", "7", "--text-len", "77", "--start", "50", "--end", "4200",
          "--out", "pos.npy"});
  PositionRequest request;
  request.layout = PositionLayout::Diffusers;
  request.text_len = 77;
  request.images = {grid(58, 104, 2), grid(64, 64, 7)};
  request.start = 50;
  request.end = 4200;
  const NpyArray array = read("pos.npy");
  EXPECT_EQ(array.shape, (std::vector<std::int64_t>{4150, 3}));
  EXPECT_EQ(array.data, library_positions(request));
}

TEST_F(CliTest, TablesMatchTheLibrary) {
  run_ok({"positions", "--layout", "diffusers", "--image", "1328x1328", "--text-len", "256",
          "--out", "pos.npy"});
  const std::vector<std::int32_t> positions = int32_values(read("pos.npy"));
  struct Case {
    std::vector<std::string> spec_flags;
    RopeTableSpec spec;
  };
  for (const Case& c : {Case{{}, RopeTableSpec{}}, Case{{"--axes", "8,28,28", "--theta", "500.5"},
                                                        RopeTableSpec{{8, 28, 28}, 500.5f}}}) {
    std::vector<std::string> args{"tables",  "--positions", "pos.npy", "--cos",
                                  "cos.npy", "--sin",       "sin.npy"};
    args.insert(args.end(), c.spec_flags.begin(), c.spec_flags.end());
    run_ok(args);
    const RopeTables expected = build_rope_tables(positions.data(), 7145, c.spec);
    for (const auto& [name, values] :
         {std::pair{"cos.npy", &expected.cos}, std::pair{"sin.npy", &expected.sin}}) {
      const NpyArray table = read(name);
      EXPECT_EQ(table.type, NpyType::F32);
      EXPECT_EQ(table.shape, (std::vector<std::int64_t>{7145, expected.columns}));
      EXPECT_EQ(table.data, float_bytes(*values)) << name;
    }
  }
}

struct RmsNormCase {
  DType x;
  std::optional<DType> weight;
  NormMode mode;
  std::optional<DType> out;  // --out-dtype
};

std::vector<std::string> rmsnorm_flags(const RmsNormCase& c) {
  std::vector<std::string> flags{"--eps", "1e-5", "--mode", norm_mode_name(c.mode)};
  if (c.weight) flags.insert(flags.end(), {"--weight", "w.npy"});
  return flags;
}

const RmsNormCase kRmsNormCases[] = {
    {DType::BF16, std::nullopt, NormMode::Single, std::nullopt},
    {DType::BF16, DType::BF16, NormMode::Diffusers, std::nullopt},
    {DType::F16, DType::F16, NormMode::Diffusers, DType::F32},
    {DType::F32, DType::BF16, NormMode::Single, DType::BF16},
    {DType::F32, DType::F32, NormMode::Single, DType::F16},
};

TEST_F(CliTest, QkRmsNormMatchesTheLibrary) {
  const std::vector<std::int64_t> shape{2, 5, 3, 128};
  for (const RmsNormCase& c : kRmsNormCases) {
    SCOPED_TRACE(std::string(dtype_name(c.x)) + " " + norm_mode_name(c.mode));
    Rng rng(21);
    const NpyArray x = random_array(c.x, shape, rng);
    const NpyArray w = random_array(c.weight.value_or(DType::F32), {128}, rng);
    write("x.npy", x);
    write("w.npy", w);
    std::vector<std::string> args{"apply", "qk-rmsnorm", "--x", "x.npy", "--out", "y.npy"};
    const std::vector<std::string> flags = rmsnorm_flags(c);
    args.insert(args.end(), flags.begin(), flags.end());
    if (c.out) args.insert(args.end(), {"--out-dtype", dtype_name(*c.out)});
    run_ok(args);

    const DType out_dtype = c.out.value_or(c.x);
    NpyArray expected = make_npy_array(npy_type_of(out_dtype), shape);
    std::optional<ConstTensorView> weight;
    if (c.weight) weight = test_view<const void*>(w.data.data(), *c.weight, {128});
    qk_rmsnorm_forward(test_view<const void*>(x.data.data(), c.x, shape), weight,
                       test_view<void*>(expected.data.data(), out_dtype, shape), {1e-5f, c.mode});
    const NpyArray y = read("y.npy");
    EXPECT_EQ(y.type, expected.type);
    EXPECT_EQ(y.shape, shape);
    EXPECT_EQ(y.data, expected.data);
  }
}

TEST_F(CliTest, QkRmsNormBackwardMatchesTheLibrary) {
  const std::vector<std::int64_t> shape{7, 2, 64};
  for (const RmsNormCase& c : kRmsNormCases) {
    SCOPED_TRACE(std::string(dtype_name(c.x)) + " " + norm_mode_name(c.mode));
    Rng rng(33);
    const NpyArray x = random_array(c.x, shape, rng);
    const NpyArray dy = random_array(c.x, shape, rng);
    const NpyArray w = random_array(c.weight.value_or(DType::F32), {64}, rng);
    write("x.npy", x);
    write("dy.npy", dy);
    write("w.npy", w);
    std::vector<std::string> args{
        "apply", "qk-rmsnorm-backward", "--x", "x.npy", "--dy", "dy.npy", "--dx", "dx.npy"};
    const std::vector<std::string> flags = rmsnorm_flags(c);
    args.insert(args.end(), flags.begin(), flags.end());
    if (c.weight) args.insert(args.end(), {"--dw", "dw.npy"});
    run_ok(args);

    NpyArray dx = make_npy_array(npy_type_of(c.x), shape);
    NpyArray dw = make_npy_array(npy_type_of(c.weight.value_or(DType::F32)), {64});
    std::optional<ConstTensorView> weight;
    std::optional<TensorView> dw_view;
    if (c.weight) {
      weight = test_view<const void*>(w.data.data(), *c.weight, {64});
      dw_view = test_view<void*>(dw.data.data(), *c.weight, {64});
    }
    qk_rmsnorm_backward(test_view<const void*>(x.data.data(), c.x, shape),
                        test_view<const void*>(dy.data.data(), c.x, shape), weight,
                        test_view<void*>(dx.data.data(), c.x, shape), dw_view, {1e-5f, c.mode});
    const NpyArray dx_file = read("dx.npy");
    EXPECT_EQ(dx_file.type, dx.type);
    EXPECT_EQ(dx_file.data, dx.data);
    EXPECT_EQ(exists("dw.npy"), c.weight.has_value());
    if (c.weight) {
      const NpyArray dw_file = read("dw.npy");
      EXPECT_EQ(dw_file.type, dw.type);
      EXPECT_EQ(dw_file.shape, (std::vector<std::int64_t>{64}));
      EXPECT_EQ(dw_file.data, dw.data);
    }
  }
}

// x [B, S, H, D] or [B, H, S, D] and the positions of its S tokens.
class RopeCliTest : public CliTest {
 protected:
  static constexpr std::int64_t kSeq = 12;

  void SetUp() override {
    CliTest::SetUp();
    // 4 text tokens and a 2x4 grid (64x32 pixels).
    run_ok({"positions", "--layout", "diffusers", "--image", "64x32", "--text-len", "4", "--out",
            "pos.npy"});
    positions_ = int32_values(read("pos.npy"));
    ASSERT_EQ(positions_.size(), static_cast<std::size_t>(3 * kSeq));
    tables_ = build_rope_tables(positions_.data(), kSeq);
    NpyArray cos = make_npy_array(NpyType::F32, {kSeq, 64});
    NpyArray sin = make_npy_array(NpyType::F32, {kSeq, 64});
    cos.data = float_bytes(tables_.cos);
    sin.data = float_bytes(tables_.sin);
    write("cos.npy", cos);
    write("sin.npy", sin);
  }

  std::vector<std::int32_t> positions_;
  RopeTables tables_;
};

TEST_F(RopeCliTest, ForwardAndBackwardMatchTheLibrary) {
  for (const Layout layout : {Layout::BSHD, Layout::BHSD}) {
    for (const Pairing pairing : {Pairing::Half, Pairing::Interleaved}) {
      for (const DType dtype : {DType::BF16, DType::F32, DType::F16}) {
        for (const bool backward : {false, true}) {
          SCOPED_TRACE(std::string(layout_name(layout)) + " " + pairing_name(pairing) + " " +
                       dtype_name(dtype) + (backward ? " backward" : " forward"));
          const std::vector<std::int64_t> shape = layout == Layout::BSHD
                                                      ? std::vector<std::int64_t>{2, kSeq, 3, 128}
                                                      : std::vector<std::int64_t>{2, 3, kSeq, 128};
          Rng rng(45);
          const NpyArray in = random_array(dtype, shape, rng);
          write("in.npy", in);
          NpyArray expected = make_npy_array(npy_type_of(dtype), shape);
          (backward ? multi_axis_rope_backward : multi_axis_rope_forward)(
              test_view<const void*>(in.data.data(), dtype, shape),
              test_view<const void*>(tables_.cos.data(), DType::F32, {kSeq, 64}),
              test_view<const void*>(tables_.sin.data(), DType::F32, {kSeq, 64}),
              test_view<void*>(expected.data.data(), dtype, shape), {pairing, layout}, {});

          const std::vector<std::string> common{
              "apply",
              backward ? "multi-axis-rope-backward" : "multi-axis-rope",
              backward ? "--dy" : "--x",
              "in.npy",
              backward ? "--dx" : "--out",
              "out.npy",
              "--pairing",
              pairing_name(pairing),
              "--layout",
              layout_name(layout)};
          for (const std::vector<std::string>& tables :
               {std::vector<std::string>{"--positions", "pos.npy"},
                std::vector<std::string>{"--cos", "cos.npy", "--sin", "sin.npy"}}) {
            std::vector<std::string> args = common;
            args.insert(args.end(), tables.begin(), tables.end());
            run_ok(args);
            const NpyArray out = read("out.npy");
            EXPECT_EQ(out.type, expected.type) << tables[0];
            EXPECT_EQ(out.shape, shape) << tables[0];
            EXPECT_EQ(out.data, expected.data) << tables[0];
          }
        }
      }
    }
  }
}

TEST_F(RopeCliTest, ForwardThenBackwardReturnsTheInput) {
  const std::vector<std::int64_t> shape{1, kSeq, 2, 128};
  Rng rng(8);
  const NpyArray x = random_array(DType::F32, shape, rng);
  write("x.npy", x);
  run_ok({"apply", "multi-axis-rope", "--x", "x.npy", "--positions", "pos.npy", "--pairing",
          "interleaved", "--layout", "bshd", "--out", "y.npy"});
  run_ok({"apply", "multi-axis-rope-backward", "--dy", "y.npy", "--positions", "pos.npy",
          "--pairing", "interleaved", "--layout", "bshd", "--dx", "x_again.npy"});
  const NpyArray y = read("y.npy");
  const NpyArray back = read("x_again.npy");
  ASSERT_EQ(back.data.size(), x.data.size());
  std::vector<float> xs(static_cast<std::size_t>(x.numel()));
  std::vector<float> ys(xs.size());
  std::vector<float> backs(xs.size());
  std::memcpy(xs.data(), x.data.data(), x.data.size());
  std::memcpy(ys.data(), y.data.data(), y.data.size());
  std::memcpy(backs.data(), back.data.data(), back.data.size());
  std::size_t rotated = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    // The elementwise fp32 tolerance class, for two rotations in a row.
    EXPECT_NEAR(backs[i], xs[i], 2e-5 + 2e-5 * std::fabs(xs[i])) << i;
    rotated += ys[i] != xs[i] ? 1 : 0;
  }
  // The forward did rotate (positions are not all zero), so the round trip means something.
  EXPECT_GT(rotated, xs.size() / 2);
}

// apply linear and linear-backward write the library's bytes, in the dtypes of their
// tensors; a db without a bias, or no gradient asked for, is refused by flag.
TEST_F(CliTest, LinearForwardAndBackwardWriteTheLibrarysBytes) {
  Rng rng(12);
  const NpyArray x = random_array(DType::BF16, {2, 3, 64}, rng);
  const NpyArray w = random_array(DType::BF16, {16, 64}, rng);
  const NpyArray b = random_array(DType::F32, {16}, rng);
  const NpyArray dy = random_array(DType::BF16, {2, 3, 16}, rng);
  for (const auto& [name, array] : {std::pair{"x.npy", &x}, std::pair{"w.npy", &w},
                                    std::pair{"b.npy", &b}, std::pair{"dy.npy", &dy}}) {
    write(name, *array);
  }
  run_ok({"apply", "linear", "--x", "x.npy", "--weight", "w.npy", "--bias", "b.npy", "--activation",
          "silu", "--out", "y.npy"});
  run_ok({"apply", "linear-backward", "--x", "x.npy", "--weight", "w.npy", "--bias", "b.npy",
          "--activation", "silu", "--dy", "dy.npy", "--dx", "dx.npy", "--dw", "dw.npy", "--db",
          "db.npy"});
  NpyArray y = make_npy_array(NpyType::BF16, {2, 3, 16});
  NpyArray dx = make_npy_array(NpyType::BF16, {2, 3, 64});
  NpyArray dw = make_npy_array(NpyType::BF16, {16, 64});
  NpyArray db = make_npy_array(NpyType::F32, {16});
  const auto in = [](const NpyArray& a, DType t) { return test_view(a.data.data(), t, a.shape); };
  const auto out = [](NpyArray& a, DType t) { return test_view(a.data.data(), t, a.shape); };
  const LinearOptions silu{Activation::Silu};
  linear_forward(in(x, DType::BF16), in(w, DType::BF16), in(b, DType::F32), out(y, DType::BF16),
                 silu);
  linear_backward(in(x, DType::BF16), in(w, DType::BF16), in(b, DType::F32), in(dy, DType::BF16),
                  out(dx, DType::BF16), out(dw, DType::BF16), out(db, DType::F32), silu);
  for (const auto& [name, want] : {std::pair{"y.npy", &y}, std::pair{"dx.npy", &dx},
                                   std::pair{"dw.npy", &dw}, std::pair{"db.npy", &db}}) {
    const NpyArray got = read(name);
    EXPECT_EQ(got.shape, want->shape) << name;
    EXPECT_EQ(got.data, want->data) << name;
  }
  expect_bad_argument({"apply", "linear-backward", "--x", "x.npy", "--weight", "w.npy", "--dy",
                       "dy.npy", "--db", "db2.npy"},
                      "--db");
  expect_bad_argument(
      {"apply", "linear-backward", "--x", "x.npy", "--weight", "w.npy", "--dy", "dy.npy"}, "--dx");
  expect_bad_argument({"apply", "linear", "--x", "x.npy", "--weight", "dy.npy", "--out", "y2.npy"},
                      "--weight");
  // The choices come from the op's descriptor, named in the message.
  const CliResult bad = run({"apply", "linear", "--x", "x.npy", "--weight", "w.npy", "--activation",
                             "gelu", "--out", "y2.npy"});
  EXPECT_EQ(bad.err,
            "kernel-align: error: argument '--activation': expected one of none, gelu_tanh, silu, "
            "found 'gelu'\n");
  expect_bad_argument({"apply", "linear", "--x", "x.npy", "--weight", "w.npy", "--activation",
                       "gelu", "--out", "y2.npy"},
                      "--activation");
}

// apply attention and attention-backward write the library's bytes with a bool mask read
// from a '|b1' .npy; a mask of floats is refused by flag.
TEST_F(CliTest, AttentionForwardAndBackwardWriteTheLibrarysBytes) {
  Rng rng(13);
  const std::vector<std::int64_t> shape{2, 7, 2, 16};
  const NpyArray q = random_array(DType::F32, shape, rng);
  const NpyArray k = random_array(DType::BF16, shape, rng);
  const NpyArray v = random_array(DType::F32, shape, rng);
  const NpyArray dout = random_array(DType::F32, shape, rng);
  NpyArray mask = make_npy_array(NpyType::Bool, {2, 7});
  for (std::size_t i = 0; i < mask.data.size(); ++i) {
    mask.data[i] = std::byte{i % 7 < 5 || i < 7 ? std::uint8_t{1} : std::uint8_t{0}};
  }
  for (const auto& [name, array] :
       {std::pair{"q.npy", &q}, std::pair{"k.npy", &k}, std::pair{"v.npy", &v},
        std::pair{"dout.npy", &dout}, std::pair{"mask.npy", static_cast<const NpyArray*>(&mask)}}) {
    write(name, *array);
  }
  run_ok({"apply", "attention", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--mask",
          "mask.npy", "--out", "out.npy"});
  run_ok({"apply",  "attention-backward",
          "--q",    "q.npy",
          "--k",    "k.npy",
          "--v",    "v.npy",
          "--mask", "mask.npy",
          "--out",  "out.npy",
          "--dout", "dout.npy",
          "--dq",   "dq.npy",
          "--dk",   "dk.npy",
          "--dv",   "dv.npy"});
  NpyArray out = make_npy_array(NpyType::F32, shape);
  NpyArray dq = make_npy_array(NpyType::F32, shape);
  NpyArray dk = make_npy_array(NpyType::BF16, shape);
  NpyArray dv = make_npy_array(NpyType::F32, shape);
  const auto in = [](const NpyArray& a, DType t) { return test_view(a.data.data(), t, a.shape); };
  const auto mut = [](NpyArray& a, DType t) { return test_view(a.data.data(), t, a.shape); };
  const ConstTensorView mask_view = in(mask, DType::Bool);
  attention_forward(in(q, DType::F32), in(k, DType::BF16), in(v, DType::F32), mask_view,
                    mut(out, DType::F32));
  attention_backward(in(q, DType::F32), in(k, DType::BF16), in(v, DType::F32), mask_view,
                     in(out, DType::F32), in(dout, DType::F32), mut(dq, DType::F32),
                     mut(dk, DType::BF16), mut(dv, DType::F32));
  for (const auto& [name, want] : {std::pair{"out.npy", &out}, std::pair{"dq.npy", &dq},
                                   std::pair{"dk.npy", &dk}, std::pair{"dv.npy", &dv}}) {
    const NpyArray got = read(name);
    EXPECT_EQ(got.shape, want->shape) << name;
    EXPECT_EQ(got.data, want->data) << name;
  }
  expect_bad_argument({"apply", "attention", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy",
                       "--mask", "dout.npy", "--out", "out2.npy"},
                      "--mask");
  expect_bad_argument({"apply", "attention", "--q", "q.npy", "--k", "mask.npy", "--v", "v.npy",
                       "--out", "out2.npy"},
                      "--k");
  expect_bad_argument({"apply", "attention", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy",
                       "--layout", "sbhd", "--out", "out2.npy"},
                      "--layout");
}

}  // namespace
}  // namespace kernel_align::cli::test
