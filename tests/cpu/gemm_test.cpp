// The CPU GEMM engine (cpu/gemm/) against the reference, byte for byte: every ISA path
// this CPU has, 1 and 2 threads, fp32/bf16/fp16 inputs and outputs, bias or none, each
// activation, edge tiles, forward (b = w^T) and dx (b row-major) strides, padded rows,
// NaN and Inf inputs; and a row computed alone gives its bytes in the big call.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "api/gemm_problem.hpp"
#include "cpu/gemm/gemm.hpp"
#include "kernel_align/contract/convert.hpp"
#include "reference/gemm.hpp"

namespace kernel_align {
namespace {

using contract::Activation;

// A matrix of `rows` x `cols` (plus `pad` elements per row) of one dtype, held as bytes.
struct Matrix {
  DType dtype;
  std::int64_t rows, cols, stride;
  std::vector<std::uint8_t> bytes;

  Matrix(DType t, std::int64_t r, std::int64_t c, std::int64_t pad, std::mt19937& rng)
      : dtype(t),
        rows(r),
        cols(c),
        stride(c + pad),
        bytes(static_cast<std::size_t>(r * (c + pad)) * dtype_size(t)) {
    std::normal_distribution<float> normal;
    for (std::int64_t i = 0; i < r * stride; ++i) set(i, normal(rng));
  }
  void set(std::int64_t index, float v) {
    if (dtype == DType::F32) {
      std::memcpy(bytes.data() + index * 4, &v, 4);
    } else {
      const std::uint16_t h = contract::stored_bits16(dtype, v);
      std::memcpy(bytes.data() + index * 2, &h, 2);
    }
  }
  const void* data() const { return bytes.data(); }
};

struct Shape {
  std::int64_t m, n, r;
};

struct Variant {
  DType a_dtype = DType::F32, b_dtype = DType::F32, c_dtype = DType::F32;
  bool bias = false;
  Activation activation = Activation::None;
  bool forward = true;  // b = w^T (w row-major n x r); else b row-major r x n
  std::int64_t pad = 0;
  bool specials = false;  // NaN and Inf among the inputs
};

std::vector<Isa> isas() {
  std::vector<Isa> v{Isa::Portable};
  if (best_isa() >= Isa::Avx2) v.push_back(Isa::Avx2);
  if (best_isa() >= Isa::Avx512) v.push_back(Isa::Avx512);
  return v;
}

std::string describe(const Shape& s, const Variant& v) {
  return std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.r) + " a " +
         dtype_name(v.a_dtype) + " b " + dtype_name(v.b_dtype) + " c " + dtype_name(v.c_dtype) +
         (v.bias ? " bias" : "") + " act " + std::to_string(static_cast<int>(v.activation)) +
         (v.forward ? " forward" : " dx") + " pad " + std::to_string(v.pad) +
         (v.specials ? " specials" : "");
}

void check(const Shape& s, const Variant& v, std::uint32_t seed) {
  std::mt19937 rng(seed);
  Matrix a(v.a_dtype, s.m, s.r, v.pad, rng);
  Matrix w =
      v.forward ? Matrix(v.b_dtype, s.n, s.r, v.pad, rng) : Matrix(v.b_dtype, s.r, s.n, v.pad, rng);
  Matrix bias(v.a_dtype, 1, s.n, 0, rng);
  if (v.specials) {
    const float inf = std::numeric_limits<float>::infinity();
    a.set(0, std::numeric_limits<float>::quiet_NaN());
    if (s.m * a.stride > 5) a.set(s.m * a.stride - 2, inf);
    if (s.n * s.r > 3) w.set(3, -inf);
  }
  const detail::GemmMatrix b = v.forward ? detail::GemmMatrix{w.data(), v.b_dtype, 1, w.stride}
                                         : detail::GemmMatrix{w.data(), v.b_dtype, w.stride, 1};
  const std::int64_t ldc = s.n + v.pad;
  const std::size_t c_bytes = static_cast<std::size_t>(s.m * ldc) * dtype_size(v.c_dtype);
  std::vector<std::uint8_t> want(c_bytes, 0xA5);
  detail::GemmProblem p{s.m,         s.n,          s.r,          {a.data(), v.a_dtype, a.stride, 1},
                        b,           std::nullopt, v.activation, std::nullopt,
                        want.data(), v.c_dtype,    ldc,          1};
  if (v.bias) p.bias = detail::GemmMatrix{bias.data(), v.a_dtype, 0, 1};
  reference::gemm(p);
  for (Isa isa : isas()) {
    for (int threads : {1, 2}) {
      std::vector<std::uint8_t> got(c_bytes, 0xA5);
      p.c = got.data();
      cpu::gemm(p, threads, isa);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), c_bytes), 0)
          << describe(s, v) << " isa " << isa_name(isa) << " threads " << threads;
    }
  }
}

TEST(CpuGemm, ShapesMatchReference) {
  const DType dtypes[] = {DType::F32, DType::BF16, DType::F16};
  const Activation activations[] = {Activation::None, Activation::GeluTanh, Activation::Silu};
  std::uint32_t seed = 0;
  for (std::int64_t m : {1, 2, 3, 4, 7, 16, 17, 64, 255, 256, 300}) {
    for (std::int64_t n : {1, 15, 16, 17, 33, 64, 100}) {
      for (std::int64_t r : {1, 31, 32, 33, 64, 100, 256}) {
        if (m * n * r > 4'000'000) continue;  // the large ones below
        ++seed;
        Variant v;
        v.a_dtype = dtypes[seed % 3];
        v.b_dtype = dtypes[(seed / 3) % 3];
        v.c_dtype = dtypes[(seed / 9) % 3];
        v.bias = seed % 2 == 0;
        v.activation = activations[(seed / 2) % 3];
        v.forward = seed % 5 != 0;
        v.pad = seed % 7 == 0 ? 3 : 0;
        check({m, n, r}, v, seed);
      }
    }
  }
}

TEST(CpuGemm, FastPathVariants) {
  // fp32 out, no activation, full tiles: the vector epilogue, with and without bias.
  for (bool bias : {false, true}) {
    Variant v;
    v.bias = bias;
    check({48, 64, 100}, v, 1);
    check({96, 96, 3072}, v, 2);
    v.pad = 5;
    check({36, 64, 33}, v, 3);
  }
}

TEST(CpuGemm, LargeShapes) {
  Variant v;
  v.bias = true;
  check({3, 3072, 3072}, v, 1);
  check({17, 3072, 100}, v, 2);
  v.activation = Activation::GeluTanh;
  v.c_dtype = DType::BF16;
  check({64, 100, 3072}, v, 3);
  v.forward = false;
  v.a_dtype = DType::BF16;
  v.b_dtype = DType::BF16;
  check({300, 33, 3072}, v, 4);
  check({255, 64, 1000}, v, 5);
}

TEST(CpuGemm, SpecialValues) {
  for (DType c : {DType::F32, DType::BF16, DType::F16}) {
    Variant v;
    v.specials = true;
    v.c_dtype = c;
    check({7, 33, 64}, v, 1);
    v.bias = true;
    v.activation = Activation::Silu;
    check({24, 64, 100}, v, 2);
  }
}

TEST(CpuGemm, EmptyReductionAndOutputs) {
  check({5, 17, 0}, Variant{}, 1);
  Variant v;
  v.bias = true;
  check({5, 17, 0}, v, 2);
  std::vector<float> c(1, 3.0f);
  cpu::gemm({0,
             4,
             8,
             {nullptr, DType::F32, 8, 1},
             {nullptr, DType::F32, 1, 8},
             std::nullopt,
             Activation::None,
             std::nullopt,
             c.data(),
             DType::F32,
             4,
             1},
            2, best_isa());
  EXPECT_EQ(c[0], 3.0f);
}

TEST(CpuGemm, RowAloneEqualsRowInBatch) {
  std::mt19937 rng(9);
  const std::int64_t m = 37, n = 70, r = 300;
  Matrix a(DType::BF16, m, r, 0, rng);
  Matrix w(DType::BF16, n, r, 0, rng);
  const detail::GemmMatrix b{w.data(), DType::BF16, 1, r};
  std::vector<std::uint16_t> all(static_cast<std::size_t>(m * n)), one(static_cast<std::size_t>(n));
  for (Isa isa : isas()) {
    cpu::gemm({m,
               n,
               r,
               {a.data(), DType::BF16, r, 1},
               b,
               std::nullopt,
               Activation::GeluTanh,
               std::nullopt,
               all.data(),
               DType::BF16,
               n,
               1},
              2, isa);
    for (std::int64_t i = 0; i < m; ++i) {
      cpu::gemm({1,
                 n,
                 r,
                 {a.bytes.data() + i * r * 2, DType::BF16, r, 1},
                 b,
                 std::nullopt,
                 Activation::GeluTanh,
                 std::nullopt,
                 one.data(),
                 DType::BF16,
                 n,
                 1},
                1, isa);
      ASSERT_EQ(std::memcmp(one.data(), all.data() + i * n, one.size() * 2), 0)
          << "row " << i << " isa " << isa_name(isa);
    }
  }
}

TEST(CpuGemm, Avx2NeedsFma) {
  EXPECT_EQ(cpu::gemm_isa(Isa::Portable), Isa::Portable);
  EXPECT_EQ(cpu::gemm_isa(Isa::Avx512), Isa::Avx512);
  EXPECT_TRUE(cpu::gemm_isa(Isa::Avx2) == Isa::Avx2 || cpu::gemm_isa(Isa::Avx2) == Isa::Portable);
}

}  // namespace
}  // namespace kernel_align
