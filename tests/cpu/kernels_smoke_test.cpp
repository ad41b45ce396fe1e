// The CPU kernel tables called directly (no driver, no threads) against the reference
// backend, byte for byte, on every ISA path this machine runs: all dtypes of inputs,
// outputs and weights, both norm modes, both pairings and layouts, head dims with and
// without a tail chunk, strided, padded, unaligned and in-place memory, row ranges
// that start mid-tensor, rows of NaN, Inf, subnormal and huge values, and mixtures of
// rows that take the forward's NaN-free roundings and rows that do not.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "api/ops/multi_axis_rope.hpp"
#include "api/ops/qk_norm_rope.hpp"
#include "api/ops/qk_rmsnorm.hpp"
#include "cpu/kernels.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/rmsnorm.hpp"
#include "reference/reference.hpp"
#include "support/buffers.hpp"
#include "support/runtime_guard.hpp"

namespace kernel_align {
namespace {

using test::Outputs;
using test::PlacedBuffer;
using test::Rng;

constexpr DType kDtypes[] = {DType::F32, DType::BF16, DType::F16};
constexpr int kHeadDims[] = {2, 8, 18, 64, 128, 130, 4096};

// Bit patterns a kernel must carry through exactly: NaNs of both signs with
// payloads (quiet and signalling), infinities, zeros, subnormals, the largest finite.
std::uint32_t special_bits(DType dtype, Rng& rng) {
  static constexpr std::array<std::uint32_t, 10> f32 = {
      0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0xFFFFFFFFu, 0x7F800000u,
      0xFF800000u, 0x00000001u, 0x807FFFFFu, 0x80000000u, 0x7F7FFFFFu};
  static constexpr std::array<std::uint32_t, 10> bf16 = {
      0x7FC0u, 0xFFC1u, 0x7F81u, 0x7FFFu, 0x7F80u, 0xFF80u, 0x0001u, 0x807Fu, 0x8000u, 0x7F7Fu};
  static constexpr std::array<std::uint32_t, 10> f16 = {
      0x7E00u, 0xFE01u, 0x7C01u, 0xFFFFu, 0x7C00u, 0xFC00u, 0x0001u, 0x83FFu, 0x8000u, 0x7BFFu};
  const auto& table = dtype == DType::F32 ? f32 : (dtype == DType::BF16 ? bf16 : f16);
  return table[static_cast<std::size_t>(rng.below(static_cast<std::int64_t>(table.size())))];
}

std::uint32_t bits_of_value(DType dtype, float v) {
  switch (dtype) {
    case DType::BF16:
      return contract::f32_to_bf16(v);
    case DType::F16:
      return contract::f32_to_f16(v);
    case DType::F32:
    case DType::Bool:  // never computed with (validation)
      break;
  }
  return contract::bits_of(v);
}

// Row r of a tensor gets values of kind r % 6: two plain kinds, then NaN/Inf/subnormal
// specials among plain values, then subnormal-sized values, then values near the
// dtype's largest (sums of squares overflow), then plain values and one infinity
// (infinite rather than NaN sums: a stray NaN in a padded lane would show).
void fill_rows(PlacedBuffer& b, Rng& rng) {
  const std::int64_t d = b.shape().back();
  std::int64_t infinite_at = -1;
  for (std::int64_t i = 0; i < b.numel(); ++i) {
    const std::int64_t kind = (i / d) % 6;
    if (i % d == 0) infinite_at = rng.below(d);
    float v = static_cast<float>(rng.spread(6));
    if ((kind == 2 && rng.below(4) == 0) || (kind == 5 && i % d == infinite_at)) {
      b.set_bits(i, kind == 2 ? special_bits(b.dtype(), rng)
                              : bits_of_value(b.dtype(), contract::float_of(0x7F800000u)));
      continue;
    }
    if (kind == 3)
      v = static_cast<float>(rng.uniform(-1.0, 1.0) *
                             (b.dtype() == DType::F16 ? 0x1p-14 : 0x1p-126));
    if (kind == 4)
      v = static_cast<float>(rng.uniform(-1.0, 1.0) * (b.dtype() == DType::F16 ? 6e4 : 3e38));
    b.set_bits(i, bits_of_value(b.dtype(), v));
  }
}

// How a case lays out its tensors in memory.
enum class Memory { Contiguous, Unaligned, PaddedRows, Strided, InPlace, kCount };

std::vector<std::int64_t> strides_for(Memory m, const std::vector<std::int64_t>& shape) {
  if (m == Memory::PaddedRows) return test::padded_strides(shape, 3);
  if (m != Memory::Strided) return test::padded_strides(shape);
  // Every element two apart, rows one element further.
  std::vector<std::int64_t> strides = test::padded_strides(shape, 1);
  for (std::int64_t& s : strides) s *= 2;
  return strides;
}

std::size_t misalign_for(Memory m, DType dtype) {
  return m == Memory::Contiguous ? 0 : test::unaligned_offset(dtype);
}

PlacedBuffer make_tensor(DType dtype, const std::vector<std::int64_t>& shape, Memory m, Rng& rng) {
  PlacedBuffer b(dtype, shape, strides_for(m, shape), misalign_for(m, dtype));
  fill_rows(b, rng);
  return b;
}

// An output: a copy of `input` for in-place cases (same dtype), else fresh storage.
PlacedBuffer make_output(DType dtype, const PlacedBuffer& input, Memory m) {
  if (m == Memory::InPlace && input.dtype() == dtype) {
    return test::placed_copy(input.cview(), strides_for(m, input.shape()), misalign_for(m, dtype));
  }
  return PlacedBuffer(dtype, input.shape(), strides_for(m, input.shape()), misalign_for(m, dtype));
}

std::optional<PlacedBuffer> make_weight(std::optional<DType> dtype, int d, Memory m, Rng& rng) {
  if (!dtype) return std::nullopt;
  PlacedBuffer w(*dtype, {d}, {m == Memory::Strided ? 3 : 1}, misalign_for(m, *dtype));
  for (std::int64_t i = 0; i < d; ++i) {
    w.set_bits(i, bits_of_value(*dtype, static_cast<float>(rng.spread(20))));
  }
  return w;
}

// cos and sin [S, d/2], column-strided in the strided cases; some values are large or
// infinite (the rotation must carry whatever the tables hold).
std::array<PlacedBuffer, 2> make_tables(std::int64_t seq, int d, Memory m, Rng& rng) {
  const std::vector<std::int64_t> shape = {seq, d / 2};
  const std::vector<std::int64_t> strides =
      m == Memory::Strided ? std::vector<std::int64_t>{d + 1, 2} : test::padded_strides(shape);
  std::array<PlacedBuffer, 2> tables = {PlacedBuffer(DType::F32, shape, strides),
                                        PlacedBuffer(DType::F32, shape, strides)};
  for (PlacedBuffer& t : tables) {
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      const float v = i == 3 ? contract::float_of(0x7F800000u) : static_cast<float>(rng.spread(3));
      t.set_bits(i, contract::bits_of(v));
    }
  }
  return tables;
}

std::optional<ConstTensorView> cview(const std::optional<PlacedBuffer>& b) {
  if (!b) return std::nullopt;
  return b->cview();
}

// Runs a kernel over all rows of the plan in two ranges split mid-tensor (the second
// starts inside a leading dim).
void in_two_ranges(cpu::RowKernel kernel, const cpu::RowPlan& plan, std::int64_t rows) {
  kernel(plan, 0, rows / 3, nullptr);
  kernel(plan, rows / 3, rows, nullptr);
}

// The driver's dw: the contract's blocks of kDwBlockRows rows summed separately,
// then in block order.
void dw_in_blocks(cpu::RowKernel kernel, const cpu::RowPlan& plan, std::int64_t rows,
                  const TensorView& dw) {
  const int d = plan.d;
  const std::int64_t blocks = contract::dw_block_count(rows);
  std::vector<float> partials(static_cast<std::size_t>(blocks * d), 0.0f);
  for (std::int64_t b = 0; b < blocks; ++b) {
    kernel(plan, contract::dw_block_begin(rows, b), contract::dw_block_end(rows, b),
           partials.data() + b * d);
  }
  for (int i = 0; i < d; ++i) {
    float total = 0.0f;
    for (std::int64_t b = 0; b < blocks; ++b) {
      total = contract::add(total, partials[static_cast<std::size_t>(b * d + i)]);
    }
    contract::store_output(dw.dtype, dw.data, i * dw.strides[0], total);
  }
}

// A backward kernel over all rows of the plan: by dw blocks when it computes a dw,
// else in two ranges.
void backward_rows(cpu::RowKernel kernel, const cpu::RowPlan& plan, std::int64_t rows,
                   const std::optional<TensorView>& dw) {
  if (dw) {
    dw_in_blocks(kernel, plan, rows, *dw);
  } else {
    in_two_ranges(kernel, plan, rows);
  }
}

std::int64_t rows_of(const ConstTensorView& v) {
  return v.numel() / v.shape[v.rank - 1];
}

// The rmsnorm forward of x into y: with `kernels` in two ranges, or with the reference
// when kernels is null. Returns y's bytes.
Outputs rmsnorm_forward_outputs(const ConstTensorView& x, const std::optional<ConstTensorView>& w,
                                const RmsNormOptions& options, PlacedBuffer& y,
                                const cpu::RowKernels* kernels) {
  const auto p = detail::rmsnorm_forward_call(x, w, y.view(), options).problem;
  if (kernels == nullptr) {
    reference::qk_rmsnorm_forward(p);
  } else {
    in_two_ranges(kernels->rmsnorm_forward, cpu::row_plan(p), rows_of(x));
  }
  return Outputs{test::named_bytes("y", y)};
}

// The rmsnorm backward of (x, dy) into dx (dy may be a view of it: in place) and, when
// there is a weight, a dw of its dtype: with `kernels` by dw blocks, or with the
// reference when kernels is null. Returns every output's bytes.
Outputs rmsnorm_backward_outputs(const ConstTensorView& x, const ConstTensorView& dy,
                                 const std::optional<ConstTensorView>& w,
                                 const RmsNormOptions& options, PlacedBuffer& dx,
                                 const cpu::RowKernels* kernels) {
  std::optional<PlacedBuffer> dw;
  if (w) dw.emplace(w->dtype, std::vector<std::int64_t>{w->shape[0]});
  std::optional<TensorView> dwv;
  if (dw) dwv = dw->view();
  const auto p = detail::rmsnorm_backward_call(x, dy, w, dx.view(), dwv, options).problem;
  if (kernels == nullptr) {
    reference::qk_rmsnorm_backward(p);
  } else {
    backward_rows(kernels->rmsnorm_backward, cpu::row_plan(p), rows_of(x), p.dw);
  }
  Outputs outputs{test::named_bytes("dx", dx)};
  if (dw) outputs.push_back(test::named_bytes("dw", *dw));
  return outputs;
}

// The fused forward of every stream of `p`: with `kernels` in two ranges, or with the
// reference when kernels is null.
void norm_rope_forward_streams(const detail::QkNormRopeForwardProblem& p,
                               const cpu::RowKernels* kernels) {
  for (const auto& stream : p.streams) {
    if (kernels == nullptr) {
      reference::norm_rope_forward(stream);
    } else {
      in_two_ranges(kernels->norm_rope_forward, cpu::row_plan(stream), rows_of(stream.x));
    }
  }
}

// The fused backward of q and k into dq and dk (dq_out and dk_out may be views of them:
// in place) and, when there is a weight dtype, four dw of it: with `kernels` by dw
// blocks, or with the reference when kernels is null. Returns every output's bytes.
Outputs norm_rope_backward_outputs(const ConstTensorView& q, const ConstTensorView& k,
                                   const ConstTensorView& dq_out, const ConstTensorView& dk_out,
                                   const QkNormWeights& weights,
                                   const std::array<PlacedBuffer, 2>& tables,
                                   std::optional<DType> weight_dtype,
                                   const QkNormRopeOptions& options, PlacedBuffer& dq,
                                   PlacedBuffer& dk, const cpu::RowKernels* kernels) {
  std::array<std::optional<PlacedBuffer>, 4> dw;
  if (weight_dtype) {
    for (auto& one : dw) one.emplace(*weight_dtype, std::vector<std::int64_t>{q.shape[q.rank - 1]});
  }
  const auto view_of = [](std::optional<PlacedBuffer>& b) {
    return b ? std::optional<TensorView>(b->view()) : std::nullopt;
  };
  const QkNormWeightGrads dwv{view_of(dw[0]), view_of(dw[1]), view_of(dw[2]), view_of(dw[3])};
  const auto p =
      detail::qk_norm_rope_backward_call(q, k, dq_out, dk_out, weights, tables[0].cview(),
                                         tables[1].cview(), dq.view(), dk.view(), dwv, options)
          .problem;
  for (const auto& stream : p.streams) {
    if (kernels == nullptr) {
      reference::norm_rope_backward(stream);
    } else {
      backward_rows(kernels->norm_rope_backward, cpu::row_plan(stream), rows_of(stream.x),
                    stream.dw);
    }
  }
  Outputs outputs{test::named_bytes("dq", dq), test::named_bytes("dk", dk)};
  for (std::size_t i = 0; i < dw.size(); ++i) {
    if (dw[i]) outputs.push_back(test::named_bytes("dw" + std::to_string(i), *dw[i]));
  }
  return outputs;
}

// One case: `run(kernels)` computes its outputs on fresh storage with the given
// kernels, or with the reference backend when kernels is null.
using CaseRun = std::function<Outputs(const cpu::RowKernels* kernels)>;

// The kernels a case runs: a path of this build (on CPUs that have it), or the AVX-512
// path compiled on SIMDe's portable AVX-512 (tests/cpu/CMakeLists.txt), which runs on
// any x86-64 CPU.
struct KernelPath {
  std::string name;
  Isa isa = Isa::Portable;
  bool on_simde = false;
};

class KernelsSmoke : public ::testing::TestWithParam<KernelPath> {
 protected:
  void SetUp() override {
    const KernelPath& path = GetParam();
    if (path.on_simde) {
#if defined(KERNEL_ALIGN_HAVE_AVX512_ON_SIMDE)
      kernels_ = &cpu::avx512_on_simde_row_kernels;
#else
      GTEST_SKIP() << "the AVX-512 path on SIMDe is not in this build (no SIMDe, Debian: "
                      "libsimde-dev; not x86-64; or KERNEL_ALIGN_SIMDE_TESTS=OFF, as in the "
                      "asan preset): the AVX-512 path is tested only on AVX-512 CPUs here";
#endif
      return;
    }
    if (path.isa > best_isa()) GTEST_SKIP() << isa_name(path.isa) << " is not available here";
    kernels_ = &cpu::row_kernels(path.isa);
  }
  void check(const std::string& name, const CaseRun& run) {
    const Outputs expected = run(nullptr);
    const Outputs actual = run(kernels_);
    EXPECT_TRUE(test::same_bytes(expected, actual)) << name;
    ++cases_;
  }
  int cases_ = 0;
  const cpu::RowKernels* kernels_ = nullptr;
};

std::string describe_case(const char* op, int d, DType in, DType out, Memory m) {
  return std::string(op) + " d=" + std::to_string(d) + " " + dtype_name(in) + "->" +
         dtype_name(out) + " memory=" + std::to_string(static_cast<int>(m));
}

TEST_P(KernelsSmoke, RmsNorm) {
  Rng rng(1);
  const std::vector<std::vector<std::int64_t>> leading = {{}, {5}, {2, 3}, {2, 1, 3}};
  const std::optional<DType> weights[] = {std::nullopt, DType::F32, DType::BF16, DType::F16};
  for (int d : kHeadDims) {
    for (DType in : kDtypes) {
      for (DType out : kDtypes) {
        for (const std::optional<DType>& wt : weights) {
          for (NormMode mode : {NormMode::Single, NormMode::Diffusers}) {
            const auto m = static_cast<Memory>(rng.below(static_cast<int>(Memory::kCount)));
            std::vector<std::int64_t> shape = leading[static_cast<std::size_t>(rng.below(4))];
            shape.push_back(d);
            const DType dy_dtype = kDtypes[rng.below(3)];
            const PlacedBuffer x = make_tensor(in, shape, m, rng);
            const PlacedBuffer dy = make_tensor(dy_dtype, shape, m, rng);
            const std::optional<PlacedBuffer> w = make_weight(wt, d, m, rng);
            const RmsNormOptions options{1e-6f, mode};
            check(describe_case("rmsnorm_forward", d, in, out, m), [&](const cpu::RowKernels* k) {
              PlacedBuffer y = make_output(out, x, m);
              const ConstTensorView xv = m == Memory::InPlace && in == out ? y.cview() : x.cview();
              return rmsnorm_forward_outputs(xv, cview(w), options, y, k);
            });
            check(describe_case("rmsnorm_backward", d, in, out, m), [&](const cpu::RowKernels* k) {
              PlacedBuffer dx = make_output(out, dy, m);
              const ConstTensorView dyv =
                  m == Memory::InPlace && dy_dtype == out ? dx.cview() : dy.cview();
              return rmsnorm_backward_outputs(x.cview(), dyv, cview(w), options, dx, k);
            });
          }
        }
      }
    }
  }
  RecordProperty("cases", cases_);
}

// [B, S, H, D] stored in `layout`.
std::vector<std::int64_t> stored_shape(Layout layout, std::int64_t s, std::int64_t h, int d) {
  return layout == Layout::BSHD ? std::vector<std::int64_t>{2, s, h, d}
                                : std::vector<std::int64_t>{2, h, s, d};
}

TEST_P(KernelsSmoke, Rope) {
  Rng rng(2);
  constexpr std::int64_t kSeq = 3;
  for (int d : kHeadDims) {
    for (DType in : kDtypes) {
      for (DType out : kDtypes) {
        for (Pairing pairing : {Pairing::Half, Pairing::Interleaved}) {
          for (Layout layout : {Layout::BSHD, Layout::BHSD}) {
            for (bool transpose : {false, true}) {
              const auto m = static_cast<Memory>(rng.below(static_cast<int>(Memory::kCount)));
              const PlacedBuffer x = make_tensor(in, stored_shape(layout, kSeq, 2, d), m, rng);
              const auto tables = make_tables(kSeq, d, m, rng);
              const RopeOptions options{pairing, layout};
              check(describe_case("rope", d, in, out, m), [&](const cpu::RowKernels* k) {
                PlacedBuffer y = make_output(out, x, m);
                const ConstTensorView xv =
                    m == Memory::InPlace && in == out ? y.cview() : x.cview();
                const auto p =
                    detail::rope_call(transpose ? Direction::Backward : Direction::Forward, xv,
                                      tables[0].cview(), tables[1].cview(), y.view(), options)
                        .problem;
                if (k == nullptr) {
                  reference::multi_axis_rope(p);
                } else {
                  in_two_ranges(k->rope, cpu::row_plan(p), rows_of(xv));
                }
                return Outputs{test::named_bytes("y", y)};
              });
            }
          }
        }
      }
    }
  }
  RecordProperty("cases", cases_);
}

TEST_P(KernelsSmoke, FusedNormRope) {
  Rng rng(3);
  constexpr std::int64_t kSeq = 4;
  const std::optional<DType> weights[] = {std::nullopt, DType::F32, DType::BF16, DType::F16};
  for (int d : kHeadDims) {
    for (DType in : kDtypes) {
      for (DType out : kDtypes) {
        for (Pairing pairing : {Pairing::Half, Pairing::Interleaved}) {
          for (Layout layout : {Layout::BSHD, Layout::BHSD}) {
            const auto m = static_cast<Memory>(rng.below(static_cast<int>(Memory::kCount)));
            const std::optional<DType> wt = weights[rng.below(4)];
            QkNormRopeOptions options;
            options.mode = rng.below(2) == 0 ? NormMode::Single : NormMode::Diffusers;
            options.pairing = pairing;
            options.layout = layout;
            options.text_len = 1;
            const DType dy_dtype = kDtypes[rng.below(3)];
            const PlacedBuffer q = make_tensor(in, stored_shape(layout, kSeq, 2, d), m, rng);
            const PlacedBuffer k = make_tensor(in, stored_shape(layout, kSeq, 3, d), m, rng);
            const PlacedBuffer dq_out = make_tensor(dy_dtype, q.shape(), m, rng);
            const PlacedBuffer dk_out = make_tensor(dy_dtype, k.shape(), m, rng);
            const auto tables = make_tables(kSeq, d, m, rng);
            std::array<std::optional<PlacedBuffer>, 4> w;
            for (auto& one : w) one = make_weight(wt, d, m, rng);
            const QkNormWeights wv{cview(w[0]), cview(w[1]), cview(w[2]), cview(w[3])};

            check(describe_case("norm_rope_forward", d, in, out, m), [&](const cpu::RowKernels*
                                                                             kern) {
              PlacedBuffer q_out = make_output(out, q, m);
              PlacedBuffer k_out = make_output(out, k, m);
              const bool in_place = m == Memory::InPlace && in == out;
              const auto p =
                  detail::qk_norm_rope_forward_call(
                      in_place ? q_out.cview() : q.cview(), in_place ? k_out.cview() : k.cview(),
                      wv, tables[0].cview(), tables[1].cview(), q_out.view(), k_out.view(), options)
                      .problem;
              norm_rope_forward_streams(p, kern);
              return Outputs{test::named_bytes("q_out", q_out), test::named_bytes("k_out", k_out)};
            });

            check(describe_case("norm_rope_backward", d, in, out, m),
                  [&](const cpu::RowKernels* kern) {
                    PlacedBuffer dq = make_output(out, dq_out, m);
                    PlacedBuffer dk = make_output(out, dk_out, m);
                    const bool in_place = m == Memory::InPlace && dy_dtype == out;
                    return norm_rope_backward_outputs(q.cview(), k.cview(),
                                                      in_place ? dq.cview() : dq_out.cview(),
                                                      in_place ? dk.cview() : dk_out.cview(), wv,
                                                      tables, wt, options, dq, dk, kern);
                  });
          }
        }
      }
    }
  }
  RecordProperty("cases", cases_);
}

// The forward kernels (and the backwards' dw terms) drop the NaN select of a row's
// roundings when the row is NaN-free (finite sum of squares and rstd, a finite nonzero weight:
// rms_row_nan_free in row_kernels.hpp), and keep it otherwise. Rows of kind r % 7, so that every
// batch of 4 rows mixes kinds and a row's choice cannot leak into its neighbours':
//   0 plain; 1 plain but one NaN (payloads below); 2 plain but one +-Inf; 3 finite with a sum of
//   squares that overflows (fp16 cannot: its largest values); 4 zeros of both signs
//   (rstd = Inf with eps = 0); 5 values whose squares underflow, some exact zeros
//   (rstd huge or Inf, x * rstd Inf or NaN); 6 one element 1, the rest 0.
void fill_split_rows(PlacedBuffer& b, Rng& rng) {
  const std::int64_t d = b.shape().back();
  const DType t = b.dtype();
  const std::uint32_t nan_bits =
      t == DType::F32 ? 0xFFC00001u : (t == DType::BF16 ? 0xFFC1u : 0xFE01u);
  std::int64_t special_at = 0;
  for (std::int64_t i = 0; i < b.numel(); ++i) {
    const std::int64_t row = i / d;
    const std::int64_t kind = row % 7;
    if (i % d == 0) special_at = rng.below(d);
    const bool special = i % d == special_at;
    float v = static_cast<float>(rng.uniform(-2.0, 2.0));
    if (kind == 1 && special) {
      // Half of them with every payload bit set: fp32 0x7FFFFFFF (and fp16's, widened)
      // rounded to bf16 without the select carries into the sign bit and gives -0.
      const std::uint32_t all_ones = t == DType::F32 ? 0x7FFFFFFFu : 0x7FFFu;
      b.set_bits(i, rng.below(2) == 0 ? nan_bits : all_ones);
      continue;
    }
    if (kind == 2 && special) v = contract::float_of(rng.below(2) == 0 ? 0x7F800000u : 0xFF800000u);
    if (kind == 3)
      v = static_cast<float>(rng.uniform(-1.0, 1.0) * (t == DType::F16 ? 65504.0 : 3e38));
    if (kind == 4) v = rng.below(2) == 0 ? 0.0f : -0.0f;
    if (kind == 5) {
      const double tiny = t == DType::F16 ? 0x1p-24 : 0x1p-140;
      v = rng.below(3) == 0 ? 0.0f : static_cast<float>(rng.uniform(-4.0, 4.0) * tiny);
    }
    if (kind == 6) v = special ? 1.0f : 0.0f;
    b.set_bits(i, bits_of_value(t, v));
  }
}

// Weights of a kind: 0 plain; 1 huge (outputs overflow to Inf, fp16 outputs from any
// dtype); 2 one +0 or -0; 3 one +-Inf; 4 one NaN. Only kinds 0 and 1 allow NaN-free rows.
std::optional<PlacedBuffer> make_split_weight(std::optional<DType> dtype, int kind, int d,
                                              Rng& rng) {
  if (!dtype) return std::nullopt;
  PlacedBuffer w(*dtype, {d});
  const double huge = *dtype == DType::F16 ? 65504.0 : 3e38;
  const std::int64_t special_at = rng.below(d);
  for (std::int64_t i = 0; i < d; ++i) {
    float v = static_cast<float>(rng.uniform(0.5, 1.5) * (rng.below(2) == 0 ? 1 : -1));
    if (kind == 1) v = static_cast<float>(v * huge / 1.5);
    if (i == special_at && kind == 2) v = rng.below(2) == 0 ? 0.0f : -0.0f;
    if (i == special_at && kind == 3)
      v = contract::float_of(rng.below(2) == 0 ? 0x7F800000u : 0xFF800000u);
    if (i == special_at && kind == 4) v = contract::float_of(0x7FC00000u);
    w.set_bits(i, bits_of_value(*dtype, v));
  }
  return w;
}

TEST_P(KernelsSmoke, NaNFreeRowsAndFullRowsMixed) {
  Rng rng(5);
  const std::optional<DType> weights[] = {std::nullopt, DType::F32, DType::BF16, DType::F16};
  for (int d : {18, 128}) {
    for (DType in : kDtypes) {
      for (DType out : kDtypes) {
        for (const std::optional<DType>& wt : weights) {
          for (int weight_kind = 0; weight_kind < (wt ? 5 : 1); ++weight_kind) {
            for (NormMode mode : {NormMode::Single, NormMode::Diffusers}) {
              for (float eps : {0.0f, 1e-6f}) {
                const std::string name =
                    describe_case("nan-free split", d, in, out, Memory::Contiguous) +
                    " w=" + (wt ? dtype_name(*wt) : "none") + " kind " +
                    std::to_string(weight_kind) + " mode " + norm_mode_name(mode) + " eps " +
                    std::to_string(eps);
                PlacedBuffer x(in, {2, 3, 7, d});
                fill_split_rows(x, rng);
                const std::optional<PlacedBuffer> w = make_split_weight(wt, weight_kind, d, rng);
                check("rmsnorm_forward " + name, [&](const cpu::RowKernels* k) {
                  PlacedBuffer y(out, x.shape());
                  return rmsnorm_forward_outputs(x.cview(), cview(w), RmsNormOptions{eps, mode}, y,
                                                 k);
                });
                // The backward's dw terms round x * rstd as the forward does (NaN-free rows
                // drop the select there); dy mixes the same kinds of rows.
                PlacedBuffer dy(out, x.shape());
                fill_split_rows(dy, rng);
                check("rmsnorm_backward " + name, [&](const cpu::RowKernels* k) {
                  PlacedBuffer dx(out, x.shape());
                  return rmsnorm_backward_outputs(x.cview(), dy.cview(), cview(w),
                                                  RmsNormOptions{eps, mode}, dx, k);
                });

                constexpr std::int64_t kSeq = 7;
                PlacedBuffer q(in, stored_shape(Layout::BSHD, kSeq, 3, d));
                PlacedBuffer kx(in, stored_shape(Layout::BSHD, kSeq, 2, d));
                fill_split_rows(q, rng);
                fill_split_rows(kx, rng);
                const auto tables = make_tables(kSeq, d, Memory::Contiguous, rng);
                std::array<std::optional<PlacedBuffer>, 4> fw;
                for (auto& one : fw) one = make_split_weight(wt, weight_kind, d, rng);
                const QkNormWeights wv{cview(fw[0]), cview(fw[1]), cview(fw[2]), cview(fw[3])};
                QkNormRopeOptions options;
                options.eps = eps;
                options.mode = mode;
                options.pairing = d == 18 ? Pairing::Half : Pairing::Interleaved;
                options.layout = Layout::BSHD;
                options.text_len = 2;
                check("norm_rope_forward " + name, [&](const cpu::RowKernels* kern) {
                  PlacedBuffer q_out(out, q.shape());
                  PlacedBuffer k_out(out, kx.shape());
                  const auto p = detail::qk_norm_rope_forward_call(
                                     q.cview(), kx.cview(), wv, tables[0].cview(),
                                     tables[1].cview(), q_out.view(), k_out.view(), options)
                                     .problem;
                  norm_rope_forward_streams(p, kern);
                  return Outputs{test::named_bytes("q_out", q_out),
                                 test::named_bytes("k_out", k_out)};
                });
                PlacedBuffer dq_out(out, q.shape());
                PlacedBuffer dk_out(out, kx.shape());
                fill_split_rows(dq_out, rng);
                fill_split_rows(dk_out, rng);
                check("norm_rope_backward " + name, [&](const cpu::RowKernels* kern) {
                  PlacedBuffer dq(out, q.shape());
                  PlacedBuffer dk(out, kx.shape());
                  return norm_rope_backward_outputs(q.cview(), kx.cview(), dq_out.cview(),
                                                    dk_out.cview(), wv, tables, wt, options, dq, dk,
                                                    kern);
                });
              }
            }
          }
        }
      }
    }
  }
  RecordProperty("cases", cases_);
}

// Outputs of 16 MiB and more are written with non-temporal stores where a chunk (a
// chunk pair for bf16 outputs on AVX-512) is aligned to its size, and plain stores
// elsewhere; 16-bit outputs of the fused forward and the rmsnorm backward always with
// plain stores: every way must give the same bytes.
TEST_P(KernelsSmoke, LargeOutputs) {
  Rng rng(4);
  constexpr int kD = 128;
  const std::vector<std::int64_t> shape = {1, 4096, 16, kD};  // 8 Mi elements
  for (DType out : {DType::F32, DType::BF16, DType::F16}) {
    for (std::size_t misalign : {std::size_t{0}, std::size_t{2}}) {
      PlacedBuffer x(DType::BF16, shape, misalign);
      fill_rows(x, rng);
      const auto tables = make_tables(shape[1], kD, Memory::Contiguous, rng);
      const std::string name =
          std::string("large ") + dtype_name(out) + " misalign " + std::to_string(misalign);
      check("rmsnorm_forward " + name, [&](const cpu::RowKernels* k) {
        PlacedBuffer y(out, shape, misalign * dtype_size(out) / 2);
        const auto p = detail::rmsnorm_forward_call(x.cview(), std::nullopt, y.view(), {}).problem;
        if (k == nullptr) {
          reference::qk_rmsnorm_forward(p);
        } else {
          k->rmsnorm_forward(cpu::row_plan(p), 0, rows_of(x.cview()), nullptr);
        }
        return Outputs{test::named_bytes("y", y)};
      });
      check("rope " + name, [&](const cpu::RowKernels* k) {
        PlacedBuffer y(out, shape, misalign * dtype_size(out) / 2);
        const auto p = detail::rope_call(Direction::Forward, x.cview(), tables[0].cview(),
                                         tables[1].cview(), y.view(), {})
                           .problem;
        if (k == nullptr) {
          reference::multi_axis_rope(p);
        } else {
          k->rope(cpu::row_plan(p), 0, rows_of(x.cview()), nullptr);
        }
        return Outputs{test::named_bytes("y", y)};
      });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, KernelsSmoke,
                         ::testing::Values(KernelPath{"portable", Isa::Portable},
                                           KernelPath{"avx2", Isa::Avx2},
                                           KernelPath{"avx512", Isa::Avx512},
                                           KernelPath{"avx512_on_simde", Isa::Avx512, true}),
                         [](const auto& path) { return path.param.name; });

}  // namespace
}  // namespace kernel_align
