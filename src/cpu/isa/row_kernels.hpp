// The row kernels of every instruction-set path, written once over a 16-lane vector
// policy `V` (portable.cpp, avx2.cpp, avx512.cpp define one each). Only V's primitive
// operations differ between paths; the order of every fp32 operation is fixed here,
// and it is the contract's (docs/contract.md):
//
// - A row is held as chunks of 16 fp32 lanes: chunk c, lane j is element 16c + j, so
//   lane j is the contract's tree lane j. The tail chunk of a row whose length is not
//   a multiple of 16 has +0 in its lanes past the end (loads fill them), and every
//   step that feeds a sum keeps them +0: adding +0 to a tree lane is exact, since a
//   lane is never -0.
// - Sums: one 16-lane accumulator, `acc = add(acc, term)` chunk by chunk, then V's
//   tree halving (8, 4, 2, 1). Row constants (rstd, coef) are the contract's scalar
//   steps on the sums.
// - Stores: NaN becomes the positive canonical NaN, then round to nearest-even to
//   the output dtype (store_output); the same for `round_through`, whose NaN may be
//   any NaN because a NaN never turns back into a number. Rows that cannot hold a NaN
//   at a rounding skip the NaN select there (kNaNFree, "NaN-free rows" below).
//
// V provides, for its register type F of 16 fp32 lanes:
//   zero, broadcast(float), add, sub, mul, negate, negate_even (lanes 0, 2, ...),
//   swap_pairs (lanes 2k <-> 2k+1), dup_pairs(const float* p) = p0 p0 p1 p1 ... p7 p7,
//   keep_first(F, n) (lanes >= n set to +0), tree_reduce(F) -> float (contract step 3),
//   load_f32 / load_bf16 / load_f16 (16 contiguous elements, widened exactly),
//   canonical_nan(F) (NaN lanes -> 0x7FC00000), round_bf16 / round_f16 (to the
//   nearest-even value of the dtype; round_bf16 needs a NaN-free input),
//   to_bf16 / to_f16 (F -> H, 16 rounded 16-bit elements; to_bf16 needs a NaN-free
//   input), store(float*, F) and store(std::uint16_t*, H) (bits unchanged),
//   stream(...) the same as non-temporal stores to chunk-aligned memory, stream_fence.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cpu/isa/row_plan.hpp"
#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/rmsnorm.hpp"

namespace kernel_align::cpu {
// Internal linkage for everything here: each ISA file compiles its own copy with its
// own instruction set, and no copy may be merged with another's (row_plan.hpp).
namespace {

constexpr int kLanes = contract::kTreeLanes;

// The per-chunk steps below take and return 16-lane values that must stay in
// registers: a call that is not inlined passes them through memory, which made the
// kernels several times slower (measured with g++ 12), so they are forced inline.
#define KA_CHUNK_STEP [[gnu::always_inline]] inline
// The same for the lambdas that produce and consume chunks (after the parameters).
#define KA_CHUNK_LAMBDA __attribute__((always_inline))
constexpr int kMaxRowChunks = kMaxRowLength / kLanes;
static_assert(kMaxRowLength % (2 * kLanes) == 0);

// What a kernel call knows of its rows: their length and chunks, and the dtype of the
// rows it reads and writes. Compile-time constants where fixed (kFixedLength != 0,
// kFixedDType != kAnyDType), so that loops over a row's chunks unroll (a D = 128 row,
// 8 chunks, can stay in registers) and the per-chunk loads, roundings and stores need
// no dtype dispatch (measured: the dispatch was most of the instructions per element).
constexpr int kAnyDType = -1;

template <int kFixedLength, int kFixedDType>
struct RowFormat {
  static constexpr int kDType = kFixedDType;
  static constexpr int kCapacity =
      kFixedLength != 0 ? (kFixedLength + kLanes - 1) / kLanes : kMaxRowChunks;
  int runtime_length = kFixedLength;

  constexpr int length() const { return kFixedLength != 0 ? kFixedLength : runtime_length; }
  constexpr int chunks() const { return (length() + kLanes - 1) / kLanes; }
  constexpr int full_chunks() const { return length() / kLanes; }
  // Elements in the last chunk, 1..16.
  constexpr int last_count() const { return length() - (chunks() - 1) * kLanes; }
  // The dtype of a row of x, dy or out, or the dtype the diffusers mode rounds
  // through (the weight's): `actual` is the plan's, equal to the fixed one if any.
  constexpr DType dtype(DType actual) const {
    if constexpr (kFixedDType == kAnyDType) {
      return actual;
    } else {
      return static_cast<DType>(kFixedDType);
    }
  }
};

// The one dtype of every row and rounding of a plan (x, dy where there is one, out,
// and the weight's where the diffusers mode rounds through it), or kAnyDType.
inline int uniform_dtype(const RowPlan& p) {
  const DType t = p.x.dtype;
  const bool uniform = p.out.dtype == t && (p.dy.data == nullptr || p.dy.dtype == t) &&
                       (p.norm.mode != contract::NormMode::Diffusers || p.norm.weight_dtype == t);
  return uniform ? static_cast<int>(t) : kAnyDType;
}

// Calls body(format) with the format of the plan's rows: fixed for the head dim of
// Qwen-Image (and most attention models) with one dtype throughout, which is how a
// model calls these ops; run-time otherwise.
template <class Body>
void with_row_format(const RowPlan& p, const Body& body) {
  if (p.d != 128) {
    body(RowFormat<0, kAnyDType>{p.d});
    return;
  }
  switch (uniform_dtype(p)) {
    case static_cast<int>(DType::F32):
      body(RowFormat<128, static_cast<int>(DType::F32)>{});
      return;
    case static_cast<int>(DType::BF16):
      body(RowFormat<128, static_cast<int>(DType::BF16)>{});
      return;
    case static_cast<int>(DType::F16):
      body(RowFormat<128, static_cast<int>(DType::F16)>{});
      return;
    default:
      body(RowFormat<128, kAnyDType>{});
      return;
  }
}

// Leading indices of rows begin, begin + 1, ... in row-major order.
class RowWalk {
 public:
  RowWalk(const std::int64_t (&extents)[kLeadingDims], std::int64_t row) : extents_(extents) {
    for (int dim = kLeadingDims - 1; dim >= 0; --dim) {
      index_[dim] = row % extents[dim];
      row /= extents[dim];
    }
  }
  std::int64_t index(int dim) const { return index_[dim]; }
  std::int64_t offset(const std::int64_t (&strides)[kLeadingDims]) const {
    return index_[0] * strides[0] + index_[1] * strides[1] + index_[2] * strides[2];
  }
  void next() {
    for (int dim = kLeadingDims - 1; dim > 0; --dim) {
      if (++index_[dim] < extents_[dim]) return;
      index_[dim] = 0;
    }
    ++index_[0];
  }

 private:
  const std::int64_t (&extents_)[kLeadingDims];
  std::int64_t index_[kLeadingDims] = {};
};

// ---- Rows in and out of memory -------------------------------------------------

// count elements `step` apart, copied to a contiguous 16-element buffer whose
// other elements are zero: chunks of strided rows and row tails go through it.
template <class Elem>
void gather(const Elem* src, std::int64_t step, int count, Elem (&chunk)[kLanes]) {
  for (int i = 0; i < kLanes; ++i) chunk[i] = i < count ? src[i * step] : Elem{};
}

template <class Elem>
void scatter(const Elem (&chunk)[kLanes], int count, Elem* dst, std::int64_t step) {
  for (int i = 0; i < count; ++i) dst[i * step] = chunk[i];
}

template <class F, class Elem, class Format, class Load>
KA_CHUNK_STEP void load_chunks(const Elem* src, std::int64_t step, Format format, F* row,
                               const Load& load) {
  const int full = format.full_chunks();
  Elem chunk[kLanes];
  if (step == 1) {
    for (int c = 0; c < full; ++c) row[c] = load(src + c * kLanes);
  } else {
    for (int c = 0; c < full; ++c) {
      gather(src + c * kLanes * step, step, kLanes, chunk);
      row[c] = load(chunk);
    }
  }
  if (full < format.chunks()) {
    gather(src + full * kLanes * step, step, format.last_count(), chunk);
    row[full] = load(chunk);
  }
}

// Elements [0, length) of a row at data[offset], `step` apart, widened to fp32.
template <class V, class Format>
KA_CHUNK_STEP void load_row(const void* data, DType dtype, std::int64_t offset, std::int64_t step,
                            Format format, typename V::F* row) {
  switch (dtype) {
    case DType::F32:
      load_chunks(static_cast<const float*>(data) + offset, step, format, row,
                  [](const float* p) { return V::load_f32(p); });
      return;
    case DType::BF16:
      load_chunks(static_cast<const std::uint16_t*>(data) + offset, step, format, row,
                  [](const std::uint16_t* p) { return V::load_bf16(p); });
      return;
    case DType::F16:
      load_chunks(static_cast<const std::uint16_t*>(data) + offset, step, format, row,
                  [](const std::uint16_t* p) { return V::load_f16(p); });
      return;
  }
}

template <class V, class Format>
KA_CHUNK_STEP void load_row(const RowInput& t, std::int64_t offset, Format format,
                            typename V::F* row) {
  load_row<V>(t.data, format.dtype(t.dtype), offset, t.step, format, row);
}

// Whether a chunk at p may be stored non-temporally (stream stores need their size's
// alignment).
template <class Elem>
bool chunk_aligned(const Elem* p) {
  return reinterpret_cast<std::uintptr_t>(p) % (sizeof(Elem) * kLanes) == 0;
}

// ---- NaN-free rows ---------------------------------------------------------------
// The NaN select before a rounding (V::canonical_nan: compare unordered, blend; 2 of
// the 7 AVX2 instructions per 8 lanes of a bf16 rounding) changes nothing where no lane
// is NaN, and the roundings give the contract's bits for every other value without it:
// - round_bf16 / to_bf16 add 0x7FFF + (lowest kept bit) to the bits. For +-Inf
//   (0x7F800000, lowest kept bit 0) that is 0x7F807FFF, high half 0x7F80: Inf. For
//   the largest finite, 0x7F7FFFFF + 0x8000 = 0x7F807FFF: Inf, the contract's overflow.
//   No finite value or Inf reaches 0x7F810000 (the first bf16 NaN) nor carries into
//   the sign bit, so no NaN bits come out of a NaN-free input.
// - vcvtps2ph (round_f16 / to_f16) rounds finite values and Inf as contract::f32_to_f16
//   whatever the NaN handling; the fp32 store is the identity on non-NaN values.
// So a compile-time flag kNaNFree, chosen per row by the kernels that can prove it
// (rms_row_nan_free), drops the select; every other row and kernel keeps it.
template <class V, bool kNaNFree>
KA_CHUNK_STEP typename V::F canonical_nan_unless(typename V::F v) {
  if constexpr (kNaNFree) {
    return v;
  } else {
    return V::canonical_nan(v);
  }
}

// Calls body(std::bool_constant<nan_free>{}): one instantiation per case, the branch
// once per row.
template <class Body>
KA_CHUNK_STEP void with_nan_free(bool nan_free, const Body& body) {
  if (nan_free) {
    body(std::true_type{});
  } else {
    body(std::false_type{});
  }
}

inline bool is_finite(float v) {
  return (contract::bits_of(v) & 0x7FFFFFFFu) < 0x7F800000u;
}

// Chunk c of a row at dst, elements `step` apart; `convert(F)` gives what V::store
// writes for 16 elements of type Elem.
template <class V, class Elem, class Format, class Convert>
KA_CHUNK_STEP void store_chunk_as(typename V::F value, int c, Format format, Elem* dst,
                                  std::int64_t step, bool streaming, const Convert& convert) {
  const bool full = c < format.full_chunks();
  if (full && step == 1) {
    Elem* p = dst + c * kLanes;
    if (streaming && chunk_aligned(p)) {
      V::stream(p, convert(value));
    } else {
      V::store(p, convert(value));
    }
    return;
  }
  Elem chunk[kLanes];
  V::store(chunk, convert(value));
  scatter(chunk, full ? kLanes : format.last_count(), dst + c * kLanes * step, step);
}

// contract::store_output of chunk c of a row at t.data[offset]; `streaming`: with
// non-temporal stores where the row allows (see streams_output); kNaNFree: no lane of
// value is NaN.
template <class V, bool kNaNFree = false, class Format>
KA_CHUNK_STEP void store_chunk(typename V::F value, int c, Format format, const RowOutput& t,
                               std::int64_t offset, bool streaming) {
  using F = typename V::F;
  switch (format.dtype(t.dtype)) {
    case DType::F32:
      store_chunk_as<V>(value, c, format, static_cast<float*>(t.data) + offset, t.step, streaming,
                        [](F v) { return canonical_nan_unless<V, kNaNFree>(v); });
      return;
    case DType::BF16:
      store_chunk_as<V>(value, c, format, static_cast<std::uint16_t*>(t.data) + offset, t.step,
                        streaming,
                        [](F v) { return V::to_bf16(canonical_nan_unless<V, kNaNFree>(v)); });
      return;
    case DType::F16:
      store_chunk_as<V>(value, c, format, static_cast<std::uint16_t*>(t.data) + offset, t.step,
                        streaming,
                        [](F v) { return V::to_f16(canonical_nan_unless<V, kNaNFree>(v)); });
      return;
  }
}

// Non-temporal stores skip reading each output line before writing it (measured
// +40% over plain stores for streams of tens of MiB on a Zen 3 core), but an output
// that would have stayed in cache for its reader is then read back from memory. They
// are used for outputs of at least kStreamingMinBytes in all, about half a large L3.
constexpr std::int64_t kStreamingMinBytes = std::int64_t{16} << 20;

inline bool streams_output(const RowPlan& p) {
  const std::int64_t rows = p.extents[0] * p.extents[1] * p.extents[2];
  const std::int64_t element_bytes = p.out.dtype == DType::F32 ? 4 : 2;
  return p.out.step == 1 && rows * p.d * element_bytes >= kStreamingMinBytes;
}

// contract::round_through of 16 elements: the values a tensor of `dtype` would hold;
// kNaNFree: no lane of v is NaN (round_f16 needs no select either way).
template <class V, bool kNaNFree = false>
KA_CHUNK_STEP typename V::F round_through(DType dtype, typename V::F v) {
  switch (dtype) {
    case DType::F32:
      return v;
    case DType::BF16:
      return V::round_bf16(canonical_nan_unless<V, kNaNFree>(v));
    case DType::F16:
      return V::round_f16(v);
  }
  return v;
}

// The weight, or the contract's fp32 ones when there is none, and whether every
// element is finite and nonzero: then mul(t, w_i) is NaN only where t is (finite or
// infinite t gives a finite or infinite product; 0 * Inf needs a zero or Inf operand).
template <class V, class Format>
struct RowWeight {
  typename V::F chunk[Format::kCapacity];
  bool finite_nonzero = true;
};

template <class V, class Format>
void load_weight(const NormParams& norm, Format format, RowWeight<V, Format>& weight) {
  if (norm.weight == nullptr) {
    for (int c = 0; c < format.chunks(); ++c) weight.chunk[c] = V::broadcast(1.0f);
    weight.finite_nonzero = true;
    return;
  }
  load_row<V>(norm.weight, norm.weight_dtype, 0, norm.weight_step, format, weight.chunk);
  // Once per kernel call (d scalar tests): the widened values, lanes past d excluded.
  float elems[Format::kCapacity * kLanes];
  for (int c = 0; c < format.chunks(); ++c) V::store(elems + c * kLanes, weight.chunk[c]);
  weight.finite_nonzero = true;
  for (int i = 0; i < format.length(); ++i) {
    weight.finite_nonzero = weight.finite_nonzero && is_finite(elems[i]) && elems[i] != 0.0f;
  }
}

// sums[16c + j] = add(sums[16c + j], lane j of terms) for the row's elements in chunk c.
template <class V, class Format>
KA_CHUNK_STEP void add_chunk_to(float* sums, int c, Format format, typename V::F terms) {
  float* s = sums + c * kLanes;
  if (c < format.full_chunks()) {
    V::store(s, V::add(V::load_f32(s), terms));
    return;
  }
  float chunk[kLanes];
  gather(s, 1, format.last_count(), chunk);
  V::store(chunk, V::add(V::load_f32(chunk), terms));
  scatter(chunk, format.last_count(), s, 1);
}

// ---- RMSNorm steps ---------------------------------------------------------------
// A row is loaded whole (its sums need every element), then each output chunk is
// computed and handed on as soon as its inputs are known: intermediate values stay in
// registers instead of passing through a row buffer once per step.
//
// The sums take a batch of kRows rows: each row's sums are chains of dependent adds in
// the contract's order, and interleaving the chains of several rows lets them overlap.

template <class V, class Format, int kRows>
using RowBatch = typename V::F[kRows][Format::kCapacity];

// contract::rms_normalized of 16 elements, r = the row's rstd in every lane;
// kNaNFree: the row is NaN-free (rms_row_nan_free).
template <class V, bool kNaNFree = false, class Format>
KA_CHUNK_STEP typename V::F normalized(const NormParams& norm, Format format, typename V::F r,
                                       typename V::F x) {
  const typename V::F n = V::mul(x, r);
  return norm.mode == contract::NormMode::Diffusers
             ? round_through<V, kNaNFree>(format.dtype(norm.weight_dtype), n)
             : n;
}

// contract::rms_forward of 16 elements.
template <class V, bool kNaNFree = false, class Format>
KA_CHUNK_STEP typename V::F rms_forward(const NormParams& norm, Format format, typename V::F r,
                                        typename V::F x, typename V::F weight) {
  return V::mul(normalized<V, kNaNFree>(norm, format, r, x), weight);
}

// Whether the forward of a row can produce no NaN before its output rounding, from its
// sum of squares and rstd (scalars the row computes anyway) and the weight's flag.
// NaN arises only from a NaN operand, Inf - Inf, 0 * Inf, 0 / 0, Inf / Inf or the
// square root of a negative number. Here:
// - ss finite: every x_i is finite (the terms x_i * x_i are >= 0, so an Inf or NaN
//   element makes ss Inf or NaN; no Inf - Inf can cancel them);
// - rstd finite (eps may be 0: a zero row has rstd = 1/sqrt(0) = Inf, and 0 * Inf is
//   NaN; an Inf ss gives rstd = 0): x_i * rstd is a product of finite numbers, finite
//   or overflowing to +-Inf, never NaN; rounding it through the weight's dtype keeps it
//   a number or +-Inf;
// - the weight finite and nonzero: t * w_i is finite or +-Inf for any such t.
// So the rounding through the weight's dtype, the output rounding of rmsnorm, and the
// fused forward's rounding to its intermediate tensor see no NaN. The rotation after
// it is not covered: its products may overflow and Inf - Inf is NaN, so the fused
// forward's final store keeps the select. RoPE alone (user tables are unbounded and
// x may hold Inf) and the backwards (rstd * g - x * coef may be Inf - Inf) have no
// condition this cheap and keep the select everywhere.
inline bool rms_row_nan_free(float sum_squares, float rstd, bool weight_finite_nonzero) {
  return is_finite(sum_squares) && is_finite(rstd) && weight_finite_nonzero;
}

// contract::row_rstd of each row of the batch, with the sums of squares it came from.
template <class V, class Format, int kRows>
void rms_rstd_rows(const NormParams& norm, Format format, const RowBatch<V, Format, kRows>& x,
                   float (&sum_squares)[kRows], float (&rstd)[kRows]) {
  typename V::F squares[kRows];
  for (auto& s : squares) s = V::zero();
  for (int c = 0; c < format.chunks(); ++c) {
    for (int b = 0; b < kRows; ++b) squares[b] = V::add(squares[b], V::mul(x[b][c], x[b][c]));
  }
  for (int b = 0; b < kRows; ++b) {
    sum_squares[b] = V::tree_reduce(squares[b]);
    rstd[b] = contract::rms_rstd(sum_squares[b], format.length(), norm.eps);
  }
}

// The rmsnorm backward of the rows with upstream gradients dy: calls
// consume_dx(b, c, chunk c of row b's dx), and when dw_partial is not null adds each
// row's dw terms mul(dy_i, n_i) into it, rows in order.
template <class V, class Format, int kRows, class ConsumeDx>
KA_CHUNK_STEP void rms_backward_rows(const NormParams& norm, const typename V::F* weight,
                                     Format format, const RowBatch<V, Format, kRows>& x,
                                     const RowBatch<V, Format, kRows>& dy, float* dw_partial,
                                     const ConsumeDx& consume_dx) {
  using F = typename V::F;
  F squares[kRows];
  F dots[kRows];
  for (int b = 0; b < kRows; ++b) squares[b] = dots[b] = V::zero();
  for (int c = 0; c < format.chunks(); ++c) {
    for (int b = 0; b < kRows; ++b) {
      squares[b] = V::add(squares[b], V::mul(x[b][c], x[b][c]));
      dots[b] = V::add(dots[b], V::mul(V::mul(dy[b][c], weight[c]), x[b][c]));
    }
  }
  for (int b = 0; b < kRows; ++b) {
    // contract::rms_backward_row from the two sums.
    const float rstd = contract::rms_rstd(V::tree_reduce(squares[b]), format.length(), norm.eps);
    const float rstd3 = contract::mul(contract::mul(rstd, rstd), rstd);
    const float coef = contract::mul(
        rstd3, contract::div(V::tree_reduce(dots[b]), static_cast<float>(format.length())));
    const F r = V::broadcast(rstd);
    const F k = V::broadcast(coef);
    for (int c = 0; c < format.chunks(); ++c) {
      if (dw_partial != nullptr) {
        add_chunk_to<V>(dw_partial, c, format,
                        V::mul(dy[b][c], normalized<V>(norm, format, r, x[b][c])));
      }
      consume_dx(b, c, V::sub(V::mul(r, V::mul(dy[b][c], weight[c])), V::mul(x[b][c], k)));
    }
  }
}

// ---- RoPE steps ------------------------------------------------------------------

// A table row expanded to one (cos, sin) per element, so that for both pairings
//   y_i = add(mul(x_i, cos_i), mul(partner_i, sin_i))
// with partner_i the other element of i's pair and sin_i carrying the rotation's
// sign: the contract's first = a*c - b*s is add(mul(a, c), mul(b, -s)) bit for bit
// (negation is exact, and x - y is x + (-y) in IEEE 754), and its second
// add(mul(a, s), mul(b, c)) differs from add(mul(b, c), mul(a, s)) in NaN payloads
// only, which the store canonicalises. The transpose rotation negates every sin_i.
template <class V, class Format>
struct RotationTable {
  typename V::F cos[Format::kCapacity];
  typename V::F sin[Format::kCapacity];
  std::int64_t row = -1;  // the table row expanded, -1 before the first
};

template <class V, class Format>
void expand_table_row(const RopeParams& rope, std::int64_t table_row, Format format,
                      typename V::F* cos, typename V::F* sin) {
  const int d = format.length();
  const int half = d / 2;
  const float* cos_row = rope.cos + table_row * rope.cos_strides[0];
  const float* sin_row = rope.sin + table_row * rope.sin_strides[0];
  if (rope.cos_strides[1] == 1 && rope.sin_strides[1] == 1 && d % (2 * kLanes) == 0) {
    // Pairs never straddle a chunk: vector loads straight from the table.
    const int half_chunks = format.chunks() / 2;
    for (int c = 0; c < format.chunks(); ++c) {
      if (rope.interleaved) {
        cos[c] = V::dup_pairs(cos_row + c * kLanes / 2);
        sin[c] = V::negate_even(V::dup_pairs(sin_row + c * kLanes / 2));
      } else {
        const int column = (c % half_chunks) * kLanes;
        cos[c] = V::load_f32(cos_row + column);
        sin[c] = c < half_chunks ? V::negate(V::load_f32(sin_row + column))
                                 : V::load_f32(sin_row + column);
      }
      if (rope.transpose) sin[c] = V::negate(sin[c]);
    }
    return;
  }
  // Any other length or table stride, element by element; lanes past d stay +0.
  float cos_elems[kMaxRowLength + kLanes] = {};
  float sin_elems[kMaxRowLength + kLanes] = {};
  for (int i = 0; i < d; ++i) {
    const int column = rope.interleaved ? i / 2 : i % half;
    const bool first = rope.interleaved ? i % 2 == 0 : i < half;
    const float s = sin_row[column * rope.sin_strides[1]];
    cos_elems[i] = cos_row[column * rope.cos_strides[1]];
    sin_elems[i] = first != rope.transpose ? -s : s;
  }
  for (int c = 0; c < format.chunks(); ++c) {
    cos[c] = V::load_f32(cos_elems + c * kLanes);
    sin[c] = V::load_f32(sin_elems + c * kLanes);
  }
}

// The table expanded for `table_row`, re-expanded only when the row changes: the
// heads of a token (consecutive rows in BSHD) share one table row.
template <class V, class Format>
const RotationTable<V, Format>& table_for(const RopeParams& rope, std::int64_t table_row,
                                          Format format, RotationTable<V, Format>& table) {
  if (table.row != table_row) {
    expand_table_row<V>(rope, table_row, format, table.cos, table.sin);
    table.row = table_row;
  }
  return table;
}

// Calls consume(c, chunk c of the rotation of x) for every chunk of a row, where
// produce(c) gives chunk c of x; each chunk is produced once. Lanes past the row's
// end are +0 in the rotation when they are in x.
template <class V, class Format, class Produce, class Consume>
KA_CHUNK_STEP void rotate_chunks(const RopeParams& rope, const RotationTable<V, Format>& table,
                                 Format format, const Produce& produce, const Consume& consume) {
  using F = typename V::F;
  const auto rotated = [&](int c, F x, F partner) KA_CHUNK_LAMBDA {
    return V::add(V::mul(x, table.cos[c]), V::mul(partner, table.sin[c]));
  };
  const int d = format.length();
  if (rope.interleaved) {
    // Pairs are adjacent lanes of one chunk (a row's length is even).
    for (int c = 0; c < format.chunks(); ++c) {
      const auto& x = produce(c);
      consume(c, rotated(c, x, V::swap_pairs(x)));
    }
  } else if (d % (2 * kLanes) == 0) {
    // The partner of chunk c is chunk c + chunks/2, and the other way round.
    const int half_chunks = format.chunks() / 2;
    for (int c = 0; c < half_chunks; ++c) {
      const auto& first = produce(c);
      const auto& second = produce(c + half_chunks);
      consume(c, rotated(c, first, second));
      consume(c + half_chunks, rotated(c + half_chunks, second, first));
    }
  } else {
    // The row twice in a row: element i + d/2 of it is the partner of element i.
    F x[Format::kCapacity];
    for (int c = 0; c < format.chunks(); ++c) x[c] = produce(c);
    float twice[2 * kMaxRowLength + kLanes];
    for (int c = 0; c < format.chunks(); ++c) V::store(twice + c * kLanes, x[c]);
    for (int c = 0; c < format.chunks(); ++c) V::store(twice + d + c * kLanes, x[c]);
    const int last = format.chunks() - 1;
    for (int c = 0; c < last; ++c)
      consume(c, rotated(c, x[c], V::load_f32(twice + c * kLanes + d / 2)));
    // Lanes past the end read partners from the second copy.
    consume(last, V::keep_first(rotated(last, x[last], V::load_f32(twice + last * kLanes + d / 2)),
                                format.last_count()));
  }
}

// ---- Kernels -----------------------------------------------------------------------
// Each reads a row whole before it writes it: an output may be its input (in place).
// Each works on a local copy of its plan: a vector store may alias any memory, so
// fields read through the caller's reference would be reloaded after every store
// (measured with g++ 12), while a local whose address stays inside the kernel may not.

// Calls body(std::integral_constant<int, n>) for consecutive batches of n rows that
// cover [begin, end): 4 at a time where rows are short enough to keep 4 in registers
// or L1, then one at a time.
template <class Format, class Body>
void for_row_batches(std::int64_t begin, std::int64_t end, const Body& body) {
  constexpr int kBatch = Format::kCapacity <= 16 ? 4 : 1;
  std::int64_t r = begin;
  for (; end - r >= kBatch; r += kBatch) body(std::integral_constant<int, kBatch>{});
  if constexpr (kBatch > 1) {
    for (; r < end; ++r) body(std::integral_constant<int, 1>{});
  }
}

// The rows of one batch of a normalising kernel, as the driver below hands them on.
template <class V, class Format, int kRows>
struct NormBatch {
  RowBatch<V, Format, kRows> x;
  RowBatch<V, Format, kRows> dy;            // the backward's gradient rows, as the norm sees them
  std::int64_t table_row[kRows];            // the RoPE table row of each row
  std::int64_t out_offset[kRows];           // where each row goes in the output
  typename V::F staged[Format::kCapacity];  // a row on its way into dy (the fused backward)
};

// The driver of the four kernels that normalise rows (rmsnorm and the fused op, forward
// and backward): the row format, the weight, the walk over rows in batches, loading x,
// the offsets, the stream fence. For each batch, after loading x, it calls
//   prepare(format, batch, b, row, table) for each row b at `row` (the backwards load
//   dy there),
//   compute(format, batch, weight, table, streaming) for the batch (weight: a
//   RowWeight),
// with `table` the RoPE table expansion the batches share (fused kernels only).
template <class V, class Prepare, class Compute>
void for_norm_batches(const RowPlan& p, std::int64_t begin, std::int64_t end,
                      const Prepare& prepare, const Compute& compute) {
  const bool streaming = streams_output(p);
  with_row_format(p, [&](auto format) {
    using Format = decltype(format);
    RotationTable<V, Format> table;
    RowWeight<V, Format> weight;
    load_weight<V>(p.norm, format, weight);
    RowWalk row(p.extents, begin);
    for_row_batches<Format>(begin, end, [&](auto rows) {
      NormBatch<V, Format, decltype(rows)::value> batch;
      for (int b = 0; b < decltype(rows)::value; ++b, row.next()) {
        load_row<V>(p.x, row.offset(p.x.strides), format, batch.x[b]);
        batch.table_row[b] = p.rope.seq_offset + row.index(p.rope.seq_dim);
        batch.out_offset[b] = row.offset(p.out.strides);
        prepare(format, batch, b, row, table);
      }
      compute(format, batch, weight, table, streaming);
    });
  });
  if (streaming) V::stream_fence();
}

// Loads nothing more than x.
constexpr auto kNothingToPrepare = [](auto&&...) {};

// The forward kernels' rows: calls body(b, r, nan_free) for each row b of the batch,
// r = the row's rstd in every lane, nan_free = std::bool_constant<rms_row_nan_free>
// where kSplit, else std::false_type (the kernel has no select to drop).
template <class V, bool kSplit, class Format, class Batch, class Body>
KA_CHUNK_STEP void for_each_rstd(const NormParams& norm, Format format, const Batch& batch,
                                 const RowWeight<V, Format>& weight, const Body& body) {
  constexpr int kRows = std::extent_v<decltype(batch.out_offset)>;
  float sum_squares[kRows];
  float rstd[kRows];
  rms_rstd_rows<V>(norm, format, batch.x, sum_squares, rstd);
  for (int b = 0; b < kRows; ++b) {
    if constexpr (kSplit) {
      const bool nan_free = rms_row_nan_free(sum_squares[b], rstd[b], weight.finite_nonzero);
      with_nan_free(nan_free, [&](auto row_nan_free) KA_CHUNK_LAMBDA {
        body(b, V::broadcast(rstd[b]), row_nan_free);
      });
    } else {
      body(b, V::broadcast(rstd[b]), std::false_type{});
    }
  }
}

template <class V>
void rmsnorm_forward_kernel(const RowPlan& plan, std::int64_t begin, std::int64_t end, float*) {
  const RowPlan p = plan;
  const auto compute = [&](auto format, const auto& batch, const auto& weight, auto&,
                           bool streaming) KA_CHUNK_LAMBDA {
    // Every output dtype's store has a select to drop.
    for_each_rstd<V, true>(
        p.norm, format, batch, weight, [&](int b, typename V::F r, auto nan_free) KA_CHUNK_LAMBDA {
          constexpr bool kNaNFree = decltype(nan_free)::value;
          for (int c = 0; c < format.chunks(); ++c) {
            store_chunk<V, kNaNFree>(
                rms_forward<V, kNaNFree>(p.norm, format, r, batch.x[b][c], weight.chunk[c]), c,
                format, p.out, batch.out_offset[b], streaming);
          }
        });
  };
  for_norm_batches<V>(p, begin, end, kNothingToPrepare, compute);
}

// The rmsnorm backward of a batch whose dy rows are loaded: dx stored, dw terms added.
template <class V>
auto rms_backward_batch(const RowPlan& p, float* dw_partial) {
  return [&p, dw_partial](auto format, const auto& batch, const auto& weight, auto&,
                          bool streaming) KA_CHUNK_LAMBDA {
    rms_backward_rows<V>(p.norm, weight.chunk, format, batch.x, batch.dy, dw_partial,
                         [&](int b, int c, typename V::F dx) KA_CHUNK_LAMBDA {
                           store_chunk<V>(dx, c, format, p.out, batch.out_offset[b], streaming);
                         });
  };
}

template <class V>
void rmsnorm_backward_kernel(const RowPlan& plan, std::int64_t begin, std::int64_t end,
                             float* dw_partial) {
  const RowPlan p = plan;
  const auto load_dy =
      [&](auto format, auto& batch, int b, const RowWalk& row, auto&)
          KA_CHUNK_LAMBDA { load_row<V>(p.dy, row.offset(p.dy.strides), format, batch.dy[b]); };
  for_norm_batches<V>(p, begin, end, load_dy, rms_backward_batch<V>(p, dw_partial));
}

template <class V>
void rope_kernel(const RowPlan& plan, std::int64_t begin, std::int64_t end, float*) {
  const RowPlan p = plan;
  const bool streaming = streams_output(p);
  with_row_format(p, [&](auto format) {
    using Format = decltype(format);
    RotationTable<V, Format> table;
    typename V::F x[Format::kCapacity];
    RowWalk row(p.extents, begin);
    for (std::int64_t r = begin; r < end; ++r, row.next()) {
      const std::int64_t table_row = p.rope.seq_offset + row.index(p.rope.seq_dim);
      const std::int64_t y_offset = row.offset(p.out.strides);
      load_row<V>(p.x, row.offset(p.x.strides), format, x);
      rotate_chunks<V>(
          p.rope, table_for<V>(p.rope, table_row, format, table), format,
          [&](int c) KA_CHUNK_LAMBDA -> const typename V::F& { return x[c]; },
          [&](int c, typename V::F y)
              KA_CHUNK_LAMBDA { store_chunk<V>(y, c, format, p.out, y_offset, streaming); });
    }
  });
  if (streaming) V::stream_fence();
}

// rope(rmsnorm(x)) through a row of out's dtype: the unfused ops' intermediate tensor.
template <class V>
void norm_rope_forward_kernel(const RowPlan& plan, std::int64_t begin, std::int64_t end, float*) {
  const RowPlan p = plan;
  const auto compute = [&](auto format, const auto& batch, const auto& weight, auto& table,
                           bool streaming) KA_CHUNK_LAMBDA {
    // Before the rotation only bf16 roundings have a select (round_f16 has none, fp32's
    // is the identity), so formats of fp32 or fp16 throughout take one path: a second
    // copy of the row loop would cost code and registers for nothing (measured: +7%
    // instructions per byte for fp32, +1.5% for fp16).
    using Format = decltype(format);
    constexpr bool kSplit =
        Format::kDType == kAnyDType || Format::kDType == static_cast<int>(DType::BF16);
    for_each_rstd<V, kSplit>(
        p.norm, format, batch, weight, [&](int b, typename V::F r, auto nan_free) KA_CHUNK_LAMBDA {
          // NaN-free up to the intermediate tensor only (rms_row_nan_free): the store after
          // the rotation keeps its select.
          constexpr bool kNaNFree = decltype(nan_free)::value;
          const auto normalized_chunk = [&](int c) KA_CHUNK_LAMBDA {
            return round_through<V, kNaNFree>(
                format.dtype(p.out.dtype),
                rms_forward<V, kNaNFree>(p.norm, format, r, batch.x[b][c], weight.chunk[c]));
          };
          rotate_chunks<V>(p.rope, table_for<V>(p.rope, batch.table_row[b], format, table), format,
                           normalized_chunk, [&](int c, typename V::F y) KA_CHUNK_LAMBDA {
                             store_chunk<V>(y, c, format, p.out, batch.out_offset[b], streaming);
                           });
        });
  };
  for_norm_batches<V>(p, begin, end, kNothingToPrepare, compute);
}

// The rmsnorm backward of (x, g) with g = the transpose rotation of dy through a row
// of dy's dtype: the unfused ops' intermediate tensor.
template <class V>
void norm_rope_backward_kernel(const RowPlan& plan, std::int64_t begin, std::int64_t end,
                               float* dw_partial) {
  const RowPlan p = plan;
  const auto load_g = [&](auto format, auto& batch, int b, const RowWalk& row,
                          auto& table) KA_CHUNK_LAMBDA {
    load_row<V>(p.dy, row.offset(p.dy.strides), format, batch.staged);
    rotate_chunks<V>(
        p.rope, table_for<V>(p.rope, batch.table_row[b], format, table), format,
        [&](int c) KA_CHUNK_LAMBDA -> const typename V::F& { return batch.staged[c]; },
        [&](int c, typename V::F g)
            KA_CHUNK_LAMBDA { batch.dy[b][c] = round_through<V>(format.dtype(p.dy.dtype), g); });
  };
  for_norm_batches<V>(p, begin, end, load_g, rms_backward_batch<V>(p, dw_partial));
}

// The table of path V (constant-initialised: no code runs before main).
template <class V>
constexpr RowKernels row_kernels_of() {
  return {&rmsnorm_forward_kernel<V>, &rmsnorm_backward_kernel<V>, &rope_kernel<V>,
          &norm_rope_forward_kernel<V>, &norm_rope_backward_kernel<V>};
}

}  // namespace
}  // namespace kernel_align::cpu
