// The CUDA GEMM kernel (cuda/device/gemm_kernel.cuh) and its plan (plan::gemm), the very
// source nvcc compiles, run by the grid emulator against reference::gemm byte for byte:
// fp32/bf16/fp16 A, B and C, bias or none, each activation, grad_out (the activation's
// backward epilogue) or none, M, N, R on both sides of the 64 x 64 tile and the 32-r leaf
// (R = 0 included), the layouts linear uses (forward: b = w^T; dx: b row-major; dw: a
// transposed; db: b a broadcast 1), padded and strided views, NaN, Inf and products that
// underflow to -0. C starts as 0xA5 bytes and is compared whole, so a stray write shows.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "api/gemm_problem.hpp"
#include "cuda/emulator/emulated_backend.hpp"
#include "cuda/emulator/grid_emulator.hpp"
#include "cuda/plan.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/registry.hpp"
#include "reference/gemm.hpp"
#include "registry/registry.hpp"

namespace kernel_align {
namespace {

using contract::Activation;
using cuda::emulation::EmulatedGrid;

// plan.hpp's Executor over the grid emulator, keeping the launch records.
struct EmulatorExecutor {
  std::vector<registry::LaunchRecord> launches;

  template <template <class> class Kernel>
  void launch(const registry::LaunchRecord& l, const typename Kernel<EmulatedGrid>::Params& p) {
    launches.push_back(l);
    cuda::emulation::launch<Kernel<EmulatedGrid>>({l.grid[0], l.grid[1], l.grid[2]},
                                                  {l.block[0], l.block[1], l.block[2]}, p);
  }
};

// `count` elements of one dtype, held as bytes, filled from N(0, 1) (rounded to the dtype).
struct Buffer {
  DType dtype = DType::F32;
  std::vector<std::uint8_t> bytes;

  Buffer() = default;
  Buffer(DType t, std::int64_t count, std::mt19937& rng)
      : dtype(t), bytes(static_cast<std::size_t>(count < 1 ? 1 : count) * dtype_size(t)) {
    std::normal_distribution<float> normal;
    for (std::int64_t i = 0; i < count; ++i) set(i, normal(rng));
  }
  void set(std::int64_t index, float v) {
    if (dtype == DType::F32) {
      std::memcpy(bytes.data() + index * 4, &v, 4);
    } else {
      const std::uint16_t h = contract::stored_bits16(dtype, v);
      std::memcpy(bytes.data() + index * 2, &h, 2);
    }
  }
  std::int64_t size() const { return static_cast<std::int64_t>(bytes.size() / dtype_size(dtype)); }
  const void* data() const { return bytes.data(); }
};

struct Shape {
  std::int64_t m, n, r;
};

// How A and B lie in memory: linear's three GEMMs (gemm_problem.hpp).
enum class Layout {
  Forward,  // a = x row-major [m, r]; b = w^T, w row-major [n, r]: row_stride 1, col_stride r
  Dx,       // a row-major [m, r]; b row-major [r, n]
  Dw,       // a = dz^T, dz row-major [r, m]: row_stride 1, col_stride m; b row-major [r, n]
};

const char* layout_name(Layout l) {
  return l == Layout::Forward ? "forward" : (l == Layout::Dx ? "dx" : "dw");
}

struct Variant {
  DType a_dtype = DType::F32, b_dtype = DType::F32, c_dtype = DType::F32;
  Layout layout = Layout::Forward;
  std::int64_t pad = 0;  // elements after each row of A, B (w), C and grad_out
  bool bias = false;
  DType bias_dtype = DType::F32;
  std::int64_t bias_stride = 1;
  Activation activation = Activation::None;
  bool grad = false;
  DType grad_dtype = DType::F32;
  std::int64_t grad_col_stride = 1;
  std::int64_t c_col_stride = 1;
  // Inputs: NaN and Inf at a few places; or every value tiny (2^-80 scale), so that every
  // product underflows to +-0 and leaves and sums can be -0.
  bool specials = false;
  bool tiny = false;
};

std::string describe(const Shape& s, const Variant& v) {
  return std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.r) + " a " +
         dtype_name(v.a_dtype) + " b " + dtype_name(v.b_dtype) + " c " + dtype_name(v.c_dtype) +
         " " + layout_name(v.layout) + " pad " + std::to_string(v.pad) +
         (v.bias ? std::string(" bias ") + dtype_name(v.bias_dtype) : "") + " act " +
         std::to_string(static_cast<int>(v.activation)) +
         (v.grad ? std::string(" grad ") + dtype_name(v.grad_dtype) + " col stride " +
                       std::to_string(v.grad_col_stride)
                 : "") +
         " c col stride " + std::to_string(v.c_col_stride) + (v.specials ? " specials" : "") +
         (v.tiny ? " tiny" : "");
}

// The problem over the variant's buffers, C at `c`.
struct Case {
  Shape s;
  Variant v;
  Buffer a, b, bias, grad;
  detail::GemmProblem problem{};
  std::int64_t c_elements = 0;

  Case(const Shape& shape, const Variant& variant, std::uint32_t seed) : s(shape), v(variant) {
    std::mt19937 rng(seed);
    const std::int64_t m = s.m, n = s.n, r = s.r, pad = v.pad;
    detail::GemmMatrix am{}, bm{};
    if (v.layout == Layout::Dw) {
      a = Buffer(v.a_dtype, r * (m + pad), rng);
      am = {a.data(), v.a_dtype, 1, m + pad};
    } else {
      a = Buffer(v.a_dtype, m * (r + pad), rng);
      am = {a.data(), v.a_dtype, r + pad, 1};
    }
    if (v.layout == Layout::Forward) {
      b = Buffer(v.b_dtype, n * (r + pad), rng);
      bm = {b.data(), v.b_dtype, 1, r + pad};
    } else {
      b = Buffer(v.b_dtype, r * (n + pad), rng);
      bm = {b.data(), v.b_dtype, n + pad, 1};
    }
    bias = Buffer(v.bias_dtype, n * v.bias_stride, rng);
    const std::int64_t grad_row = n * v.grad_col_stride + pad;
    grad = Buffer(v.grad_dtype, m * grad_row, rng);
    if (v.tiny) {
      // Products below 2^-160 round to +-0 (under half the smallest subnormal, 2^-150).
      for (Buffer* buffer : {&a, &b}) {
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (std::int64_t i = 0; i < buffer->size(); ++i) buffer->set(i, u(rng) * 0x1p-80f);
      }
    }
    if (v.specials) {
      const float inf = std::numeric_limits<float>::infinity();
      a.set(0, std::numeric_limits<float>::quiet_NaN());
      if (a.size() > 5) a.set(a.size() - 2, inf);
      if (b.size() > 3) b.set(3, -inf);
      if (b.size() > 40) b.set(40, std::numeric_limits<float>::quiet_NaN());
      if (grad.size() > 2) grad.set(1, -0.0f);
      if (grad.size() > 7) grad.set(7, inf);
    }
    const std::int64_t c_row = n * v.c_col_stride + pad;
    c_elements = m * c_row;
    problem.m = m;
    problem.n = n;
    problem.r = r;
    problem.a = am;
    problem.b = bm;
    problem.activation = v.activation;
    problem.c_dtype = v.c_dtype;
    problem.c_row_stride = c_row;
    problem.c_col_stride = v.c_col_stride;
    if (v.bias) problem.bias = detail::GemmMatrix{bias.data(), v.bias_dtype, 0, v.bias_stride};
    if (v.grad) {
      problem.grad_out = detail::GemmMatrix{grad.data(), v.grad_dtype, grad_row, v.grad_col_stride};
    }
  }

  std::vector<std::uint8_t> fresh_c() const {
    return std::vector<std::uint8_t>(
        static_cast<std::size_t>(c_elements < 1 ? 1 : c_elements) * dtype_size(v.c_dtype), 0xA5);
  }

  std::vector<std::uint8_t> reference() const {
    std::vector<std::uint8_t> c = fresh_c();
    detail::GemmProblem p = problem;
    p.c = c.data();
    reference::gemm(p);
    return c;
  }

  std::vector<std::uint8_t> emulated(EmulatorExecutor& exec) const {
    std::vector<std::uint8_t> c = fresh_c();
    detail::GemmProblem p = problem;
    p.c = c.data();
    cuda::plan::gemm(p, exec);
    return c;
  }
};

void check(const Shape& s, const Variant& v, std::uint32_t seed) {
  const Case c(s, v, seed);
  EmulatorExecutor exec;
  const std::vector<std::uint8_t> want = c.reference();
  const std::vector<std::uint8_t> got = c.emulated(exec);
  ASSERT_EQ(got.size(), want.size());
  if (std::memcmp(got.data(), want.data(), got.size()) != 0) {
    std::size_t first = 0;
    while (got[first] == want[first]) ++first;
    FAIL() << describe(s, v) << ": first differing byte " << first << " of " << got.size();
  }
  ASSERT_EQ(exec.launches.size(), s.m > 0 && s.n > 0 ? 1u : 0u) << describe(s, v);
}

const DType kDtypes[] = {DType::F32, DType::BF16, DType::F16};
const Activation kActivations[] = {Activation::None, Activation::GeluTanh, Activation::Silu};
const Layout kLayouts[] = {Layout::Forward, Layout::Dx, Layout::Dw};

// Every shape of the matrix, the variant cycling through dtypes, layouts, bias,
// activations, grad_out and padding.
TEST(EmulatedCudaGemm, ShapesMatchReference) {
  std::uint32_t seed = 0;
  for (std::int64_t m : {1, 3, 17, 64, 130}) {
    for (std::int64_t n : {1, 15, 33, 64, 100}) {
      for (std::int64_t r : {0, 1, 31, 32, 33, 100, 300}) {
        ++seed;
        Variant v;
        v.a_dtype = kDtypes[seed % 3];
        v.b_dtype = kDtypes[(seed / 3) % 3];
        v.c_dtype = kDtypes[(seed / 9) % 3];
        v.layout = kLayouts[(seed / 2) % 3];
        v.bias = seed % 2 == 0;
        v.bias_dtype = kDtypes[(seed / 5) % 3];
        v.activation = kActivations[(seed / 4) % 3];
        v.grad = seed % 5 == 1;
        v.grad_dtype = kDtypes[(seed / 7) % 3];
        v.pad = seed % 7 == 0 ? 3 : 0;
        check({m, n, r}, v, seed);
      }
    }
  }
}

// Every combination of the dtypes of A, B and C, the bias (none or each dtype), the
// activation and grad_out, in each layout, on one edge-tile shape with a partial leaf.
TEST(EmulatedCudaGemm, EveryDtypeBiasActivationAndGradOut) {
  std::uint32_t seed = 1000;
  for (DType a : kDtypes) {
    for (DType b : kDtypes) {
      for (DType c : kDtypes) {
        for (int bias = 0; bias < 4; ++bias) {
          for (Activation act : kActivations) {
            for (bool grad : {false, true}) {
              ++seed;
              Variant v;
              v.a_dtype = a;
              v.b_dtype = b;
              v.c_dtype = c;
              v.bias = bias > 0;
              v.bias_dtype = kDtypes[bias % 3];
              v.activation = act;
              v.grad = grad;
              v.grad_dtype = kDtypes[seed % 3];
              v.layout = kLayouts[seed % 3];
#if defined(KA_TEST_ASAN)
              if (seed % 4 != 0) continue;  // every access checked on a quarter of them
#endif
              check({17, 33, 40}, v, seed);
            }
          }
        }
      }
    }
  }
}

// Full and edge tiles, both M tiles and N tiles, several leaves, in each layout: the
// forward, its backward's dz (grad_out, then the dx and dw products) with padded rows,
// strided columns of C, grad_out and the bias.
TEST(EmulatedCudaGemm, LayoutsAndStrides) {
  std::uint32_t seed = 5000;
  for (Layout layout : kLayouts) {
    for (const Shape& s : {Shape{130, 100, 100}, Shape{64, 64, 64}, Shape{65, 129, 300}}) {
      for (int variant = 0; variant < 3; ++variant) {
        Variant v;
        v.layout = layout;
        v.a_dtype = kDtypes[variant];
        v.b_dtype = kDtypes[(variant + 1) % 3];
        v.c_dtype = kDtypes[(variant + 2) % 3];
        v.pad = variant == 1 ? 5 : 0;
        v.c_col_stride = variant == 2 ? 2 : 1;
        v.bias = variant != 0;
        v.bias_stride = variant == 2 ? 3 : 1;
        v.activation = kActivations[variant];
        v.grad = variant != 1;
        v.grad_col_stride = variant == 2 ? 2 : 1;
        check(s, v, ++seed);
      }
    }
  }
}

// linear_backward's db: dz^T times a broadcast 1 (b with both strides 0, N = 1), into a
// column (C's column stride 0).
TEST(EmulatedCudaGemm, BroadcastOneColumn) {
  static const float kOne = 1.0f;
  std::mt19937 rng(7);
  for (std::int64_t m : {1, 70}) {
    for (std::int64_t r : {0, 5, 33, 300}) {
      for (DType c_dtype : kDtypes) {
        Buffer dz(DType::BF16, r * m, rng);  // dz row-major [r, m]; a = dz^T
        std::vector<std::uint8_t> want(static_cast<std::size_t>(m) * dtype_size(c_dtype), 0xA5);
        std::vector<std::uint8_t> got = want;
        detail::GemmProblem p{m,
                              1,
                              r,
                              {dz.data(), DType::BF16, 1, m},
                              {&kOne, DType::F32, 0, 0},
                              std::nullopt,
                              Activation::None,
                              std::nullopt,
                              want.data(),
                              c_dtype,
                              1,
                              0};
        reference::gemm(p);
        p.c = got.data();
        EmulatorExecutor exec;
        cuda::plan::gemm(p, exec);
        EXPECT_EQ(got, want) << m << " x " << r << " " << dtype_name(c_dtype);
      }
    }
  }
}

// NaN and Inf among the inputs (NaN stored as the canonical NaN), and products that all
// underflow, whose leaves and sums are +-0: the padding of a partial leaf (fma(+0, -0,
// acc) = acc) keeps a -0.
TEST(EmulatedCudaGemm, SpecialValuesAndSignedZeros) {
  std::uint32_t seed = 9000;
  for (DType c : kDtypes) {
    for (Activation act : kActivations) {
      Variant v;
      v.c_dtype = c;
      v.activation = act;
      v.specials = true;
      check({7, 33, 64}, v, ++seed);
      v.bias = true;
      v.grad = true;
      v.layout = Layout::Dx;
      check({24, 70, 100}, v, ++seed);
    }
  }
  for (std::int64_t r : {1, 2, 31, 33, 65}) {
    for (Layout layout : kLayouts) {
      Variant v;
      v.tiny = true;
      v.layout = layout;
      v.c_dtype = r % 2 == 0 ? DType::F32 : DType::BF16;
      check({20, 40, r}, v, ++seed);
    }
  }
  // The tiny case does produce -0 in C (else it would prove nothing).
  Variant v;
  v.tiny = true;
  const Case c({20, 40, 1}, v, 77);
  EmulatorExecutor exec;
  const std::vector<std::uint8_t> got = c.emulated(exec);
  int negative_zeros = 0;
  for (std::size_t i = 0; i + 4 <= got.size(); i += 4) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, got.data() + i, 4);
    negative_zeros += bits == 0x80000000u ? 1 : 0;
  }
  EXPECT_GT(negative_zeros, 0);
}

// The launch: kernel "gemm", 256 threads, grid (N tiles, M tiles); none for an empty C,
// which stays untouched.
TEST(EmulatedCudaGemm, LaunchRecords) {
  Variant v;
  for (const Shape& s : {Shape{130, 100, 33}, Shape{1, 1, 0}, Shape{64, 65, 1}}) {
    const Case c(s, v, 1);
    EmulatorExecutor exec;
    c.emulated(exec);
    ASSERT_EQ(exec.launches.size(), 1u);
    const registry::LaunchRecord& l = exec.launches[0];
    EXPECT_EQ(l.kernel, "gemm");
    EXPECT_EQ(l.path, "generic");
    EXPECT_EQ(l.rows_per_block, 64);
    EXPECT_EQ(l.block, (std::array<unsigned, 3>{256, 1, 1}));
    EXPECT_EQ(l.grid, (std::array<unsigned, 3>{static_cast<unsigned>((s.n + 63) / 64),
                                               static_cast<unsigned>((s.m + 63) / 64), 1}));
  }
  for (const Shape& s : {Shape{0, 5, 7}, Shape{5, 0, 7}}) {
    const Case c(s, v, 1);
    EmulatorExecutor exec;
    const std::vector<std::uint8_t> got = c.emulated(exec);
    EXPECT_TRUE(exec.launches.empty());
    EXPECT_EQ(got, c.fresh_c());
  }
}

// Past 65535 M tiles a block also computes the M tiles gridDim.y apart: the same bytes
// with fewer y blocks than M tiles (grid.y = 1 and 2 for 3 M tiles).
TEST(EmulatedCudaGemm, MTilesBeyondGridY) {
  Variant v;
  v.bias = true;
  v.activation = Activation::Silu;
  const Case c({130, 70, 40}, v, 3);
  const std::vector<std::uint8_t> want = c.reference();
  for (unsigned grid_y : {1u, 2u}) {
    std::vector<std::uint8_t> got = c.fresh_c();
    detail::GemmProblem p = c.problem;
    p.c = got.data();
    cuda::GemmParams g = cuda::plan::gemm_params(p);
    ASSERT_EQ(g.m_tiles, 3);
    g.m_tile_step = grid_y;
    registry::LaunchRecord l = cuda::plan::gemm_launch(g);
    cuda::emulation::launch<cuda::Gemm<EmulatedGrid>>({l.grid[0], grid_y, 1}, {l.block[0], 1, 1},
                                                      g);
    EXPECT_EQ(got, want) << "grid.y " << grid_y;
  }
}

// linear_forward and linear_backward through the registry on the emulated backend (the
// cuda backend's plans, plan::gemm and plan::linear_backward, on the grid emulator): the
// reference backend's bytes, each activation, with the bias gradient's broadcast one.
TEST(EmulatedCudaLinear, ForwardAndBackwardEqualTheReferenceBackend) {
  const registry::ScopedRegistration emulated(cuda::emulation::emulated_cuda_backend());
  const std::string before = backend_override();
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  const auto random = [&](std::int64_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& e : v) e = dist(rng);
    return v;
  };
  constexpr std::int64_t kM = 19, kK = 70, kN = 37;
  std::vector<float> x = random(kM * kK), w = random(kN * kK), b = random(kN), dy = random(kM * kN);
  const auto view = [](std::vector<float>& v, std::vector<std::int64_t> shape) {
    TensorView t;
    t.data = v.data();
    t.dtype = DType::F32;
    t.rank = static_cast<int>(shape.size());
    std::int64_t step = 1;
    for (int i = t.rank - 1; i >= 0; --i) {
      t.shape[i] = shape[static_cast<std::size_t>(i)];
      t.strides[i] = step;
      step *= t.shape[i];
    }
    return t;
  };
  for (const kernel_align::Activation activation :
       {kernel_align::Activation::None, kernel_align::Activation::GeluTanh,
        kernel_align::Activation::Silu}) {
    std::array<std::vector<float>, 2> y, dx, dw, db;
    for (int run = 0; run < 2; ++run) {
      set_backend(run == 0 ? "reference" : "cuda-emulated");
      y[run].assign(kM * kN, 0.0f);
      dx[run].assign(kM * kK, 0.0f);
      dw[run].assign(kN * kK, 0.0f);
      db[run].assign(kN, 0.0f);
      linear_forward(view(x, {kM, kK}), view(w, {kN, kK}), view(b, {kN}), view(y[run], {kM, kN}),
                     {activation});
      EXPECT_EQ(last_call().backend, run == 0 ? "reference" : "cuda-emulated");
      linear_backward(view(x, {kM, kK}), view(w, {kN, kK}), view(b, {kN}), view(dy, {kM, kN}),
                      view(dx[run], {kM, kK}), view(dw[run], {kN, kK}), view(db[run], {kN}),
                      {activation});
    }
    const auto bits = [](const std::vector<float>& v) {
      std::vector<std::uint32_t> out(v.size());
      std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
      return out;
    };
    EXPECT_EQ(bits(y[0]), bits(y[1])) << activation_name(activation);
    EXPECT_EQ(bits(dx[0]), bits(dx[1])) << activation_name(activation);
    EXPECT_EQ(bits(dw[0]), bits(dw[1])) << activation_name(activation);
    EXPECT_EQ(bits(db[0]), bits(db[1])) << activation_name(activation);
  }
  set_backend(before);
}

}  // namespace
}  // namespace kernel_align
