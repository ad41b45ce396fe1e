#include <gtest/gtest.h>

#include <cstdint>

#include "kernel_align/tensor.hpp"

namespace kernel_align {
namespace {

TEST(TensorView, ContiguousIsRowMajor) {
  float buffer[1] = {};
  const TensorView v = TensorView::contiguous(buffer, DType::F32, {2, 3, 4, 5});
  EXPECT_EQ(v.data, buffer);
  EXPECT_EQ(v.dtype, DType::F32);
  EXPECT_EQ(v.rank, 4);
  EXPECT_EQ(v.shape, (std::array<std::int64_t, 4>{2, 3, 4, 5}));
  EXPECT_EQ(v.strides, (std::array<std::int64_t, 4>{60, 20, 5, 1}));
  EXPECT_EQ(v.numel(), 120);
}

TEST(TensorView, NegativeDimsCountFromTheEnd) {
  const ConstTensorView v = ConstTensorView::contiguous(nullptr, DType::BF16, {7, 24, 128});
  EXPECT_EQ(v.size(-1), 128);
  EXPECT_EQ(v.size(0), 7);
  EXPECT_EQ(v.size(-3), 7);
  EXPECT_EQ(v.stride(-1), 1);
  EXPECT_EQ(v.stride(-2), 128);
  EXPECT_EQ(v.stride(0), 3072);
}

TEST(TensorView, NumelCountsEveryDimIncludingZeros) {
  EXPECT_EQ(ConstTensorView::contiguous(nullptr, DType::F16, {}).numel(), 1);  // a scalar
  EXPECT_EQ(ConstTensorView::contiguous(nullptr, DType::F16, {3, 0, 5}).numel(), 0);
  EXPECT_EQ(ConstTensorView::contiguous(nullptr, DType::F16, {1, 7145, 24, 128}).numel(), 21949440);
}

TEST(TensorView, MutableViewConvertsToReadOnly) {
  std::uint16_t buffer[6] = {};
  TensorView v = TensorView::contiguous(buffer, DType::F16, {2, 3});
  v.strides = {1, 2};  // a transposed view
  const ConstTensorView c = v;
  EXPECT_EQ(c.data, static_cast<const void*>(buffer));
  EXPECT_EQ(c.dtype, DType::F16);
  EXPECT_EQ(c.rank, 2);
  EXPECT_EQ(c.shape, v.shape);
  EXPECT_EQ(c.strides, v.strides);
}

TEST(TensorView, DescribeNamesShapeDtypeAndStrides) {
  const ConstTensorView v = ConstTensorView::contiguous(nullptr, DType::BF16, {1, 7145, 24, 128});
  EXPECT_EQ(describe(v), "[1, 7145, 24, 128] bf16 strides [21949440, 3072, 128, 1]");
  EXPECT_EQ(shape_string(v), "[1, 7145, 24, 128]");
  ConstTensorView permuted = v;
  permuted.shape = {1, 24, 7145, 128};
  permuted.strides = {21949440, 128, 3072, 1};
  permuted.dtype = DType::F16;
  EXPECT_EQ(describe(permuted), "[1, 24, 7145, 128] fp16 strides [21949440, 128, 3072, 1]");
  EXPECT_EQ(describe(ConstTensorView::contiguous(nullptr, DType::F32, {64})),
            "[64] fp32 strides [1]");
  EXPECT_EQ(describe(ConstTensorView::contiguous(nullptr, DType::F32, {})), "[] fp32 strides []");
}

}  // namespace
}  // namespace kernel_align
