// Every rejected call throws kernel_align::Error naming the bad argument, and
// writes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"
#include "support/tensors.hpp"

namespace kernel_align {
namespace {

using test::HostTensor;

template <class Call>
::testing::AssertionResult rejects(const Call& call, const std::string& argument) {
  try {
    call();
  } catch (const Error& e) {
    if (e.argument() == argument) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "named '" << e.argument() << "': " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

// A valid rmsnorm call's buffers: x, y [4, 8] fp32, a weight [8], and a spare
// buffer that outputs are checked against for stray writes.
class RmsNormErrors : public ::testing::Test {
 protected:
  HostTensor x{DType::F32, {4, 8}};
  HostTensor dy{DType::F32, {4, 8}};
  HostTensor y{DType::F32, {4, 8}};
  HostTensor w{DType::F32, {8}};
  HostTensor dw{DType::F32, {8}};
  HostTensor big{DType::F32, {2 * 4096}};

  void SetUp() override {
    for (std::int64_t i = 0; i < 32; ++i) x.set(i, 1.0 + static_cast<double>(i));
    y.fill_bytes(std::byte{0x33});
    dw.fill_bytes(std::byte{0x33});
  }
  void TearDown() override {
    HostTensor untouched(DType::F32, {4, 8});
    untouched.fill_bytes(std::byte{0x33});
    EXPECT_TRUE(y == untouched) << "a rejected call wrote its output";
  }
  void forward(const ConstTensorView& xv, const std::optional<ConstTensorView>& wv,
               const TensorView& yv, float eps = 1e-6f) {
    qk_rmsnorm_forward(xv, wv, yv, {eps});
  }
};

TEST_F(RmsNormErrors, ValidCallsPass) {
  HostTensor out(DType::F32, {4, 8});
  EXPECT_NO_THROW(forward(x.cview(), w.cview(), out.view()));
  HostTensor wide(DType::F32, {1, 4096});
  EXPECT_NO_THROW(
      forward(test::strided(big.cview(), {1, 4096}, {4096, 1}), std::nullopt, wide.view()));
}

TEST_F(RmsNormErrors, WrongRank) {
  EXPECT_TRUE(rejects(
      [&] {
        forward(ConstTensorView::contiguous(x.data(), DType::F32, {}), std::nullopt, y.view());
      },
      "x"));
  EXPECT_TRUE(rejects(
      [&] { forward(x.cview(), std::nullopt, TensorView::contiguous(y.data(), DType::F32, {})); },
      "y"));
  EXPECT_TRUE(rejects(
      [&] {
        forward(x.cview(), ConstTensorView::contiguous(w.data(), DType::F32, {1, 8}), y.view());
      },
      "weight"));
}

TEST_F(RmsNormErrors, HeadDimMustBeEvenAndAtMost4096) {
  EXPECT_TRUE(rejects(
      [&] {
        forward(test::strided(x.cview(), {4, 7}, {8, 1}), std::nullopt,
                test::strided(y.view(), {4, 7}, {8, 1}));
      },
      "x"));
  EXPECT_TRUE(rejects(
      [&] {
        forward(test::strided(big.cview(), {1, 4098}, {4098, 1}), std::nullopt, y.view());
      },
      "x"));
}

TEST_F(RmsNormErrors, WeightLengthMustBeD) {
  EXPECT_TRUE(
      rejects([&] { forward(x.cview(), test::strided(w.cview(), {6}, {1}), y.view()); }, "weight"));
}

TEST_F(RmsNormErrors, OutputShapeMustBeTheInputShape) {
  EXPECT_TRUE(rejects(
      [&] {
        forward(x.cview(), std::nullopt, test::strided(y.view(), {2, 16}, {16, 1}));
      },
      "y"));
  EXPECT_TRUE(rejects(
      [&] {
        forward(x.cview(), std::nullopt, test::strided(y.view(), {1, 4, 8}, {32, 8, 1}));
      },
      "y"));
}

TEST_F(RmsNormErrors, EpsMustBeFiniteAndNonNegative) {
  for (float eps :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), -1e-6f}) {
    EXPECT_TRUE(rejects([&] { forward(x.cview(), std::nullopt, y.view(), eps); }, "eps")) << eps;
  }
}

TEST_F(RmsNormErrors, EmptyTensorsAndNullData) {
  EXPECT_TRUE(rejects(
      [&] {
        forward(test::strided(x.cview(), {0, 8}, {8, 1}), std::nullopt,
                test::strided(y.view(), {0, 8}, {8, 1}));
      },
      "x"));
  // An empty tensor with no data (as torch's are) is told as empty, not as a null pointer.
  ConstTensorView empty_x = test::strided(x.cview(), {0, 8}, {8, 1});
  empty_x.data = nullptr;
  try {
    forward(empty_x, std::nullopt, y.view());
    ADD_FAILURE() << "accepted an empty tensor";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "x");
    EXPECT_EQ(e.expected(), "a non-empty tensor (every dim > 0)") << e.what();
  }
  ConstTensorView null_x = x.cview();
  null_x.data = nullptr;
  EXPECT_TRUE(rejects([&] { forward(null_x, std::nullopt, y.view()); }, "x"));
  ConstTensorView null_w = w.cview();
  null_w.data = nullptr;
  EXPECT_TRUE(rejects([&] { forward(x.cview(), null_w, y.view()); }, "weight"));
}

// Found by fuzzing (ops_fuzz): a view whose element count or last offset does not fit
// int64 overflowed inside the validation (undefined behaviour) instead of being refused.
// And a data pointer off its dtype's alignment would be read misaligned.
TEST_F(RmsNormErrors, ViewsBeyondInt64OffsetsOrMisalignedAreRefused) {
  ConstTensorView huge = test::strided(x.cview(), {4, 8}, {std::int64_t{1} << 60, 1});
  EXPECT_TRUE(rejects([&] { forward(huge, std::nullopt, y.view()); }, "x"));
  ConstTensorView many = x.cview();  // 2^54 rows of 8: 2^57 elements
  many.shape[0] = std::int64_t{1} << 54;
  EXPECT_TRUE(rejects([&] { forward(many, std::nullopt, y.view()); }, "x"));
  ConstTensorView odd = x.cview();
  odd.dtype = DType::BF16;
  odd.data = static_cast<const unsigned char*>(x.data()) + 1;
  EXPECT_TRUE(rejects([&] { forward(odd, std::nullopt, y.view()); }, "x"));
}

TEST_F(RmsNormErrors, OutputMayNotPartlyOverlapAnInput) {
  HostTensor shared(DType::F32, {5, 8});
  const ConstTensorView rows_0_to_3 = test::strided(shared.cview(), {4, 8}, {8, 1});
  TensorView rows_1_to_4 = test::strided(shared.view(), {4, 8}, {8, 1});
  rows_1_to_4.data = static_cast<float*>(shared.data()) + 8;
  EXPECT_TRUE(rejects([&] { forward(rows_0_to_3, std::nullopt, rows_1_to_4); }, "y"));
  // The same data but another dtype is not "in place" either.
  TensorView as_bf16 = TensorView::contiguous(shared.data(), DType::BF16, {4, 8});
  EXPECT_TRUE(rejects([&] { forward(rows_0_to_3, std::nullopt, as_bf16); }, "y"));
  // An output over the weight.
  TensorView over_weight = TensorView::contiguous(w.data(), DType::F32, {1, 8});
  EXPECT_TRUE(rejects(
      [&] {
        forward(test::strided(x.cview(), {1, 8}, {8, 1}), w.cview(), over_weight);
      },
      "y"));
  // An output whose own elements overlap (stride 0).
  EXPECT_TRUE(rejects(
      [&] {
        forward(x.cview(), std::nullopt, test::strided(y.view(), {4, 8}, {0, 1}));
      },
      "y"));
}

TEST_F(RmsNormErrors, BackwardArguments) {
  HostTensor dx(DType::F32, {4, 8});
  const auto backward = [&](const ConstTensorView& dyv, const std::optional<ConstTensorView>& wv,
                            const TensorView& dxv, const std::optional<TensorView>& dwv) {
    qk_rmsnorm_backward(x.cview(), dyv, wv, dxv, dwv, {});
  };
  EXPECT_NO_THROW(backward(dy.cview(), w.cview(), dx.view(), dw.view()));
  dw.fill_bytes(std::byte{0x33});
  const HostTensor dw_before = dw;
  EXPECT_TRUE(rejects(
      [&] {
        backward(test::strided(dy.cview(), {2, 16}, {16, 1}), w.cview(), dx.view(), dw.view());
      },
      "dy"));
  EXPECT_TRUE(rejects(
      [&] {
        backward(dy.cview(), w.cview(), test::strided(y.view(), {4, 6}, {8, 1}), dw.view());
      },
      "dx"));
  EXPECT_TRUE(rejects([&] { backward(dy.cview(), std::nullopt, y.view(), dw.view()); }, "dw"));
  EXPECT_TRUE(rejects(
      [&] { backward(dy.cview(), w.cview(), y.view(), test::strided(dw.view(), {4}, {1})); },
      "dw"));
  // dw over dx, and dx partly over dy.
  HostTensor shared(DType::F32, {5, 8});
  TensorView dw_over_dx = TensorView::contiguous(shared.data(), DType::F32, {8});
  TensorView dx_in_shared = TensorView::contiguous(shared.data(), DType::F32, {4, 8});
  EXPECT_TRUE(rejects([&] { backward(dy.cview(), w.cview(), dx_in_shared, dw_over_dx); }, "dw"));
  TensorView dx_shifted = dx_in_shared;
  dx_shifted.data = static_cast<float*>(shared.data()) + 4;
  EXPECT_TRUE(rejects([&] { backward(dx_in_shared, w.cview(), dx_shifted, std::nullopt); }, "dx"));
  EXPECT_TRUE(dw == dw_before);
}

// A valid rope call's buffers: x, y [1, 6, 4, 8] (BSHD: S = 6, H = 4), tables [6, 4].
class RopeErrors : public ::testing::Test {
 protected:
  HostTensor x{DType::BF16, {1, 6, 4, 8}};
  HostTensor y{DType::BF16, {1, 6, 4, 8}};
  HostTensor cos{DType::F32, {6, 4}};
  HostTensor sin{DType::F32, {6, 4}};

  void SetUp() override { y.fill_bytes(std::byte{0x44}); }
  void TearDown() override {
    HostTensor untouched(DType::BF16, {1, 6, 4, 8});
    untouched.fill_bytes(std::byte{0x44});
    EXPECT_TRUE(y == untouched) << "a rejected call wrote its output";
  }
};

TEST_F(RopeErrors, ValidCallsPass) {
  HostTensor out(DType::BF16, {1, 6, 4, 8});
  EXPECT_NO_THROW(multi_axis_rope_forward(x.cview(), cos.cview(), sin.cview(), out.view(), {}));
  // The same buffer read as BHSD has S = 4: tables of 4 rows.
  HostTensor cos4(DType::F32, {4, 4});
  HostTensor sin4(DType::F32, {4, 4});
  EXPECT_NO_THROW(multi_axis_rope_forward(x.cview(), cos4.cview(), sin4.cview(), out.view(),
                                          {Pairing::Interleaved, Layout::BHSD}));
}

TEST_F(RopeErrors, InputMustBe4DWithAnEvenD) {
  EXPECT_TRUE(rejects(
      [&] {
        multi_axis_rope_forward(test::strided(x.cview(), {6, 4, 8}, {32, 8, 1}), cos.cview(),
                                sin.cview(), y.view(), {});
      },
      "x"));
  EXPECT_TRUE(rejects(
      [&] {
        multi_axis_rope_backward(test::strided(x.cview(), {6, 4, 8}, {32, 8, 1}), cos.cview(),
                                 sin.cview(), y.view(), {});
      },
      "dy"));
  EXPECT_TRUE(rejects(
      [&] {
        multi_axis_rope_forward(test::strided(x.cview(), {1, 6, 4, 7}, {192, 32, 8, 1}),
                                cos.cview(), sin.cview(),
                                test::strided(y.view(), {1, 6, 4, 7}, {192, 32, 8, 1}), {});
      },
      "x"));
  EXPECT_TRUE(rejects(
      [&] {
        multi_axis_rope_forward(x.cview(), cos.cview(), sin.cview(),
                                test::strided(y.view(), {1, 6, 2, 8}, {192, 32, 8, 1}), {});
      },
      "y"));
  EXPECT_TRUE(rejects(
      [&] {
        multi_axis_rope_backward(x.cview(), cos.cview(), sin.cview(),
                                 test::strided(y.view(), {1, 6, 2, 8}, {192, 32, 8, 1}), {});
      },
      "dx"));
}

TEST_F(RopeErrors, TablesMustBeFp32OfShapeSByHalfD) {
  HostTensor wide(DType::F32, {6, 8});
  EXPECT_TRUE(rejects(
      [&] { multi_axis_rope_forward(x.cview(), wide.cview(), sin.cview(), y.view(), {}); }, "cos"));
  EXPECT_TRUE(rejects(
      [&] { multi_axis_rope_forward(x.cview(), cos.cview(), wide.cview(), y.view(), {}); }, "sin"));
  HostTensor bf16_table(DType::BF16, {6, 4});
  EXPECT_TRUE(rejects(
      [&] { multi_axis_rope_forward(x.cview(), bf16_table.cview(), sin.cview(), y.view(), {}); },
      "cos"));
  EXPECT_TRUE(rejects(
      [&] {
        multi_axis_rope_forward(x.cview(), cos.cview(), test::strided(sin.cview(), {24}, {1}),
                                y.view(), {});
      },
      "sin"));
}

// The seed's defect: a [B, S, H, D] tensor read with the sequence in the wrong
// dim. Here the layout says BHSD, so S is dim 2 (4), and 6-row tables are refused.
TEST_F(RopeErrors, TableRowsMustBeTheSequenceLengthOfTheLayout) {
  EXPECT_TRUE(rejects(
      [&] {
        multi_axis_rope_forward(x.cview(), cos.cview(), sin.cview(), y.view(),
                                {Pairing::Interleaved, Layout::BHSD});
      },
      "cos"));
}

TEST_F(RopeErrors, OutputMayNotOverlapAnInputOrTheTables) {
  HostTensor shared(DType::BF16, {2 * 192});
  const ConstTensorView first = test::strided(shared.cview(), {1, 6, 4, 8}, {192, 32, 8, 1});
  TensorView shifted = test::strided(shared.view(), {1, 6, 4, 8}, {192, 32, 8, 1});
  shifted.data = static_cast<std::uint16_t*>(shared.data()) + 8;
  EXPECT_TRUE(
      rejects([&] { multi_axis_rope_forward(first, cos.cview(), sin.cview(), shifted, {}); }, "y"));
  HostTensor table_buffer(DType::F32, {1, 6, 4, 8});
  const ConstTensorView cos_in_buffer = test::strided(table_buffer.cview(), {6, 4}, {4, 1});
  TensorView y_over_cos = table_buffer.view();
  HostTensor x32(DType::F32, {1, 6, 4, 8});
  EXPECT_TRUE(rejects(
      [&] { multi_axis_rope_forward(x32.cview(), cos_in_buffer, sin.cview(), y_over_cos, {}); },
      "y"));
  ConstTensorView null_cos = cos.cview();
  null_cos.data = nullptr;
  EXPECT_TRUE(rejects(
      [&] { multi_axis_rope_forward(x.cview(), null_cos, sin.cview(), y.view(), {}); }, "cos"));
}

// ---- Aliasing is decided by shared bytes, not by byte ranges (issue 34, defect 8) ----

// What validation says of x (an input) and y (an output) given to qk_rmsnorm_forward with
// eps = -1: eps is checked after the aliasing rule, so "eps" means the views were found
// apart and nothing runs either way.
struct Verdict {
  std::string argument;
  std::string message;
};
Verdict verdict(const ConstTensorView& x, const TensorView& y) {
  try {
    qk_rmsnorm_forward(x, std::nullopt, y, {-1.0f});
  } catch (const Error& e) {
    return {e.argument(), e.what()};
  }
  return {"(accepted)", ""};
}

// Whether two views share a byte, by listing every byte of each.
bool share_a_byte(const ConstTensorView& a, const ConstTensorView& b) {
  std::vector<std::uintptr_t> bytes;
  const auto each_byte = [](const ConstTensorView& v, const auto& f) {
    const std::size_t size = dtype_size(v.dtype);
    test::for_each_index(v, [&](std::int64_t, const std::array<std::int64_t, 4>& idx) {
      const auto first = reinterpret_cast<std::uintptr_t>(v.data) +
                         static_cast<std::uintptr_t>(test::view_offset(v, idx)) * size;
      for (std::size_t i = 0; i < size; ++i) f(first + i);
    });
  };
  each_byte(a, [&](std::uintptr_t p) { bytes.push_back(p); });
  std::sort(bytes.begin(), bytes.end());
  bool shared = false;
  each_byte(b, [&](std::uintptr_t p) {
    shared = shared || std::binary_search(bytes.begin(), bytes.end(), p);
  });
  return shared;
}

// Views of one buffer that interleave without a common element pass (the rows' halves,
// every other element, packed q/k/v, an fp32 input with bf16 outputs between its
// elements); any common byte is refused, a partial element included.
TEST(Aliasing, InterleavedViewsPassUnlessTheyShareAByte) {
  HostTensor buffer(DType::F32, {4, 16});
  auto* base = static_cast<unsigned char*>(buffer.data());
  const auto view = [&](DType dtype, std::int64_t byte_offset,
                        std::initializer_list<std::int64_t> shape,
                        std::initializer_list<std::int64_t> strides) {
    TensorView v = TensorView::contiguous(base + byte_offset, dtype, {1});
    return test::strided(v, shape, strides);
  };
  // buf[..., :8] and buf[..., 8:]; buf[..., 0::2] and buf[..., 1::2].
  EXPECT_EQ(
      verdict(view(DType::F32, 0, {4, 8}, {16, 1}), view(DType::F32, 32, {4, 8}, {16, 1})).argument,
      "eps");
  EXPECT_EQ(
      verdict(view(DType::F32, 0, {4, 8}, {16, 2}), view(DType::F32, 4, {4, 8}, {16, 2})).argument,
      "eps");
  // q, k, v of [4, 3, 2, 2]: q and k of one call ([B, S, H, D] layouts in rank 3 here).
  EXPECT_EQ(verdict(view(DType::F32, 0, {4, 2, 2}, {12, 2, 1}),
                    view(DType::F32, 16, {4, 2, 2}, {12, 2, 1}))
                .argument,
            "eps");
  // fp32 elements 8 bytes apart with bf16 outputs in the gaps; then at byte 2, inside one.
  EXPECT_EQ(
      verdict(view(DType::F32, 0, {4, 8}, {16, 2}), view(DType::BF16, 4, {4, 8}, {32, 4})).argument,
      "eps");
  const Verdict partial =
      verdict(view(DType::F32, 0, {4, 8}, {16, 2}), view(DType::BF16, 2, {4, 8}, {32, 4}));
  EXPECT_EQ(partial.argument, "y");
  EXPECT_NE(partial.message.find("found an overlapping view"), std::string::npos)
      << partial.message;
  // Interleaved with one element in common per row: the second halves moved one element
  // left (element 7 of each row is in both); every other element moved by two.
  EXPECT_EQ(
      verdict(view(DType::F32, 0, {4, 8}, {16, 1}), view(DType::F32, 28, {4, 8}, {16, 1})).argument,
      "y");
  EXPECT_EQ(
      verdict(view(DType::F32, 0, {4, 8}, {16, 2}), view(DType::F32, 8, {4, 8}, {16, 2})).argument,
      "y");
}

// The decision against byte lists, over random small views of one buffer (any strides,
// zero included, dtypes and offsets): exact both ways. y exactly x is in place and passes;
// outputs refused for overlapping themselves (a sufficient rule of its own) are left out.
TEST(Aliasing, ExactOnRandomStridedViews) {
  HostTensor buffer(DType::F32, {512});
  auto* base = static_cast<unsigned char*>(buffer.data());
  test::Rng rng(8);
  const auto random_view = [&](int rank, const std::array<std::int64_t, 4>& shape) {
    const DType dtype = static_cast<DType>(rng.below(3));
    const auto size = static_cast<std::int64_t>(dtype_size(dtype));
    TensorView v = TensorView::contiguous(base + size * rng.below(32), dtype, {1});
    v.rank = rank;
    for (int i = 0; i < rank; ++i) {
      v.shape[i] = shape[i];
      v.strides[i] = rng.below(10);
    }
    v.strides[rank - 1] = 1 + rng.below(4);  // rows whose elements are distinct
    return v;
  };
  int apart = 0, sharing = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const int rank = 1 + static_cast<int>(rng.below(3));
    std::array<std::int64_t, 4> shape{};
    for (int i = 0; i < rank; ++i) shape[i] = 1 + rng.below(4);
    shape[rank - 1] = 2 * (1 + rng.below(2));
    const TensorView x = random_view(rank, shape);
    const TensorView y = random_view(rank, shape);
    const Verdict v = verdict(x, y);
    if (v.message.find("whose elements do not overlap") != std::string::npos) continue;
    // Exactly x (in place) passes whatever it shares.
    const bool in_place =
        x.data == y.data && x.dtype == y.dtype && x.shape == y.shape && x.strides == y.strides;
    const bool shared = !in_place && share_a_byte(x, y);
    (shared ? sharing : apart) += 1;
    EXPECT_EQ(v.argument, shared ? "y" : "eps")
        << "x " << describe(x) << ", y " << describe(y) << ": " << v.message;
  }
  // Both answers were exercised many times.
  EXPECT_GT(apart, 500);
  EXPECT_GT(sharing, 500);
}

// An equation the search cannot finish within its bound is refused, saying so, never
// accepted: x's rows 40000 elements apart, y's 40001 apart and 10000 elements on, 20000
// rows each (they share no element: that takes 20000 steps to prove). With 2000 rows of
// 4000 and 4001, the same shape of problem is decided: apart.
TEST(Aliasing, AnOverlapThatCannotBeRuledOutIsRefused) {
  HostTensor buffer(DType::F32, {10002});
  const auto pair = [&](std::int64_t rows, std::int64_t x_step, std::int64_t offset) {
    ConstTensorView x = test::strided(buffer.cview(), {rows, 2}, {x_step, 0});
    TensorView y = test::strided(buffer.view(), {rows, 2}, {x_step + 1, 1});
    y.data = static_cast<float*>(buffer.data()) + offset;
    return verdict(x, y);
  };
  const Verdict hard = pair(20000, 40000, 10000);
  EXPECT_EQ(hard.argument, "y");
  EXPECT_NE(hard.message.find("could not be ruled out"), std::string::npos) << hard.message;
  EXPECT_EQ(pair(2000, 4000, 1000).argument, "eps");
}

}  // namespace
}  // namespace kernel_align
