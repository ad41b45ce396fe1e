// The CPU GEMM engine (cpu/gemm/) against the reference, byte for byte: every ISA path
// this CPU has, 1 and 2 threads, fp32/bf16/fp16 inputs and outputs, bias or none, each
// activation, edge tiles, forward (b = w^T) and dx (b row-major) strides, padded rows,
// NaN and Inf inputs; and a row computed alone gives its bytes in the big call.
#include <gtest/gtest.h>

#include <algorithm>
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
  // grad_out present (the activation's backward as the epilogue), of this dtype, with
  // grad_pad elements after each row and grad_col_stride between columns.
  bool grad = false;
  DType grad_dtype = DType::F32;
  std::int64_t grad_pad = 0, grad_col_stride = 1;
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
         (v.specials ? " specials" : "") +
         (v.grad
              ? " grad " + std::string(dtype_name(v.grad_dtype)) + " pad " +
                    std::to_string(v.grad_pad) + " col stride " + std::to_string(v.grad_col_stride)
              : "");
}

void check(const Shape& s, const Variant& v, std::uint32_t seed) {
  std::mt19937 rng(seed);
  Matrix a(v.a_dtype, s.m, s.r, v.pad, rng);
  Matrix w =
      v.forward ? Matrix(v.b_dtype, s.n, s.r, v.pad, rng) : Matrix(v.b_dtype, s.r, s.n, v.pad, rng);
  Matrix bias(v.a_dtype, 1, s.n, 0, rng);
  // grad_out: row i, column j at element i * (n * col_stride + pad) + j * col_stride.
  Matrix grad(v.grad_dtype, s.m, s.n * v.grad_col_stride, v.grad_pad, rng);
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
  if (v.grad) {
    if (v.specials && s.m * s.n > 2) grad.set(grad.stride + v.grad_col_stride, -0.0f);
    p.grad_out = detail::GemmMatrix{grad.data(), v.grad_dtype, grad.stride, v.grad_col_stride};
  }
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
  // Several row blocks (192 rows), B panel groups of 4 with a short last group, and
  // passes of 4 leaves that end inside the tree's groups (22 leaves, q = 11): the tree's
  // state of every tile carried across the passes, the next pass's B fetched ahead.
  v.forward = true;
  v.activation = Activation::None;
  v.c_dtype = DType::F32;
  v.a_dtype = DType::F32;
  v.b_dtype = DType::F32;
  check({400, 200, 700}, v, 6);
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

TEST(CpuGemm, GradOutEpilogue) {
  // C = linear_activation_grad(S, bias, act, grad_out): every activation, grad_out of each
  // dtype, contiguous and strided (padded rows, column stride 3), bias or none, full and
  // edge tiles, C of each dtype.
  const DType dtypes[] = {DType::F32, DType::BF16, DType::F16};
  const Activation activations[] = {Activation::None, Activation::GeluTanh, Activation::Silu};
  const Shape shapes[] = {{48, 64, 100}, {17, 33, 64}, {3, 100, 300}, {24, 96, 0}, {64, 96, 3072}};
  std::uint32_t seed = 100;
  for (const Shape& s : shapes) {
    for (Activation act : activations) {
      for (DType g : dtypes) {
        for (bool bias : {false, true}) {
          for (int strided = 0; strided < 2; ++strided) {
            if (s.r == 3072 && (strided != 0 || g == DType::F16)) continue;  // time
            Variant v;
            v.grad = true;
            v.grad_dtype = g;
            v.activation = act;
            v.bias = bias;
            v.grad_pad = strided != 0 ? 5 : 0;
            v.grad_col_stride = strided != 0 ? 3 : 1;
            v.c_dtype = dtypes[seed % 3];
            v.a_dtype = dtypes[(seed / 3) % 3];
            v.forward = seed % 4 != 0;
            v.specials = seed % 5 == 0 && s.r > 0;  // specials write A and w
            check(s, v, ++seed);
          }
        }
      }
    }
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

// The vector epilogue's activations give the scalar contract functions' bits: every bf16
// value (every sign, exponent and top mantissa bits), a dense sweep of [-16, 16], values
// around each branch boundary, and random bit patterns; the backward with random and
// special dy. `exhaustive` runs every fp32 bit pattern instead of the random ones.
void check_activations(bool exhaustive) {
  std::vector<float> z;
  for (std::uint32_t h = 0; h < 65536; ++h) z.push_back(contract::float_of(h << 16));
  for (float v = -16.0f; v <= 16.0f; v += 1.0f / 4096) z.push_back(v);
  for (float edge : {88.72283935546875f, -103.97208404541015625f, 0.625f, 9.1f, 44.36f,
                     -88.72283935546875f, 103.97208404541015625f, 0.0f, 87.3f, -87.3f}) {
    std::uint32_t bits = contract::bits_of(edge);
    for (std::uint32_t d = 0; d < 64; ++d) {
      z.push_back(contract::float_of(bits + d));
      z.push_back(contract::float_of(bits - d));
      z.push_back(-contract::float_of(bits + d));
      z.push_back(-contract::float_of(bits - d));
    }
  }
  std::mt19937 rng(5);
  if (!exhaustive) {
    for (int i = 0; i < (1 << 20); ++i)
      z.push_back(contract::float_of(static_cast<std::uint32_t>(rng())));
  }
  std::normal_distribution<float> normal;
  std::vector<float> dy(z.size()), out(z.size());
  for (std::size_t i = 0; i < dy.size(); ++i) {
    dy[i] = i % 97 == 0 ? contract::float_of(static_cast<std::uint32_t>(rng())) : normal(rng);
  }
  const Activation activations[] = {Activation::None, Activation::GeluTanh, Activation::Silu};
  const auto compare = [&](Isa isa, const std::vector<float>& zs, std::int64_t count) {
    for (Activation act : activations) {
      for (bool backward : {false, true}) {
        cpu::gemm_epilogue_activation(isa, act, zs.data(), backward ? dy.data() : nullptr,
                                      out.data(), count);
        for (std::int64_t i = 0; i < count; ++i) {
          const float want = backward ? contract::activate_backward(act, dy[i], zs[i])
                                      : contract::activate(act, zs[i]);
          // A NaN's sign and payload are not the contract's (every store canonicalises
          // it): whichever operand's NaN an instruction keeps.
          if (contract::is_nan(want) && contract::is_nan(out[i])) continue;
          ASSERT_EQ(contract::bits_of(out[i]), contract::bits_of(want))
              << "isa " << isa_name(isa) << " act " << static_cast<int>(act) << " backward "
              << backward << " z " << zs[i] << " (0x" << std::hex << contract::bits_of(zs[i])
              << ") dy " << dy[i];
        }
      }
    }
  };
  for (Isa isa : isas()) {
    compare(isa, z, static_cast<std::int64_t>(z.size()));
    if (!exhaustive) continue;
    std::vector<float> chunk(dy.size());
    for (std::uint64_t first = 0; first < (std::uint64_t{1} << 32); first += chunk.size()) {
      const std::uint64_t count =
          std::min<std::uint64_t>(chunk.size(), (std::uint64_t{1} << 32) - first);
      for (std::uint64_t i = 0; i < count; ++i)
        chunk[i] = contract::float_of(static_cast<std::uint32_t>(first + i));
      compare(isa, chunk, static_cast<std::int64_t>(count));
    }
  }
}

TEST(CpuGemm, VectorActivationsMatchScalar) {
  check_activations(false);
}

// Every fp32 (minutes): --gtest_also_run_disabled_tests --gtest_filter=*Exhaustive*
TEST(CpuGemm, DISABLED_VectorActivationsExhaustive) {
  check_activations(true);
}

TEST(CpuGemm, Avx2NeedsFma) {
  EXPECT_EQ(cpu::gemm_isa(Isa::Portable), Isa::Portable);
  EXPECT_EQ(cpu::gemm_isa(Isa::Avx512), Isa::Avx512);
  EXPECT_TRUE(cpu::gemm_isa(Isa::Avx2) == Isa::Avx2 || cpu::gemm_isa(Isa::Avx2) == Isa::Portable);
}

}  // namespace
}  // namespace kernel_align
