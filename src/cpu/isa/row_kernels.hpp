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
// Each kernel is one loop nest: rows in batches, and within a row its chunks, calling
// the small helpers below (where a row is, load a chunk, the row constants, round and
// store a chunk). The one place that turns run-time facts into compile-time ones is
// with_row_format; a row's NaN-free flag picks between two instantiations of its
// chunk loop.
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
//   kStreams: whether the path has non-temporal stores; if so, stream(...) the same as
//   store to chunk-aligned memory, non-temporally, and stream_fence;
//   kNarrowsPairs: whether the path narrows two chunks into one register W of 32
//   bf16; if so, to_bf16_pair(F lo, F hi) -> W (to_bf16 of each, lo first; NaN-free
//   inputs), store(std::uint16_t*, W) and, with kStreams, stream(std::uint16_t*, W) to
//   two-chunk-aligned memory.
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

// The helpers below take and return 16-lane values that must stay in registers: a call
// that is not inlined passes them through memory, which made the kernels several times
// slower (measured with g++ 12: g++ copies the AVX2 two-register value in 16-byte
// pieces that the following 32-byte load cannot forward from), so they are forced
// inline, and so are the lambdas handed to rotate_chunks (after their parameters).
#define KA_INLINE [[gnu::always_inline]] inline
#define KA_INLINE_LAMBDA __attribute__((always_inline))
// Calls body(std::bool_constant<flag>...) for run-time flags: one instantiation of body
// per combination, chosen by one branch per flag (per row, where the kernels use it).
template <class Body>
KA_INLINE void with_flags(const Body& body) {
  body();
}
template <class Body, class... Flags>
KA_INLINE void with_flags(const Body& body, bool flag, Flags... flags) {
  if (flag) {
    with_flags([&](auto... known) KA_INLINE_LAMBDA { body(std::true_type{}, known...); }, flags...);
  } else {
    with_flags([&](auto... known) KA_INLINE_LAMBDA { body(std::false_type{}, known...); },
               flags...);
  }
}

constexpr int kMaxRowChunks = kMaxRowLength / kLanes;
static_assert(kMaxRowLength % (2 * kLanes) == 0);

// ---- Row formats -----------------------------------------------------------------

// What a kernel call knows of its rows: their length and chunks, and the dtype of the
// rows it reads and writes. Compile-time constants where fixed (kFixedLength != 0,
// kFixedDType != kAnyDType), so that loops over a row's chunks unroll (a D = 128 row,
// 8 chunks, can stay in registers) and the per-chunk loads, roundings and stores need
// no dtype dispatch (measured: the dispatch was most of the instructions per element).
constexpr int kAnyDType = -1;

// The dtype x * rstd is rounded through before the weight multiplies it
// (contract::rms_normalized): the weight's in the diffusers mode; fp32, which rounds
// nothing, in the single mode.
constexpr DType norm_rounding(const NormParams& norm) {
  return norm.mode == contract::NormMode::Diffusers ? norm.weight_dtype : DType::F32;
}

template <int kFixedLength, int kFixedDType, int kFixedNormDType = kFixedDType>
struct RowFormat {
  static constexpr int kDType = kFixedDType;
  static constexpr int kNormDType = kFixedNormDType;
  // A fixed length is only chosen for rows whose elements are adjacent (step 1) in x,
  // dy and out, and it is a multiple of 16: every chunk is full and is loaded and
  // stored in place, with no gather, scatter or tail.
  static constexpr bool kContiguous = kFixedLength != 0;
  static_assert(kFixedLength % kLanes == 0);
  static constexpr int kCapacity =
      kFixedLength != 0 ? (kFixedLength + kLanes - 1) / kLanes : kMaxRowChunks;
  int runtime_length = kFixedLength;

  constexpr int length() const { return kFixedLength != 0 ? kFixedLength : runtime_length; }
  constexpr int chunks() const { return (length() + kLanes - 1) / kLanes; }
  constexpr int full_chunks() const { return length() / kLanes; }
  // Elements in the last chunk, 1..16.
  constexpr int last_count() const { return length() - (chunks() - 1) * kLanes; }
  // Elements in chunk c.
  constexpr int count(int c) const { return c < full_chunks() ? kLanes : last_count(); }
  // The dtype of a row of x, dy or out: `actual` is the plan's, equal to the fixed one
  // if any.
  constexpr DType dtype(DType actual) const {
    if constexpr (kFixedDType == kAnyDType) {
      return actual;
    } else {
      return static_cast<DType>(kFixedDType);
    }
  }
  // norm_rounding, fixed or the plan's.
  constexpr DType norm_dtype(const NormParams& norm) const {
    if constexpr (kFixedNormDType == kAnyDType) {
      return norm_rounding(norm);
    } else {
      return static_cast<DType>(kFixedNormDType);
    }
  }
};

// Calls body(c) for each chunk c of a row. Fixed formats unroll the loop (a D = 128 row
// is 8 chunks), so that the row's values stay in registers and the loop costs no
// counter: g++ 12 unrolled none of the output loops by itself, their bodies exceeding
// its full-unroll size limit. Run-time formats keep a plain loop (unrolling it as well
// made the ISA files take minutes to compile, for code that is rarely run).
template <class Format, class Body>
KA_INLINE void for_each_chunk(Format format, const Body& body) {
  if constexpr (Format::kContiguous) {
#pragma GCC unroll 16
    for (int c = 0; c < Format::kCapacity; ++c) body(c);
  } else {
    for (int c = 0; c < format.chunks(); ++c) body(c);
  }
}

// The one dtype of every row of a plan (x, dy where there is one, out), or kAnyDType.
inline int uniform_dtype(const RowPlan& p) {
  const DType t = p.x.dtype;
  const bool uniform = p.out.dtype == t && (p.dy.data == nullptr || p.dy.dtype == t);
  return uniform ? static_cast<int>(t) : kAnyDType;
}

inline bool rows_contiguous(const RowPlan& p) {
  return p.x.step == 1 && p.out.step == 1 && (p.dy.data == nullptr || p.dy.step == 1);
}

// Calls body(format) with the format of the plan's rows: fixed for the head dim of
// Qwen-Image (and most attention models) in contiguous rows of one dtype, rounded
// through that dtype or not at all after the normalisation, which is how a model calls
// these ops; run-time otherwise.
template <class Body>
void with_format_of_rows(const RowPlan& p, const Body& body) {
  if (p.d != 128 || !rows_contiguous(p)) {
    body(RowFormat<0, kAnyDType>{p.d});
    return;
  }
  constexpr int kF32 = static_cast<int>(DType::F32);
  constexpr int kBF16 = static_cast<int>(DType::BF16);
  constexpr int kF16 = static_cast<int>(DType::F16);
  const int rows = uniform_dtype(p);
  const int norm = static_cast<int>(norm_rounding(p.norm));
  if (rows == kF32 && norm == kF32) {
    body(RowFormat<128, kF32>{});
  } else if (rows == kBF16 && norm == kBF16) {
    body(RowFormat<128, kBF16>{});
  } else if (rows == kBF16 && norm == kF32) {
    body(RowFormat<128, kBF16, kF32>{});
  } else if (rows == kF16 && norm == kF16) {
    body(RowFormat<128, kF16>{});
  } else if (rows == kF16 && norm == kF32) {
    body(RowFormat<128, kF16, kF32>{});
  } else {
    body(RowFormat<128, kAnyDType>{});
  }
}

// ---- Where rows are ----------------------------------------------------------------

// Where one row is in each tensor of the plan (element offsets), and its RoPE table row.
// No default member initialisers: arrays of places are filled by RowWalk before use,
// and zeroing them first cost a `rep stos` per batch (4 instructions per row).
struct RowPlace {
  std::int64_t x;
  std::int64_t dy;
  std::int64_t out;
  std::int64_t table_row;
};

// The places of rows begin, begin + 1, ... (leading indices in row-major order). x and
// out are always walked, dy and the table row only for the kernels that read them
// (kDy, kTable; the others' stay 0): a dead offset still cost an add, a store and a
// register per row. A step of the innermost index adds that dim's strides to the
// offsets instead of recomputing them from the indices (three multiplies and two adds
// per tensor), which an index wrap still does. Carrying cut the batched kernels'
// instructions (bf16 fused forward 1.165 -> 1.140 per byte) at the same speed, and
// RoPE's (bf16 0.548 -> 0.521) at 0.93-1.10x its speed on a Zen 4 host (2026-12-04,
// three shapes and dtypes, AVX2 and AVX-512). One A/B run on 2026-12-03's Xeon had
// RoPE 35% slower with it (not reproduced: that VM is gone, and had no hardware
// counters; docs/cpu-backend.md).
template <bool kDy, bool kTable>
class RowWalk {
 public:
  RowWalk(const RowPlan& p, std::int64_t row) : plan_(p) {
    for (int dim = kLeadingDims - 1; dim >= 0; --dim) {
      index_[dim] = row % p.extents[dim];
      row /= p.extents[dim];
    }
    inner_ = {p.x.strides[kInner], kDy ? p.dy.strides[kInner] : 0, p.out.strides[kInner],
              kTable && p.rope.seq_dim == kInner ? 1 : 0};
    recompute();
  }
  const RowPlace& place() const { return place_; }
  KA_INLINE void next() {
    if (++index_[kInner] < plan_.extents[kInner]) {
      place_.x += inner_.x;
      if constexpr (kDy) place_.dy += inner_.dy;
      place_.out += inner_.out;
      if constexpr (kTable) place_.table_row += inner_.table_row;
      return;
    }
    index_[kInner] = 0;
    for (int dim = kInner - 1; dim > 0; --dim) {
      if (++index_[dim] < plan_.extents[dim]) return recompute();
      index_[dim] = 0;
    }
    ++index_[0];
    recompute();
  }

 private:
  static constexpr int kInner = kLeadingDims - 1;
  static std::int64_t offset(const std::int64_t (&index)[kLeadingDims],
                             const std::int64_t (&strides)[kLeadingDims]) {
    return index[0] * strides[0] + index[1] * strides[1] + index[2] * strides[2];
  }
  void recompute() {
    place_ = {offset(index_, plan_.x.strides), kDy ? offset(index_, plan_.dy.strides) : 0,
              offset(index_, plan_.out.strides),
              kTable ? plan_.rope.seq_offset + index_[plan_.rope.seq_dim] : 0};
  }

  const RowPlan& plan_;
  std::int64_t index_[kLeadingDims];
  RowPlace inner_;  // what one step of the innermost index adds
  RowPlace place_;
};

// ---- Loading chunks ----------------------------------------------------------------

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

template <class Elem, class Format, class Load>
KA_INLINE auto load_chunk_as(const Elem* row, std::int64_t step, int c, Format format,
                             const Load& load) {
  if constexpr (Format::kContiguous) {
    return load(row + c * kLanes);
  } else {
    const int count = format.count(c);
    if (step == 1 && count == kLanes) return load(row + c * kLanes);
    Elem chunk[kLanes];
    gather(row + c * kLanes * step, step, count, chunk);
    return load(chunk);
  }
}

// Chunk c of the row at data[offset] (elements `step` apart, of `dtype`), widened to
// fp32; +0 past the row's end.
template <class V, class Format>
KA_INLINE typename V::F load_chunk(const void* data, DType dtype, std::int64_t offset,
                                   std::int64_t step, int c, Format format) {
  switch (format.dtype(dtype)) {
    case DType::F32:
      return load_chunk_as(static_cast<const float*>(data) + offset, step, c, format,
                           [](const float* p) { return V::load_f32(p); });
    case DType::BF16:
      return load_chunk_as(static_cast<const std::uint16_t*>(data) + offset, step, c, format,
                           [](const std::uint16_t* p) { return V::load_bf16(p); });
    case DType::F16:
      return load_chunk_as(static_cast<const std::uint16_t*>(data) + offset, step, c, format,
                           [](const std::uint16_t* p) { return V::load_f16(p); });
    case DType::Bool:  // never a row's dtype (validation)
      break;
  }
  return V::zero();
}

template <class V, class Format>
KA_INLINE typename V::F load_chunk(const RowInput& in, std::int64_t offset, int c, Format format) {
  return load_chunk<V>(in.data, in.dtype, offset, in.step, c, format);
}

// ---- Rows of a batch, as the kernels read them twice (sums, then outputs) ------------
//
// fp32 rows in a contiguous format are read where they are, the second time from L1:
// copying them to a stack row cost a store per chunk and made fp32 slower out of cache
// than it was before the rows had a compile-time format (docs/performance.md, the
// fp32 slow-down since ed3834e: the copies' stores alias the next rows' loads). Every
// other row is widened once into a stack row, which costs one store per chunk against
// the two instructions per 8 lanes of widening it again.

template <class V, class Format, int kRowCount>
class StagedRows {
 public:
  using F = typename V::F;
  static constexpr int kRows = kRowCount;
  KA_INLINE void load(int b, const RowInput& in, std::int64_t offset, Format format) {
    for (int c = 0; c < format.chunks(); ++c) chunks_[b][c] = load_chunk<V>(in, offset, c, format);
  }
  KA_INLINE void set(int b, int c, F value) { chunks_[b][c] = value; }
  // By reference: g++ copies a returned AVX2 two-register value through the stack in
  // 16-byte pieces, which the 32-byte loads after it cannot forward from (measured: +12%
  // instructions for the bf16 rmsnorm backward, and stalls).
  KA_INLINE const F& chunk(int b, int c) const { return chunks_[b][c]; }

 private:
  F chunks_[kRowCount][Format::kCapacity];
};

template <class V, class Format, int kRowCount>
class InPlaceRows {
 public:
  static constexpr int kRows = kRowCount;
  KA_INLINE void load(int b, const RowInput& in, std::int64_t offset, Format) {
    rows_[b] = static_cast<const float*>(in.data) + offset;
  }
  KA_INLINE typename V::F chunk(int b, int c) const { return V::load_f32(rows_[b] + c * kLanes); }

 private:
  const float* rows_[kRowCount] = {};
};

template <class Format>
constexpr bool kReadsInPlace = Format::kContiguous&& Format::kDType == static_cast<int>(DType::F32);

template <class V, class Format, int kRows>
using InputRows = std::conditional_t<kReadsInPlace<Format>, InPlaceRows<V, Format, kRows>,
                                     StagedRows<V, Format, kRows>>;

// Rows per batch of the normalising kernels. A forward row's sum of squares is one chain
// of dependent adds in the contract's order; the chains of 4 staged rows are interleaved
// chunk by chunk so that they overlap. The backwards go one row at a time: their rows
// have two chains (squares and dot products) and more work per chunk around them, and
// batches of 4 were slower (A/B on a Zen 4 host, 2026-12-04, bf16/fp16, 3 shapes:
// 1 row 1.04-1.26x faster on AVX-512, 0.99-1.24x on AVX2, 4-7% fewer instructions;
// docs/performance.md). Rows read in place are not batched: their loop is short enough
// for the out-of-order window to overlap consecutive rows by itself, and loading 4 rows
// chunk by chunk made fp32 10-25% slower (4 interleaved streams instead of one).
template <class Format, bool kBackward>
constexpr int kBatchRows = kBackward || kReadsInPlace<Format> || Format::kCapacity > 16 ? 1 : 4;

// ---- Storing chunks ----------------------------------------------------------------

// Non-temporal stores skip reading each output line before writing it (measured
// +40% over plain stores for streams of tens of MiB on a Zen 3 core, +40% on Zen 5),
// but an output that would have stayed in cache for its reader is then read back from
// memory. They are used for outputs of at least kStreamingMinBytes in all, about half
// a large L3.
constexpr std::int64_t kStreamingMinBytes = std::int64_t{16} << 20;

// Whether a call stores its output non-temporally: a large output whose rows all start
// on a chunk-size boundary (then every full chunk does; a two-chunk one where the path
// stores bf16 chunks in pairs, put_chunk), as a framework's allocations do, and that is
// not written over an input: a row read just before is in cache, where a plain store
// needs no read for ownership either, and streaming it out made in-place RoPE 1.2-1.4x
// slower than out of place. Decided once per call: deciding per chunk cost about 12
// scalar instructions per 8 lanes, and deciding per row made g++ hoist the loads both
// branches share above the branch and spill them (+40% instructions for fp32 RoPE).
// kStreamsHalves: whether a 16-bit output may be streamed at all. The fused forward and
// the rmsnorm backward are bound by vector instructions in bf16 and fp16, not by memory
// (docs/cpu-backend.md, Speed), and plain stores made them 5-20% faster than streaming
// on 2026-12-04's Zen 4 at 1 and 2 threads; the rmsnorm forward and RoPE, lighter, were
// faster streamed at 2 threads, and the fused backward's fp16 3-10% faster streamed.
template <class V, bool kStreamsHalves>
bool streams_output(const RowPlan& p) {
  const std::int64_t rows = p.extents[0] * p.extents[1] * p.extents[2];
  const bool halves = p.out.dtype != DType::F32;
  if (halves && !kStreamsHalves) return false;
  const std::int64_t element_bytes = halves ? 2 : 4;
  if (p.out.step != 1 || rows * p.d * element_bytes < kStreamingMinBytes) return false;
  if (p.out.data == p.x.data || p.out.data == p.dy.data) return false;
  const std::int64_t grain_chunks = p.out.dtype == DType::BF16 && V::kNarrowsPairs ? 2 : 1;
  // Chunk sizes are powers of two: masks, not divisions.
  const std::uint64_t misaligned = element_bytes * kLanes * grain_chunks - 1;
  std::uint64_t offsets = reinterpret_cast<std::uintptr_t>(p.out.data);
  for (int dim = 0; dim < kLeadingDims; ++dim) {
    if (p.extents[dim] > 1)
      offsets |= static_cast<std::uint64_t>(p.out.strides[dim] * element_bytes);
  }
  return (offsets & misaligned) == 0;
}

// The one place where a call's run-time facts become compile-time ones: calls
// body(format, stream) with the format of the plan's rows (with_format_of_rows) and
// std::bool_constant<streams_output<V, kStreamsHalves>(p)>. A path without non-temporal
// stores gets no streaming copy of its kernels, nor does a format of fixed 16-bit rows
// that is never streamed: it would only store the same way at twice the code (the
// portable path's copy cost g++ minutes of compile time in every build).
template <class V, bool kStreamsHalves, class Body>
void with_row_format(const RowPlan& p, const Body& body) {
  if constexpr (V::kStreams) {
    const bool stream = streams_output<V, kStreamsHalves>(p);
    with_format_of_rows(p, [&](auto format) {
      constexpr int kDType = decltype(format)::kDType;
      if constexpr (!kStreamsHalves && (kDType == static_cast<int>(DType::BF16) ||
                                        kDType == static_cast<int>(DType::F16))) {
        body(format, std::false_type{});
      } else {
        with_flags([&](auto known_stream) { body(format, known_stream); }, stream);
      }
    });
  } else {
    with_format_of_rows(p, [&](auto format) { body(format, std::false_type{}); });
  }
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
KA_INLINE typename V::F canonical_nan_unless(typename V::F v) {
  if constexpr (kNaNFree) {
    return v;
  } else {
    return V::canonical_nan(v);
  }
}

inline bool is_finite(float v) {
  return (contract::bits_of(v) & 0x7FFFFFFFu) < 0x7F800000u;
}

template <class V, bool kStream, class Elem, class Format, class Convert>
KA_INLINE void store_chunk_as(Elem* row, std::int64_t step, int c, Format format,
                              const Convert& convert) {
  Elem* const p = Format::kContiguous ? row + c * kLanes : row + c * kLanes * step;
  if (Format::kContiguous || (step == 1 && c < format.full_chunks())) {
    if constexpr (kStream) {
      V::stream(p, convert());
    } else {
      V::store(p, convert());
    }
    return;
  }
  Elem chunk[kLanes];
  V::store(chunk, convert());
  scatter(chunk, format.count(c), p, step);
}

// contract::store_output of chunk c of the output row at out.data[offset]; kNaNFree: no
// lane of value is NaN; kStream: full chunks are stored non-temporally (streams_output).
template <class V, bool kNaNFree, bool kStream, class Format>
KA_INLINE void store_chunk(const RowOutput& out, std::int64_t offset, int c, Format format,
                           typename V::F value) {
  switch (format.dtype(out.dtype)) {
    case DType::F32:
      store_chunk_as<V, kStream>(static_cast<float*>(out.data) + offset, out.step, c, format,
                                 [&] { return canonical_nan_unless<V, kNaNFree>(value); });
      return;
    case DType::BF16:
      store_chunk_as<V, kStream>(
          static_cast<std::uint16_t*>(out.data) + offset, out.step, c, format,
          [&] { return V::to_bf16(canonical_nan_unless<V, kNaNFree>(value)); });
      return;
    case DType::F16:
      store_chunk_as<V, kStream>(
          static_cast<std::uint16_t*>(out.data) + offset, out.step, c, format,
          [&] { return V::to_f16(canonical_nan_unless<V, kNaNFree>(value)); });
      return;
    case DType::Bool:  // never a row's dtype (validation)
      return;
  }
}

// Whether path V stores the rows of Format two chunks at a time (put_chunk): contiguous
// bf16 rows of whole chunk pairs where the path narrows bf16 pairs (V::kNarrowsPairs).
// One vpermt2w narrows a pair where two shift + vpmovdw pairs were, and a streamed
// output is written in whole 64-byte lines (bf16 kernels 1.05-1.2x faster on
// 2026-12-04's Zen 4). fp16 pairs, two vcvtps2ph joined by a vinserti64x4, were as
// often slower as faster there and are not made.
template <class V, class Format>
constexpr bool stores_pairs() {
  if constexpr (V::kNarrowsPairs) {
    return Format::kContiguous && Format::kCapacity % 2 == 0 &&
           Format::kDType == static_cast<int>(DType::BF16);
  } else {
    return false;
  }
}

// store_chunk for chunks put in ascending order (c = 0, 1, ...) within a row, which
// `pending` (one per row) carries from an even chunk to the next where the row is
// stored in pairs (stores_pairs). A free function of the row's place rather than an
// object holding it: with such an object g++ kept each chunk's store address in a
// register of its own (8 lea per row; fp16 rmsnorm forward 14-27% slower).
template <class V, bool kNaNFree, bool kStream, class Format>
KA_INLINE void put_chunk(const RowOutput& out, std::int64_t offset, int c, Format format,
                         typename V::F value, typename V::F& pending) {
  if constexpr (stores_pairs<V, Format>()) {
    if (c % 2 == 0) {
      pending = value;
      return;
    }
    std::uint16_t* const p = static_cast<std::uint16_t*>(out.data) + offset + (c - 1) * kLanes;
    const auto pair = V::to_bf16_pair(canonical_nan_unless<V, kNaNFree>(pending),
                                      canonical_nan_unless<V, kNaNFree>(value));
    if constexpr (kStream) {
      V::stream(p, pair);
    } else {
      V::store(p, pair);
    }
  } else {
    store_chunk<V, kNaNFree, kStream>(out, offset, c, format, value);
  }
}

// contract::round_through of 16 elements: the values a tensor of `dtype` would hold;
// kNaNFree: no lane of v is NaN (round_f16 needs no select either way).
template <class V, bool kNaNFree = false>
KA_INLINE typename V::F round_through(DType dtype, typename V::F v) {
  switch (dtype) {
    case DType::F32:
    case DType::Bool:  // never a row's dtype (validation)
      return v;
    case DType::BF16:
      return V::round_bf16(canonical_nan_unless<V, kNaNFree>(v));
    case DType::F16:
      return V::round_f16(v);
  }
  return v;
}

// ---- RMSNorm steps ---------------------------------------------------------------

// The weight, or the contract's fp32 ones when there is none, and whether every
// element is finite and nonzero: then mul(t, w_i) is NaN only where t is (finite or
// infinite t gives a finite or infinite product; 0 * Inf needs a zero or Inf operand).
template <class V, class Format>
struct RowWeight {
  typename V::F chunk[Format::kCapacity];
  bool finite_nonzero = true;
};

// Once per kernel call. The weight's elements may be `weight_step` apart whatever the
// format, so it is read through the run-time format of its length.
template <class V, class Format>
void load_weight(const NormParams& norm, Format format, RowWeight<V, Format>& weight) {
  const RowFormat<0, kAnyDType> any{format.length()};
  weight.finite_nonzero = true;
  for (int c = 0; c < format.chunks(); ++c) {
    if (norm.weight == nullptr) {
      weight.chunk[c] = V::broadcast(1.0f);
      continue;
    }
    weight.chunk[c] = load_chunk<V>(norm.weight, norm.weight_dtype, 0, norm.weight_step, c, any);
    float lanes[kLanes];
    V::store(lanes, weight.chunk[c]);
    for (int j = 0; j < any.count(c); ++j) {
      weight.finite_nonzero = weight.finite_nonzero && is_finite(lanes[j]) && lanes[j] != 0.0f;
    }
  }
}

// contract::rms_normalized of 16 elements, r = the row's rstd in every lane;
// kNaNFree: the row is NaN-free (rms_row_nan_free).
template <class V, bool kNaNFree = false, class Format>
KA_INLINE typename V::F normalized(const NormParams& norm, Format format, typename V::F r,
                                   typename V::F x) {
  return round_through<V, kNaNFree>(format.norm_dtype(norm), V::mul(x, r));
}

// contract::rms_forward of 16 elements.
template <class V, bool kNaNFree = false, class Format>
KA_INLINE typename V::F rms_forward(const NormParams& norm, Format format, typename V::F r,
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
// forward's final store keeps the select. The backwards round the same x_i * rstd
// through the weight's dtype for their dw terms, so that rounding drops the select
// under the first two conditions (the weight does not enter it). RoPE alone (user
// tables are unbounded and x may hold Inf) and the backwards' dx (rstd * g - x * coef
// may be Inf - Inf) have no condition this cheap and keep the select everywhere.
inline bool rms_row_nan_free(float sum_squares, float rstd, bool weight_finite_nonzero) {
  return is_finite(sum_squares) && is_finite(rstd) && weight_finite_nonzero;
}

// Whether rounding through a format's fixed dtype (kAnyDType: not fixed) may have a NaN
// select for NaN-free rows to drop: only bf16's has one (round_f16 has none, fp32's is
// the identity). Formats without one take a single path: a second copy of the row loop
// would cost code and registers for nothing (measured in the fused forward: +7%
// instructions per byte for fp32, +1.5% for fp16).
constexpr bool rounding_has_select(int fixed_dtype) {
  return fixed_dtype == kAnyDType || fixed_dtype == static_cast<int>(DType::BF16);
}

// The forward's row constants: each row's sum of squares and contract::row_rstd.
template <int kRows>
struct RowRstd {
  float sum_squares[kRows];
  float rstd[kRows];
};

// The rows are loaded whole first, then summed from the stack: loading each chunk as it
// is summed (widen, store, square, add in one loop) saves the load per 8 lanes that
// reads a chunk back, but made the bf16 and fp16 rmsnorm forward 15-25% slower on
// 2026-12-03's Xeon (AVX2 path), and on 2026-12-05's the AVX-512 path 0.80-1.03x as
// fast while AVX2 ran 1.02-1.18x faster (A/B runs; docs/performance.md, 2026-12-05).
template <class V, class Format, class Rows, int kRows = Rows::kRows>
KA_INLINE void rstd_of_rows(const NormParams& norm, Format format, const Rows& x,
                            RowRstd<kRows>& out) {
  typename V::F squares[kRows];
  for (auto& s : squares) s = V::zero();
  for (int c = 0; c < format.chunks(); ++c) {
    for (int b = 0; b < kRows; ++b) {
      const auto& xc = x.chunk(b, c);
      squares[b] = V::add(squares[b], V::mul(xc, xc));
    }
  }
  for (int b = 0; b < kRows; ++b) {
    out.sum_squares[b] = V::tree_reduce(squares[b]);
    out.rstd[b] = contract::rms_rstd(out.sum_squares[b], format.length(), norm.eps);
  }
}

// The block sums of dw (contract section 5) over the rows a backward kernel call
// computes, kept in registers or on the stack across its rows and added into the
// caller's dw_partial once at the end (the same adds, in the same order, as adding
// each row into dw_partial: that starts at +0 for each block).
template <class V, class Format>
class DwSums {
 public:
  explicit DwSums(Format format) {
    for (int c = 0; c < format.chunks(); ++c) sums_[c] = V::zero();
  }
  KA_INLINE void add(int c, typename V::F terms) { sums_[c] = V::add(sums_[c], terms); }
  // dw_partial[i] = add(dw_partial[i], sum i) for the row's d elements.
  void add_to(float* dw_partial, Format format) const {
    for (int c = 0; c < format.chunks(); ++c) {
      float lanes[kLanes];
      V::store(lanes, sums_[c]);
      for (int j = 0; j < format.count(c); ++j) {
        dw_partial[c * kLanes + j] = contract::add(dw_partial[c * kLanes + j], lanes[j]);
      }
    }
  }

 private:
  typename V::F sums_[Format::kCapacity];
};

// The rmsnorm backward of a batch of rows with upstream gradients g (dy, or the fused
// backward's rotated dy): stores each row's dx and, when dw is not null, adds each
// row's dw terms mul(g_i, n_i) into it, rows in order.
template <class V, bool kStream, class Format, class XRows, class GRows, int kRows = XRows::kRows>
KA_INLINE void rms_backward_rows(const NormParams& norm, const RowWeight<V, Format>& weight,
                                 Format format, const XRows& x, const GRows& g,
                                 const RowOutput& out, const RowPlace (&at)[kRows],
                                 DwSums<V, Format>* dw) {
  using F = typename V::F;
  F squares[kRows];
  F dots[kRows];
  for (int b = 0; b < kRows; ++b) squares[b] = dots[b] = V::zero();
  for (int c = 0; c < format.chunks(); ++c) {
    for (int b = 0; b < kRows; ++b) {
      const auto& xc = x.chunk(b, c);
      squares[b] = V::add(squares[b], V::mul(xc, xc));
      dots[b] = V::add(dots[b], V::mul(V::mul(g.chunk(b, c), weight.chunk[c]), xc));
    }
  }
  for (int b = 0; b < kRows; ++b) {
    // contract::rms_backward_row from the two sums.
    const float sum_squares = V::tree_reduce(squares[b]);
    const contract::RmsBackwardRow row =
        contract::rms_backward_constants(contract::rms_rstd(sum_squares, format.length(), norm.eps),
                                         V::tree_reduce(dots[b]), format.length());
    const F r = V::broadcast(row.rstd);
    const F k = V::broadcast(row.coef);
    const auto output_pass = [&](auto has_dw, auto nan_free) KA_INLINE_LAMBDA {
      F pending = V::zero();
      for_each_chunk(format, [&](int c) KA_INLINE_LAMBDA {
        const auto& xc = x.chunk(b, c);
        const auto& gc = g.chunk(b, c);
        if constexpr (has_dw) {
          dw->add(c, V::mul(gc, normalized<V, nan_free>(norm, format, r, xc)));
        }
        put_chunk<V, false, kStream>(out, at[b].out, c, format,
                                     V::sub(V::mul(r, V::mul(gc, weight.chunk[c])), V::mul(xc, k)),
                                     pending);
      });
    };
    if (dw == nullptr) {
      output_pass(std::false_type{}, std::false_type{});
    } else {
      // The dw terms' normalised values are the forward's (x * rstd rounded through the
      // weight's dtype), NaN-free under the forward's condition on x alone: the weight
      // does not enter them. dx keeps its select (rstd * g - x * coef may be Inf - Inf).
      with_flags([&](auto nan_free) KA_INLINE_LAMBDA { output_pass(std::true_type{}, nan_free); },
                 rounding_has_select(Format::kNormDType) &&
                     rms_row_nan_free(sum_squares, row.rstd, /*weight_finite_nonzero=*/true));
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

// Not inlined, on purpose: inlined, g++ 12 turns the whole table into 2 x 8 (AVX2: 32)
// separate register values that live across the row loop, spills them and copies the
// spills around every row (+40% instructions for fp32 RoPE). Called once per token.
template <class V, class Format>
[[gnu::noinline]] void expand_table_row(const RopeParams& rope, std::int64_t table_row,
                                        Format format, typename V::F* cos, typename V::F* sin) {
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
KA_INLINE const RotationTable<V, Format>& table_for(const RopeParams& rope, std::int64_t table_row,
                                                    Format format,
                                                    RotationTable<V, Format>& table) {
  if (table.row != table_row) {
    expand_table_row<V>(rope, table_row, format, table.cos, table.sin);
    table.row = table_row;
  }
  return table;
}

// Calls consume(c, chunk c of the rotation of x) for every chunk of a row in ascending
// order (c = 0, 1, ...: put_chunk needs it), where produce(c) gives chunk c of x; each
// chunk is produced once, and the chunks a rotated chunk depends on are produced before
// it is consumed (so an output may be its input). Lanes past the row's end are +0 in the
// rotation when they are in x.
// The three kernels that rotate feed it differently (a loaded chunk, a normalised one,
// a gradient row to fill), hence the two functions rather than a row buffer.
template <class V, class Format, class Produce, class Consume>
KA_INLINE void rotate_chunks(const RopeParams& rope, const RotationTable<V, Format>& table,
                             Format format, const Produce& produce, const Consume& consume) {
  using F = typename V::F;
  const auto rotated = [&](int c, F x, F partner) KA_INLINE_LAMBDA {
    return V::add(V::mul(x, table.cos[c]), V::mul(partner, table.sin[c]));
  };
  const int d = format.length();
  // The interleaved loop (Qwen-Image's pairing, the benchmark's case) is unrolled over a
  // whole D = 128 row: that drops each chunk's pointer increments and branch (bf16 RoPE
  // 12% fewer instructions than rolled; unrolled 2 or 4 times, 7% and 9%) and,
  // with the table expanded out of line (expand_table_row), g++ no longer hoists and
  // spills the table's loads as it did when this loop was first unrolled (+35% then).
  // The half-split loop stays rolled: no benchmark case measures an unrolled copy.
  if (rope.interleaved) {
    // Pairs are adjacent lanes of one chunk (a row's length is even).
    const int chunks = format.chunks();
#pragma GCC unroll 8
    for (int c = 0; c < chunks; ++c) {
      const F x = produce(c);
      consume(c, rotated(c, x, V::swap_pairs(x)));
    }
  } else if (d % (2 * kLanes) == 0) {
    // The partner of chunk c is chunk c + chunks/2, and the other way round: the row is
    // produced whole, then consumed in order.
    const int chunks = format.chunks();
    const int half_chunks = chunks / 2;
    F x[Format::kCapacity];
#pragma GCC unroll 1
    for (int c = 0; c < chunks; ++c) x[c] = produce(c);
#pragma GCC unroll 1
    for (int c = 0; c < chunks; ++c) {
      consume(c, rotated(c, x[c], x[c < half_chunks ? c + half_chunks : c - half_chunks]));
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
// Each reads a row whole (or, for RoPE, the chunks an output chunk needs) before it
// writes it: an output may be its input (in place). Each works on a local copy of its
// plan: a vector store may alias any memory, so fields read through the caller's
// reference would be reloaded after every store (measured with g++ 12), while a local
// whose address stays inside the kernel may not. The batch functions are inlined into
// their kernel for the same reason.

// The places of the next kRows rows, from `row` on.
template <int kRows, class Walk>
KA_INLINE void next_places(Walk& row, RowPlace (&at)[kRows]) {
  for (int b = 0; b < kRows; ++b, row.next()) at[b] = row.place();
}

// ---- rmsnorm forward

template <class V, bool kStream, int kRows, class Format, class Walk>
KA_INLINE void rmsnorm_forward_batch(const RowPlan& p, Format format,
                                     const RowWeight<V, Format>& weight, Walk& row) {
  RowPlace at[kRows];
  next_places(row, at);
  InputRows<V, Format, kRows> x;
  for (int b = 0; b < kRows; ++b) x.load(b, p.x, at[b].x, format);
  RowRstd<kRows> rows;
  rstd_of_rows<V>(p.norm, format, x, rows);
  for (int b = 0; b < kRows; ++b) {
    const typename V::F r = V::broadcast(rows.rstd[b]);
    // Every output dtype's store has a select to drop.
    with_flags(
        [&](auto nan_free) KA_INLINE_LAMBDA {
          typename V::F pending = V::zero();
          for_each_chunk(format, [&](int c) KA_INLINE_LAMBDA {
            put_chunk<V, nan_free, kStream>(
                p.out, at[b].out, c, format,
                rms_forward<V, nan_free>(p.norm, format, r, x.chunk(b, c), weight.chunk[c]),
                pending);
          });
        },
        rms_row_nan_free(rows.sum_squares[b], rows.rstd[b], weight.finite_nonzero));
  }
}

// The loop nest of rmsnorm forward over rows [begin, end) in one row format.
template <class V, bool kStream, class Format>
void rmsnorm_forward_rows(const RowPlan& plan, Format format, std::int64_t begin,
                          std::int64_t end) {
  const RowPlan p = plan;
  constexpr int kBatch = kBatchRows<Format, /*kBackward=*/false>;
  RowWeight<V, Format> weight;
  load_weight<V>(p.norm, format, weight);
  RowWalk</*kDy=*/false, /*kTable=*/false> row(p, begin);
  std::int64_t r = begin;
  for (; end - r >= kBatch; r += kBatch) {
    rmsnorm_forward_batch<V, kStream, kBatch>(p, format, weight, row);
  }
  for (; r < end; ++r) rmsnorm_forward_batch<V, kStream, 1>(p, format, weight, row);
  if constexpr (kStream) V::stream_fence();
}

template <class V>
void rmsnorm_forward_kernel(const RowPlan& plan, std::int64_t begin, std::int64_t end, float*) {
  with_row_format<V, /*kStreamsHalves=*/true>(plan, [&](auto format, auto stream) {
    rmsnorm_forward_rows<V, stream>(plan, format, begin, end);
  });
}

// ---- rmsnorm backward

template <class V, bool kStream, int kRows, class Format, class Walk>
KA_INLINE void rmsnorm_backward_batch(const RowPlan& p, Format format,
                                      const RowWeight<V, Format>& weight, Walk& row,
                                      DwSums<V, Format>* dw) {
  RowPlace at[kRows];
  next_places(row, at);
  InputRows<V, Format, kRows> x;
  InputRows<V, Format, kRows> dy;
  for (int b = 0; b < kRows; ++b) {
    x.load(b, p.x, at[b].x, format);
    dy.load(b, p.dy, at[b].dy, format);
  }
  rms_backward_rows<V, kStream>(p.norm, weight, format, x, dy, p.out, at, dw);
}

// The loop nest of rmsnorm backward over rows [begin, end) in one row format.
template <class V, bool kStream, class Format>
void rmsnorm_backward_rows(const RowPlan& plan, Format format, std::int64_t begin, std::int64_t end,
                           float* dw_partial) {
  const RowPlan p = plan;
  constexpr int kBatch = kBatchRows<Format, /*kBackward=*/true>;
  RowWeight<V, Format> weight;
  load_weight<V>(p.norm, format, weight);
  DwSums<V, Format> dw(format);
  DwSums<V, Format>* const dw_sums = dw_partial != nullptr ? &dw : nullptr;
  RowWalk</*kDy=*/true, /*kTable=*/false> row(p, begin);
  std::int64_t r = begin;
  for (; end - r >= kBatch; r += kBatch) {
    rmsnorm_backward_batch<V, kStream, kBatch>(p, format, weight, row, dw_sums);
  }
  for (; r < end; ++r) rmsnorm_backward_batch<V, kStream, 1>(p, format, weight, row, dw_sums);
  if (dw_sums != nullptr) dw.add_to(dw_partial, format);
  if constexpr (kStream) V::stream_fence();
}

template <class V>
void rmsnorm_backward_kernel(const RowPlan& plan, std::int64_t begin, std::int64_t end,
                             float* dw_partial) {
  with_row_format<V, /*kStreamsHalves=*/false>(plan, [&](auto format, auto stream) {
    rmsnorm_backward_rows<V, stream>(plan, format, begin, end, dw_partial);
  });
}

// ---- RoPE

// The loop nest of rope over rows [begin, end) in one row format.
template <class V, bool kStream, class Format>
void rope_rows(const RowPlan& plan, Format format, std::int64_t begin, std::int64_t end) {
  const RowPlan p = plan;
  RotationTable<V, Format> table;
  RowWalk</*kDy=*/false, /*kTable=*/true> row(p, begin);
  for (std::int64_t r = begin; r < end; ++r, row.next()) {
    const RowPlace at = row.place();
    typename V::F pending = V::zero();
    rotate_chunks<V>(
        p.rope, table_for<V>(p.rope, at.table_row, format, table), format,
        [&](int c) KA_INLINE_LAMBDA { return load_chunk<V>(p.x, at.x, c, format); },
        [&](int c, typename V::F y) KA_INLINE_LAMBDA {
          put_chunk<V, false, kStream>(p.out, at.out, c, format, y, pending);
        });
  }
  if constexpr (kStream) V::stream_fence();
}

template <class V>
void rope_kernel(const RowPlan& plan, std::int64_t begin, std::int64_t end, float*) {
  with_row_format<V, /*kStreamsHalves=*/true>(
      plan, [&](auto format, auto stream) { rope_rows<V, stream>(plan, format, begin, end); });
}

// ---- fused forward: rope(rmsnorm(x)) through a row of out's dtype (the unfused ops'
// intermediate tensor)

template <class V, bool kStream, int kRows, class Format, class Walk>
KA_INLINE void norm_rope_forward_batch(const RowPlan& p, Format format,
                                       const RowWeight<V, Format>& weight,
                                       RotationTable<V, Format>& table, Walk& row) {
  RowPlace at[kRows];
  next_places(row, at);
  InputRows<V, Format, kRows> x;
  for (int b = 0; b < kRows; ++b) x.load(b, p.x, at[b].x, format);
  RowRstd<kRows> rows;
  rstd_of_rows<V>(p.norm, format, x, rows);
  for (int b = 0; b < kRows; ++b) {
    const RotationTable<V, Format>& t = table_for<V>(p.rope, at[b].table_row, format, table);
    const typename V::F r = V::broadcast(rows.rstd[b]);
    // NaN-free up to the intermediate tensor only (rms_row_nan_free): the store after the
    // rotation keeps its select.
    with_flags(
        [&](auto nan_free) KA_INLINE_LAMBDA {
          typename V::F pending = V::zero();
          rotate_chunks<V>(
              p.rope, t, format,
              [&](int c) KA_INLINE_LAMBDA {
                return round_through<V, nan_free>(
                    format.dtype(p.out.dtype),
                    rms_forward<V, nan_free>(p.norm, format, r, x.chunk(b, c), weight.chunk[c]));
              },
              [&](int c, typename V::F y) KA_INLINE_LAMBDA {
                put_chunk<V, false, kStream>(p.out, at[b].out, c, format, y, pending);
              });
        },
        rounding_has_select(Format::kDType) &&
            rms_row_nan_free(rows.sum_squares[b], rows.rstd[b], weight.finite_nonzero));
  }
}

// The loop nest of norm rope forward over rows [begin, end) in one row format.
template <class V, bool kStream, class Format>
void norm_rope_forward_rows(const RowPlan& plan, Format format, std::int64_t begin,
                            std::int64_t end) {
  const RowPlan p = plan;
  constexpr int kBatch = kBatchRows<Format, /*kBackward=*/false>;
  RowWeight<V, Format> weight;
  load_weight<V>(p.norm, format, weight);
  RotationTable<V, Format> table;
  RowWalk</*kDy=*/false, /*kTable=*/true> row(p, begin);
  std::int64_t r = begin;
  for (; end - r >= kBatch; r += kBatch) {
    norm_rope_forward_batch<V, kStream, kBatch>(p, format, weight, table, row);
  }
  for (; r < end; ++r) norm_rope_forward_batch<V, kStream, 1>(p, format, weight, table, row);
  if constexpr (kStream) V::stream_fence();
}

template <class V>
void norm_rope_forward_kernel(const RowPlan& plan, std::int64_t begin, std::int64_t end, float*) {
  with_row_format<V, /*kStreamsHalves=*/false>(plan, [&](auto format, auto stream) {
    norm_rope_forward_rows<V, stream>(plan, format, begin, end);
  });
}

// ---- fused backward: the rmsnorm backward of (x, g), g = the transpose rotation of dy
// through a row of dy's dtype (the unfused ops' intermediate tensor)

template <class V, bool kStream, int kRows, class Format, class Walk>
KA_INLINE void norm_rope_backward_batch(const RowPlan& p, Format format,
                                        const RowWeight<V, Format>& weight,
                                        RotationTable<V, Format>& table, Walk& row,
                                        DwSums<V, Format>* dw) {
  RowPlace at[kRows];
  next_places(row, at);
  InputRows<V, Format, kRows> x;
  StagedRows<V, Format, kRows> g;
  for (int b = 0; b < kRows; ++b) {
    x.load(b, p.x, at[b].x, format);
    rotate_chunks<V>(
        p.rope, table_for<V>(p.rope, at[b].table_row, format, table), format,
        [&](int c) KA_INLINE_LAMBDA { return load_chunk<V>(p.dy, at[b].dy, c, format); },
        [&](int c, typename V::F gc)
            KA_INLINE_LAMBDA { g.set(b, c, round_through<V>(format.dtype(p.dy.dtype), gc)); });
  }
  rms_backward_rows<V, kStream>(p.norm, weight, format, x, g, p.out, at, dw);
}

// The loop nest of norm rope backward over rows [begin, end) in one row format.
template <class V, bool kStream, class Format>
void norm_rope_backward_rows(const RowPlan& plan, Format format, std::int64_t begin,
                             std::int64_t end, float* dw_partial) {
  const RowPlan p = plan;
  constexpr int kBatch = kBatchRows<Format, /*kBackward=*/true>;
  RowWeight<V, Format> weight;
  load_weight<V>(p.norm, format, weight);
  RotationTable<V, Format> table;
  DwSums<V, Format> dw(format);
  DwSums<V, Format>* const dw_sums = dw_partial != nullptr ? &dw : nullptr;
  RowWalk</*kDy=*/true, /*kTable=*/true> row(p, begin);
  std::int64_t r = begin;
  for (; end - r >= kBatch; r += kBatch) {
    norm_rope_backward_batch<V, kStream, kBatch>(p, format, weight, table, row, dw_sums);
  }
  for (; r < end; ++r) {
    norm_rope_backward_batch<V, kStream, 1>(p, format, weight, table, row, dw_sums);
  }
  if (dw_sums != nullptr) dw.add_to(dw_partial, format);
  if constexpr (kStream) V::stream_fence();
}

template <class V>
void norm_rope_backward_kernel(const RowPlan& plan, std::int64_t begin, std::int64_t end,
                               float* dw_partial) {
  with_row_format<V, /*kStreamsHalves=*/true>(plan, [&](auto format, auto stream) {
    norm_rope_backward_rows<V, stream>(plan, format, begin, end, dw_partial);
  });
}

// The table of path V (constant-initialised: no code runs before main).
// ---- adaln_modulation and adaln_gate_residual

// The rows' format for the modulations: their run-time length, and their one dtype fixed
// where x, y (dy) and out share it (no dtype dispatch per chunk: the rows are a model's
// D = 3072 wide).
template <class Body>
void with_modulation_format(const RowPlan& p, const Body& body) {
  switch (uniform_dtype(p)) {
    case static_cast<int>(DType::F32):
      return body(RowFormat<0, static_cast<int>(DType::F32)>{p.d});
    case static_cast<int>(DType::BF16):
      return body(RowFormat<0, static_cast<int>(DType::BF16)>{p.d});
    case static_cast<int>(DType::F16):
      return body(RowFormat<0, static_cast<int>(DType::F16)>{p.d});
    default:
      return body(RowFormat<0, kAnyDType>{p.d});
  }
}

// Calls body(std::bool_constant<streams_output(p)>): false on a path without non-temporal
// stores.
template <class V, class Body>
void with_stream_flag(const RowPlan& p, const Body& body) {
  if constexpr (V::kStreams) {
    with_flags(body, streams_output<V, /*kStreamsHalves=*/true>(p));
  } else {
    body(std::false_type{});
  }
}

// Calls body(format, stream, diffusers) with the compile-time facts of a modulation call:
// its rows' format (with_modulation_format), whether it streams its output
// (with_stream_flag) and whether it rounds as diffusers does (std::bool_constant each).
template <class V, class Body>
void with_modulation_call(const RowPlan& plan, const Body& body) {
  with_modulation_format(plan, [&](auto format) {
    with_stream_flag<V>(plan, [&](auto stream) {
      with_flags([&](auto diffusers) { body(format, stream, diffusers); },
                 plan.modulation.mode == contract::NormMode::Diffusers);
    });
  });
}

// Sample b's vector, widened to fp32 chunks (+0 past the row's end).
template <class V, class Format>
void load_sample_vector(const SampleVector& v, std::int64_t b, Format format,
                        typename V::F (&chunks)[Format::kCapacity]) {
  const RowFormat<0, kAnyDType> any{format.length()};
  for (int c = 0; c < format.chunks(); ++c) {
    chunks[c] = load_chunk<V>(v.data, v.dtype, b * v.sample_stride, v.step, c, any);
  }
}

// The sample's factors 1 + scale (rounded through scale's dtype where kDiffusers).
template <class V, bool kDiffusers, class Format>
void load_factors(const ModulationParams& m, std::int64_t b, Format format,
                  typename V::F (&factor)[Format::kCapacity]) {
  load_sample_vector<V>(m.scale, b, format, factor);
  for (int c = 0; c < format.chunks(); ++c) {
    factor[c] = V::add(V::broadcast(1.0f), factor[c]);
    if constexpr (kDiffusers) factor[c] = round_through<V>(m.scale.dtype, factor[c]);
  }
}

// A row's LayerNorm statistics (contract::layernorm_row) in every lane. The row's two sums
// (the mean, then the squares about it) take the row tree: one 16-lane accumulator chunk
// by chunk, then the tree halving, the tail chunk's lanes past the row's end +0 in both
// (its x lanes are +0; its centred lanes are cleared).
template <class V>
struct LayerNormLanes {
  typename V::F mean;
  typename V::F rstd;
};

template <class V, class Format, class Rows>
KA_INLINE LayerNormLanes<V> layernorm_lanes(const Rows& x, Format format, float eps) {
  using F = typename V::F;
  const auto length = static_cast<float>(format.length());
  const int last = format.chunks() - 1;
  F sum = V::zero();
  for (int c = 0; c < format.chunks(); ++c) sum = V::add(sum, x.chunk(0, c));
  const F mean = V::broadcast(contract::div(V::tree_reduce(sum), length));
  F squares = V::zero();
  for (int c = 0; c < format.chunks(); ++c) {
    F centred = V::sub(x.chunk(0, c), mean);
    if (c == last) centred = V::keep_first(centred, format.count(c));
    squares = V::add(squares, V::mul(centred, centred));
  }
  const float var = contract::div(V::tree_reduce(squares), length);
  return {mean, V::broadcast(contract::div(1.0f, contract::sqrt_rn(contract::add(var, eps))))};
}

// contract::adaln_forward over rows [begin, end): y = LayerNorm(x) * (1 + scale) + shift
// with kDiffusers' roundings.
template <class V, bool kStream, bool kDiffusers, class Format>
void adaln_forward_rows(const RowPlan& plan, Format format, std::int64_t begin, std::int64_t end) {
  using F = typename V::F;
  const RowPlan p = plan;
  const std::int64_t seq = p.extents[kLeadingDims - 1];
  const DType x_dtype = format.dtype(p.x.dtype);
  const DType out_dtype = format.dtype(p.out.dtype);
  F factor[Format::kCapacity];  // the sample's 1 + scale
  F shift[Format::kCapacity];
  std::int64_t sample = -1;
  RowWalk</*kDy=*/false, /*kTable=*/false> row(p, begin);
  for (std::int64_t r = begin; r < end; ++r, row.next()) {
    if (const std::int64_t b = r / seq; b != sample) {
      load_factors<V, kDiffusers>(p.modulation, b, format, factor);
      load_sample_vector<V>(p.modulation.shift, b, format, shift);
      sample = b;
    }
    const RowPlace at = row.place();
    InputRows<V, Format, 1> x;
    x.load(0, p.x, at.x, format);
    const LayerNormLanes<V> stats = layernorm_lanes<V>(x, format, p.modulation.eps);
    F pending = V::zero();
    for_each_chunk(format, [&](int c) KA_INLINE_LAMBDA {
      F n = V::mul(V::sub(x.chunk(0, c), stats.mean), stats.rstd);
      if constexpr (kDiffusers) n = round_through<V>(x_dtype, n);
      F product = V::mul(n, factor[c]);
      if constexpr (kDiffusers) product = round_through<V>(out_dtype, product);
      put_chunk<V, false, kStream>(p.out, at.out, c, format, V::add(product, shift[c]), pending);
    });
  }
  if constexpr (kStream) V::stream_fence();
}

template <class V>
void adaln_forward_kernel(const RowPlan& plan, std::int64_t begin, std::int64_t end, float*) {
  with_modulation_call<V>(plan, [&](auto format, auto stream, auto diffusers) {
    adaln_forward_rows<V, stream, diffusers>(plan, format, begin, end);
  });
}

// contract's adaln backward over rows [begin, end): with n = (x - mean) * rstd (fp32) and
// g = dy * (1 + scale), dx = rstd * ((g - sum(g) / D) - n * (sum(g n) / D)), both sums by
// the row tree; and, where dw_partial is given (rows of one sample), the row's dscale
// terms dy * n' (n' rounded through x's dtype where kDiffusers) and dshift terms dy added
// into it, rows in order. Each row is read whole before its dx is written: dx may be x
// or dy.
template <class V, bool kStream, bool kDiffusers, class Format>
void adaln_backward_rows(const RowPlan& plan, Format format, std::int64_t begin, std::int64_t end,
                         float* partial) {
  using F = typename V::F;
  const RowPlan p = plan;
  const std::int64_t seq = p.extents[kLeadingDims - 1];
  const auto length = static_cast<float>(format.length());
  const DType x_dtype = format.dtype(p.x.dtype);
  const bool sums_scale = partial != nullptr && p.modulation.sums_scale;
  const bool sums_shift = partial != nullptr && p.modulation.sums_shift;
  F factor[Format::kCapacity];
  std::int64_t sample = -1;
  DwSums<V, Format> dscale(format);
  DwSums<V, Format> dshift(format);
  RowWalk</*kDy=*/true, /*kTable=*/false> row(p, begin);
  for (std::int64_t r = begin; r < end; ++r, row.next()) {
    if (const std::int64_t b = r / seq; b != sample) {
      load_factors<V, kDiffusers>(p.modulation, b, format, factor);
      sample = b;
    }
    const RowPlace at = row.place();
    InputRows<V, Format, 1> x;
    InputRows<V, Format, 1> dy;
    x.load(0, p.x, at.x, format);
    dy.load(0, p.dy, at.dy, format);
    const LayerNormLanes<V> stats = layernorm_lanes<V>(x, format, p.modulation.eps);
    F sum_g = V::zero();
    F sum_gn = V::zero();
    const auto sums = [&](auto scale_sums, auto shift_sums) KA_INLINE_LAMBDA {
      for (int c = 0; c < format.chunks(); ++c) {
        const F n = V::mul(V::sub(x.chunk(0, c), stats.mean), stats.rstd);
        const F g = V::mul(dy.chunk(0, c), factor[c]);
        sum_g = V::add(sum_g, g);
        sum_gn = V::add(sum_gn, V::mul(g, n));
        if constexpr (scale_sums) {
          const F modulated = kDiffusers ? round_through<V>(x_dtype, n) : n;
          dscale.add(c, V::mul(dy.chunk(0, c), modulated));
        }
        if constexpr (shift_sums) dshift.add(c, dy.chunk(0, c));
      }
    };
    with_flags(sums, sums_scale, sums_shift);
    const F mean_g = V::broadcast(contract::div(V::tree_reduce(sum_g), length));
    const F mean_gn = V::broadcast(contract::div(V::tree_reduce(sum_gn), length));
    F pending = V::zero();
    for_each_chunk(format, [&](int c) KA_INLINE_LAMBDA {
      const F n = V::mul(V::sub(x.chunk(0, c), stats.mean), stats.rstd);
      const F g = V::mul(dy.chunk(0, c), factor[c]);
      put_chunk<V, false, kStream>(
          p.out, at.out, c, format,
          V::mul(stats.rstd, V::sub(V::sub(g, mean_g), V::mul(n, mean_gn))), pending);
    });
  }
  if (sums_scale) dscale.add_to(partial, format);
  if (sums_shift) dshift.add_to(partial + (sums_scale ? format.length() : 0), format);
  if constexpr (kStream) V::stream_fence();
}

template <class V>
void adaln_backward_kernel(const RowPlan& plan, std::int64_t begin, std::int64_t end,
                           float* partial) {
  with_modulation_call<V>(plan, [&](auto format, auto stream, auto diffusers) {
    adaln_backward_rows<V, stream, diffusers>(plan, format, begin, end, partial);
  });
}

// contract::gate_residual_forward over rows [begin, end): out = x + gate * y, the product
// rounded through out's dtype where kRound (diffusers mode).
template <class V, bool kStream, bool kRound, class Format>
void gate_forward_rows(const RowPlan& plan, Format format, std::int64_t begin, std::int64_t end) {
  const RowPlan p = plan;
  const std::int64_t seq = p.extents[kLeadingDims - 1];
  typename V::F gate[Format::kCapacity];
  std::int64_t sample = -1;  // whose gate `gate` holds
  RowWalk</*kDy=*/true, /*kTable=*/false> row(p, begin);
  for (std::int64_t r = begin; r < end; ++r, row.next()) {
    if (const std::int64_t b = r / seq; b != sample) {
      load_sample_vector<V>(p.modulation.gate, b, format, gate);
      sample = b;
    }
    const RowPlace at = row.place();
    typename V::F pending = V::zero();
    for_each_chunk(format, [&](int c) KA_INLINE_LAMBDA {
      typename V::F product = V::mul(gate[c], load_chunk<V>(p.dy, at.dy, c, format));
      if constexpr (kRound) product = round_through<V>(format.dtype(p.out.dtype), product);
      put_chunk<V, false, kStream>(p.out, at.out, c, format,
                                   V::add(load_chunk<V>(p.x, at.x, c, format), product), pending);
    });
  }
  if constexpr (kStream) V::stream_fence();
}

template <class V>
void gate_forward_kernel(const RowPlan& plan, std::int64_t begin, std::int64_t end, float*) {
  with_modulation_call<V>(plan, [&](auto format, auto stream, auto diffusers) {
    gate_forward_rows<V, stream, diffusers>(plan, format, begin, end);
  });
}

// The gate's backward over rows [begin, end): dy = gate * dout into out, and, where
// dgate is asked for (rows of one sample), its terms dout * y added into it, rows in
// order. Each chunk is read before it is written: dy may be dout or y.
template <class V, bool kStream, class Format>
void gate_backward_rows(const RowPlan& plan, Format format, std::int64_t begin, std::int64_t end,
                        float* dgate_partial) {
  const RowPlan p = plan;
  const std::int64_t seq = p.extents[kLeadingDims - 1];
  typename V::F gate[Format::kCapacity];
  std::int64_t sample = -1;
  DwSums<V, Format> dgate(format);
  RowWalk</*kDy=*/true, /*kTable=*/false> row(p, begin);
  for (std::int64_t r = begin; r < end; ++r, row.next()) {
    if (const std::int64_t b = r / seq; b != sample) {
      load_sample_vector<V>(p.modulation.gate, b, format, gate);
      sample = b;
    }
    const RowPlace at = row.place();
    const auto chunks = [&](auto sums) KA_INLINE_LAMBDA {
      typename V::F pending = V::zero();
      for_each_chunk(format, [&](int c) KA_INLINE_LAMBDA {
        const typename V::F dout = load_chunk<V>(p.x, at.x, c, format);
        if constexpr (sums) dgate.add(c, V::mul(dout, load_chunk<V>(p.dy, at.dy, c, format)));
        put_chunk<V, false, kStream>(p.out, at.out, c, format, V::mul(gate[c], dout), pending);
      });
    };
    with_flags(chunks, dgate_partial != nullptr);
  }
  if (dgate_partial != nullptr) dgate.add_to(dgate_partial, format);
  if constexpr (kStream) V::stream_fence();
}

template <class V>
void gate_backward_kernel(const RowPlan& plan, std::int64_t begin, std::int64_t end,
                          float* dgate_partial) {
  with_modulation_format(plan, [&](auto format) {
    with_stream_flag<V>(plan, [&](auto stream) {
      gate_backward_rows<V, stream>(plan, format, begin, end, dgate_partial);
    });
  });
}

template <class V>
constexpr RowKernels row_kernels_of() {
  return {.rmsnorm_forward = &rmsnorm_forward_kernel<V>,
          .rmsnorm_backward = &rmsnorm_backward_kernel<V>,
          .rope = &rope_kernel<V>,
          .norm_rope_forward = &norm_rope_forward_kernel<V>,
          .norm_rope_backward = &norm_rope_backward_kernel<V>,
          .adaln_forward = &adaln_forward_kernel<V>,
          .adaln_backward = &adaln_backward_kernel<V>,
          .gate_residual_forward = &gate_forward_kernel<V>,
          .gate_residual_backward = &gate_backward_kernel<V>};
}

}  // namespace
}  // namespace kernel_align::cpu
