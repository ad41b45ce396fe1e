// Argument checks of every op, and the call each validated call becomes (api/call.hpp):
// every tensor argument is listed once, in the record, and the aliasing rule and the
// device check read that list. Each failure names the argument, what was expected and
// what was found (kernel_align::Error). Messages are built only when a check fails: a
// valid call allocates nothing here.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "api/call.hpp"
#include "kernel_align/contract/rmsnorm.hpp"
#include "kernel_align/error.hpp"

namespace kernel_align::detail {
namespace {

// 2^56 elements of 4 bytes, summed over four dims, stay far below 2^63.
constexpr std::int64_t kMaxViewElements = std::int64_t{1} << 56;

// The pieces of a phrase, joined only when a check fails and its message is built.
using Words = std::initializer_list<std::string_view>;

std::string joined(Words words) {
  std::string text;
  for (const std::string_view w : words) text += w;
  return text;
}

constexpr std::string_view kRowsRank = "rank 1 to 4 ([..., D])";
constexpr std::string_view kVectorRank = "rank 1 ([D])";

// The checks of every tensor argument but its dtype.
void check_view_extents(const char* name, const ConstTensorView& v, int min_rank, int max_rank,
                        Words rank_meaning) {
  if (v.rank < min_rank || v.rank > max_rank) {
    throw Error(name, joined(rank_meaning), "rank " + std::to_string(v.rank));
  }
  // Shapes first: an empty tensor (torch's have a null data pointer) is told as such.
  for (int i = 0; i < v.rank; ++i) {
    if (v.shape[i] <= 0) throw Error(name, "a non-empty tensor (every dim > 0)", describe(v));
    if (v.strides[i] < 0) throw Error(name, "non-negative strides", describe(v));
  }
  // Every count and offset the ops compute (elements, rows, the last element's offset,
  // in elements and in bytes) then fits int64 with room to spare: no overflow anywhere.
  std::int64_t elements = 1;
  std::int64_t last = 0;
  for (int i = 0; i < v.rank; ++i) {
    std::int64_t span = 0;
    if (__builtin_mul_overflow(elements, v.shape[i], &elements) || elements > kMaxViewElements ||
        __builtin_mul_overflow(v.shape[i] - 1, v.strides[i], &span) ||
        __builtin_add_overflow(last, span, &last) || last > kMaxViewElements) {
      throw Error(name, "a view of at most 2^56 elements and element offsets", describe(v));
    }
  }
  if (v.data == nullptr) throw Error(name, "a non-null data pointer", "null");
  // Elements are read as whole fp32/bf16/fp16 words.
  const std::size_t align = dtype_size(v.dtype);
  if (const std::size_t off = reinterpret_cast<std::uintptr_t>(v.data) % align; off != 0) {
    throw Error(name, "a data pointer aligned to its dtype's " + std::to_string(align) + " bytes",
                "one " + std::to_string(off) + " byte(s) past such an address");
  }
}

// A tensor of numbers: every argument but a mask.
void check_view(const char* name, const ConstTensorView& v, int min_rank, int max_rank,
                Words rank_meaning) {
  check_view_extents(name, v, min_rank, max_rank, rank_meaning);
  if (!is_floating(v.dtype)) {
    throw Error(name, "a floating-point dtype (fp32, bf16 or fp16)",
                std::string("dtype ") + dtype_name(v.dtype));
  }
}

int check_head_dim(const char* name, std::int64_t d) {
  if (d < 2 || d > kMaxHeadDim || d % 2 != 0) {
    throw Error(name, "an even last dim D from 2 to " + std::to_string(kMaxHeadDim),
                "D = " + std::to_string(d));
  }
  return static_cast<int>(d);
}

void check_same_shape(const char* name, const ConstTensorView& v, const char* reference_name,
                      const ConstTensorView& reference) {
  bool same = v.rank == reference.rank;
  for (int i = 0; same && i < v.rank; ++i) same = v.shape[i] == reference.shape[i];
  if (!same) {
    throw Error(name, "shape " + shape_string(reference) + " (the shape of " + reference_name + ")",
                "shape " + shape_string(v));
  }
}

// Element offset one past the last element the view can touch.
std::int64_t extent(const ConstTensorView& v) {
  std::int64_t last = 0;
  for (int i = 0; i < v.rank; ++i) last += (v.shape[i] - 1) * v.strides[i];
  return last + 1;
}

// Sufficient condition for distinct elements: ordered by stride, each dim steps
// past everything the smaller-stride dims span.
void check_distinct_elements(const char* name, const ConstTensorView& v) {
  // Insertion sort of at most 4 dims (std::sort trips g++ 12's -Warray-bounds).
  std::array<int, kMaxRank> order{};
  for (int i = 0; i < v.rank; ++i) {
    int j = i;
    for (; j > 0 && v.strides[order[j - 1]] > v.strides[i]; --j) order[j] = order[j - 1];
    order[j] = i;
  }
  std::int64_t spanned = 1;
  for (int k = 0; k < v.rank; ++k) {
    const int dim = order[k];
    if (v.shape[dim] == 1) continue;
    if (v.strides[dim] < spanned) {
      throw Error(name, "an output whose elements do not overlap", describe(v));
    }
    spanned = v.strides[dim] * (v.shape[dim] - 1) + spanned;
  }
}

bool same_view(const ConstTensorView& a, const ConstTensorView& b) {
  return a.data == b.data && a.dtype == b.dtype && a.rank == b.rank && a.shape == b.shape &&
         a.strides == b.strides;
}

// ---- Whether two views share a byte ------------------------------------------------
//
// An element of a starts at byte a.data + sum_k A_k i_k (A_k: a's strides in bytes,
// 0 <= i_k < a.shape[k]), one of b at b.data + sum_k B_k j_k; they share a byte when
// their starts differ by less than the element sizes. So a and b overlap exactly when
//   sum_k A_k i_k - sum_k B_k j_k  lies in  [delta - size_a + 1, delta + size_b - 1]
// (delta = b.data - a.data) for some indices in bounds: a bounded integer equation in at
// most 2 * kMaxRank unknowns, decided as follows.
// 1. Byte ranges [first byte, last byte] apart: no overlap. The quick accept, and all
//    that tensors of different allocations need.
// 2. Otherwise each dim of size > 1 and stride > 0 becomes a term coef * c: a's with c in
//    [0, n - 1], b's with c in [-(n - 1), 0] (dims of size 1 or stride 0 move nothing).
//    Terms of one coefficient merge into one whose range is the sum of theirs (c1 + c2
//    takes every value between), so views with the same strides (q and k of a packed
//    QKV, the halves of a buffer, interleaved elements) give one term per dim.
// 3. A depth-first search over the terms, the largest coefficient first, fixes one c at
//    a time, keeping only the values for which the remaining terms can still reach the
//    window (their sum spans a known interval) and the window still holds a multiple of
//    the remaining coefficients' gcd (every sum of them is one: the strides' lattice,
//    which rules out interleaved elements). Reaching the end with 0 in the window is an
//    overlapping pair of elements; exhausting the values proves there is none. Where each
//    dim steps past everything the smaller ones span (any dense layout, and its slices,
//    permutations and strided subsets), a term keeps at most a few values and the search
//    visits a handful of nodes. Layouts that interleave in other ways can need many: after
//    kOverlapSearchNodes the search stops and the overlap counts as not ruled out, which
//    validation refuses (saying so), never accepts.
//
// Every quantity fits int64: check_view bounds a view's last offset by 2^56 elements
// (2^58 bytes), the search only runs when the byte ranges intersect (|delta| <= 2^58),
// and a merged term spans at most a's span plus b's.

enum class Overlap { None, Some, Undecided };

constexpr std::int64_t kOverlapSearchNodes = std::int64_t{1} << 14;

std::int64_t floor_div(std::int64_t n, std::int64_t d) {  // d > 0
  return n / d - (n % d != 0 && n < 0 ? 1 : 0);
}

std::int64_t ceil_div(std::int64_t n, std::int64_t d) {  // d > 0
  return -floor_div(-n, d);
}

class OverlapSearch {
 public:
  OverlapSearch(const ConstTensorView& a, const ConstTensorView& b) {
    add_dims(a, 1);
    add_dims(b, -1);
    for (int k = count_ - 1; k >= 0; --k) {
      const Term& t = terms_[k];
      min_[k] = min_[k + 1] + t.coef * t.lo;
      max_[k] = max_[k + 1] + t.coef * t.hi;
      gcd_[k] = std::gcd(gcd_[k + 1], t.coef);
    }
  }

  // Whether a sum of the terms lies in [low, high].
  Overlap reaches(std::int64_t low, std::int64_t high) {
    if (search(0, low, high)) return Overlap::Some;
    return exhausted_ ? Overlap::Undecided : Overlap::None;
  }

 private:
  struct Term {
    std::int64_t coef;  // bytes, > 0
    std::int64_t lo, hi;
  };

  // The view's dims as terms, with c's sign `sign`: kept sorted by decreasing
  // coefficient, one per coefficient.
  void add_dims(const ConstTensorView& v, int sign) {
    const auto size = static_cast<std::int64_t>(dtype_size(v.dtype));
    for (int i = 0; i < v.rank; ++i) {
      if (v.shape[i] == 1 || v.strides[i] == 0) continue;
      const std::int64_t coef = v.strides[i] * size;
      const std::int64_t lo = sign > 0 ? 0 : 1 - v.shape[i];
      const std::int64_t hi = sign > 0 ? v.shape[i] - 1 : 0;
      int k = 0;
      while (k < count_ && terms_[k].coef > coef) ++k;
      if (k < count_ && terms_[k].coef == coef) {
        terms_[k].lo += lo;
        terms_[k].hi += hi;
        continue;
      }
      for (int m = count_; m > k; --m) terms_[m] = terms_[m - 1];
      terms_[k] = {coef, lo, hi};
      ++count_;
    }
  }

  bool search(int k, std::int64_t low, std::int64_t high) {
    if (k == count_) return low <= 0 && 0 <= high;
    if (high < min_[k] || low > max_[k]) return false;
    if (floor_div(high, gcd_[k]) * gcd_[k] < low) return false;
    const Term& t = terms_[k];
    const std::int64_t first = std::max(t.lo, ceil_div(low - max_[k + 1], t.coef));
    const std::int64_t last = std::min(t.hi, floor_div(high - min_[k + 1], t.coef));
    for (std::int64_t c = first; c <= last; ++c) {
      if (++nodes_ > kOverlapSearchNodes) {
        exhausted_ = true;
        return false;
      }
      if (search(k + 1, low - c * t.coef, high - c * t.coef)) return true;
      if (exhausted_) return false;
    }
    return false;
  }

  static constexpr int kMaxTerms = 2 * kMaxRank;
  std::array<Term, kMaxTerms> terms_{};
  int count_ = 0;
  // Over terms k.. : the smallest and largest sums, and the gcd of the coefficients
  // (gcd(0, x) = x starts it).
  std::array<std::int64_t, kMaxTerms + 1> min_{}, max_{}, gcd_{};
  std::int64_t nodes_ = 0;
  bool exhausted_ = false;
};

Overlap overlap(const ConstTensorView& a, const ConstTensorView& b) {
  const auto a_size = static_cast<std::int64_t>(dtype_size(a.dtype));
  const auto b_size = static_cast<std::int64_t>(dtype_size(b.dtype));
  const auto a_begin = reinterpret_cast<std::uintptr_t>(a.data);
  const auto b_begin = reinterpret_cast<std::uintptr_t>(b.data);
  const std::uintptr_t a_end = a_begin + static_cast<std::uintptr_t>(extent(a) * a_size);
  const std::uintptr_t b_end = b_begin + static_cast<std::uintptr_t>(extent(b) * b_size);
  if (a_end <= b_begin || b_end <= a_begin) return Overlap::None;
  const auto delta = static_cast<std::int64_t>(b_begin - a_begin);
  return OverlapSearch(a, b).reaches(delta - a_size + 1, delta + b_size - 1);
}

TensorArg input(const char* name, const ConstTensorView& view) {
  return {name, name, view, false, {}};
}

TensorArg output(const char* name, const ConstTensorView& view,
                 std::array<const char*, 2> in_place_of = {}) {
  return {name, name, view, true, in_place_of};
}

// Whether `out` may be exactly the input `in` (in place).
bool may_be(const TensorArg& out, const TensorArg& in) {
  return std::any_of(out.in_place_of.begin(), out.in_place_of.end(),
                     [&](const char* n) { return n != nullptr && std::string_view(n) == in.name; });
}

// Contract section 7, checked over every pair of a call's tensors in one place: an
// output's elements do not overlap each other; an output is exactly one of the inputs it
// may replace (in place) or lies apart from every input, weights and tables included,
// and from every other output. Anything in between would let a kernel read what it
// already overwrote. "Apart" is sharing no byte (overlap(): views whose byte ranges
// interleave without a common element, such as q and k of a packed QKV, are apart).
void check_aliasing(const TensorArgs& tensors) {
  for (const TensorArg* out = tensors.begin(); out != tensors.end(); ++out) {
    if (!out->output) continue;
    check_distinct_elements(out->argument, out->view);
    for (const TensorArg* other = tensors.begin(); other != tensors.end(); ++other) {
      // A pair of outputs is reported once, naming the later one.
      if (other == out || (other->output && other > out)) continue;
      const bool in_place = !other->output && may_be(*out, *other);
      if (in_place && same_view(out->view, other->view)) continue;
      const Overlap found = overlap(out->view, other->view);
      if (found == Overlap::None) continue;
      throw Error(out->argument,
                  in_place ? "memory apart from '" + std::string(other->argument) +
                                 "' or exactly the same view"
                           : "memory apart from '" + std::string(other->argument) + "'",
                  found == Overlap::Some
                      ? "an overlapping view " + describe(out->view)
                      : "a view interleaved with it in a way whose overlap could not be ruled "
                        "out (too many index combinations to check) " +
                            describe(out->view));
    }
  }
}

void check_eps(float eps) {
  if (!std::isfinite(eps) || eps < 0.0f) {
    throw Error("eps", "a finite number >= 0", std::to_string(eps));
  }
}

// The one device every tensor of the call lives on; an Error names two that differ.
Device one_device(const TensorArgs& tensors) {
  const TensorArg& first = tensors.front();
  for (const TensorArg& t : tensors) {
    if (t.view.device != first.view.device) {
      throw Error(t.argument,
                  "a tensor on " + device_name(first.view.device) + ", where '" + first.argument +
                      "' is (every tensor of a call on one device)",
                  "one on " + device_name(t.view.device));
    }
  }
  return first.view.device;
}

// The checks of a whole call, once its tensors are listed: the aliasing rule, eps
// (where the op has one) and one device; the record then holds that device.
void check_call(CallRecord& record) {
  if (record.options.size() != descriptor(record.op).option_count) {
    throw std::logic_error(std::string("a call record of ") + op_type_name(record.op) +
                           " without every option of its descriptor");
  }
  check_aliasing(record.tensors);
  if (const OptionValue* eps = record.option("eps")) check_eps(eps->number);
  record.device = one_device(record.tensors);
}

CallRecord record_of(OpType op, Direction direction, DType output_dtype) {
  CallRecord record;
  record.op = op;
  record.direction = direction;
  record.output_dtype = output_dtype;
  return record;
}

// Appends the value of the record's next option: its name and kind must be the
// descriptor's (a mismatch is the library's bug).
void add_option(CallRecord& record, const OptionValue& value) {
  const auto specs = descriptor(record.op).options();
  const auto i = static_cast<std::size_t>(record.options.size());
  if (i >= specs.size() || std::string_view(specs[i].name) != value.name ||
      specs[i].kind != value.kind) {
    throw std::logic_error(std::string("option ") + value.name + " out of the order of " +
                           op_type_name(record.op) + "'s descriptor");
  }
  record.options.push_back(value);
}

OptionValue choice(const char* name, const char* value) {
  return {name, OptionKind::Choice, value, 0.0f, 0};
}
OptionValue fp32_value(const char* name, float value) {
  return {name, OptionKind::Float, "", value, 0};
}
OptionValue integer_value(const char* name, std::int64_t value) {
  return {name, OptionKind::Integer, "", 0.0f, value};
}

CallRecord rmsnorm_record(Direction direction, const RmsNormOptions& options, DType output_dtype) {
  CallRecord record = record_of(OpType::QkRmsNorm, direction, output_dtype);
  add_option(record, choice("mode", norm_mode_name(options.mode)));
  add_option(record, fp32_value("eps", options.eps));
  return record;
}

// The dw blocks of a backward call that computes a weight gradient.
void record_dw_blocks(CallRecord& record) {
  record.block_sizes.push_back({"dw_block_rows", contract::kDwBlockRows});
}

void check_weight(const std::optional<ConstTensorView>& weight, int d) {
  if (!weight) return;
  check_view("weight", *weight, 1, 1, {kVectorRank});
  if (weight->shape[0] != d) {
    throw Error("weight", "length " + std::to_string(d) + " (D of x)",
                "length " + std::to_string(weight->shape[0]));
  }
}

void check_table(const char* name, const ConstTensorView& table, std::int64_t seq, int d,
                 const char* layout) {
  check_view(name, table, 2, 2, {"rank 2 ([S, D/2])"});
  if (table.dtype != DType::F32 || table.shape[0] != seq || table.shape[1] != d / 2) {
    throw Error(name,
                "fp32 [" + std::to_string(seq) + ", " + std::to_string(d / 2) +
                    "] (S of the input in layout " + layout + ", D/2)",
                std::string(dtype_name(table.dtype)) + " " + shape_string(table));
  }
}

// The rotation of `in` into `out` (`in_name`, `out_name` in messages): shapes and
// tables checked; the aliasing rule is checked over the whole call.
RopeProblem rope_problem(const ConstTensorView& in, const ConstTensorView& cos,
                         const ConstTensorView& sin, const TensorView& out,
                         const RopeOptions& options, bool transpose, const char* in_name,
                         const char* out_name) {
  const bool bshd = options.layout == Layout::BSHD;
  const char* layout = layout_name(options.layout);
  const Words rank_meaning = {"rank 4 (layout ", layout,
                              bshd ? ": [B, S, H, D])" : ": [B, H, S, D])"};
  check_view(in_name, in, 4, 4, rank_meaning);
  const int d = check_head_dim(in_name, in.shape[3]);
  check_view(out_name, out, 4, 4, rank_meaning);
  check_same_shape(out_name, out, in_name, in);
  // The layout, not a flattened row index, says which dim is the sequence.
  const std::int64_t seq = in.shape[bshd ? 1 : 2];
  check_table("cos", cos, seq, d, layout);
  check_table("sin", sin, seq, d, layout);
  RopeProblem p;
  p.in = in;
  p.out = out;
  p.in_strides = sequence_strides(in, options.layout);
  p.out_strides = sequence_strides(out, options.layout);
  p.cos = cos;
  p.sin = sin;
  p.options = options;
  p.transpose = transpose;
  p.batch = in.shape[0];
  p.seq = seq;
  p.heads = in.shape[bshd ? 2 : 1];
  p.d = d;
  return p;
}

}  // namespace

SequenceTensor sequence_strides(const ConstTensorView& v, Layout layout) {
  const bool bshd = layout == Layout::BSHD;
  return {v.strides[0], v.strides[bshd ? 1 : 2], v.strides[bshd ? 2 : 1], v.strides[3]};
}

Call<RmsNormForwardProblem> rmsnorm_forward_call(const ConstTensorView& x,
                                                 const std::optional<ConstTensorView>& weight,
                                                 const TensorView& y,
                                                 const RmsNormOptions& options) {
  check_view("x", x, 1, kMaxRank, {kRowsRank});
  const int d = check_head_dim("x", x.shape[x.rank - 1]);
  check_weight(weight, d);
  check_view("y", y, 1, kMaxRank, {kRowsRank});
  check_same_shape("y", y, "x", x);
  Call<RmsNormForwardProblem> call{rmsnorm_record(Direction::Forward, options, y.dtype),
                                   {x, weight, y, options, d}};
  TensorArgs& tensors = call.record.tensors;
  tensors.push_back(input("x", x));
  if (weight) tensors.push_back(input("weight", *weight));
  tensors.push_back(output("y", y, {"x"}));
  check_call(call.record);
  return call;
}

Call<RmsNormBackwardProblem> rmsnorm_backward_call(const ConstTensorView& x,
                                                   const ConstTensorView& dy,
                                                   const std::optional<ConstTensorView>& weight,
                                                   const TensorView& dx,
                                                   const std::optional<TensorView>& dw,
                                                   const RmsNormOptions& options) {
  check_view("x", x, 1, kMaxRank, {kRowsRank});
  const int d = check_head_dim("x", x.shape[x.rank - 1]);
  check_view("dy", dy, 1, kMaxRank, {kRowsRank});
  check_same_shape("dy", dy, "x", x);
  check_weight(weight, d);
  check_view("dx", dx, 1, kMaxRank, {kRowsRank});
  check_same_shape("dx", dx, "x", x);
  if (dw) {
    if (!weight) throw Error("dw", "no dw without a weight", "a dw output");
    check_view("dw", *dw, 1, 1, {kVectorRank});
    check_same_shape("dw", *dw, "weight", *weight);
  }
  Call<RmsNormBackwardProblem> call{rmsnorm_record(Direction::Backward, options, dx.dtype),
                                    {x, dy, weight, dx, dw, options, d}};
  if (dw) record_dw_blocks(call.record);
  TensorArgs& tensors = call.record.tensors;
  tensors.push_back(input("x", x));
  tensors.push_back(input("dy", dy));
  if (weight) tensors.push_back(input("weight", *weight));
  // Each dx element is written after the row's x and dy elements are read.
  tensors.push_back(output("dx", dx, {"x", "dy"}));
  if (dw) tensors.push_back(output("dw", *dw));
  check_call(call.record);
  return call;
}

Call<RopeProblem> rope_call(Direction direction, const ConstTensorView& in,
                            const ConstTensorView& cos, const ConstTensorView& sin,
                            const TensorView& out, const RopeOptions& options) {
  const bool backward = direction == Direction::Backward;
  const char* in_name = backward ? "dy" : "x";
  const char* out_name = backward ? "dx" : "y";
  const RopeProblem problem = rope_problem(in, cos, sin, out, options, backward, in_name, out_name);
  Call<RopeProblem> call{record_of(OpType::MultiAxisRope, direction, out.dtype), problem};
  add_option(call.record, choice("layout", layout_name(options.layout)));
  add_option(call.record, choice("pairing", pairing_name(options.pairing)));
  TensorArgs& tensors = call.record.tensors;
  tensors.push_back(input(in_name, in));
  tensors.push_back(input("cos", cos));
  tensors.push_back(input("sin", sin));
  tensors.push_back(output(out_name, out, {in_name}));
  check_call(call.record);
  return call;
}

namespace {

// k (or dk_out) must agree with q (or dq_out) in B, S and D.
void check_matches(const ConstTensorView& k, const char* k_name, const ConstTensorView& q,
                   const char* q_name, Layout layout) {
  check_view(k_name, k, 4, 4, {"rank 4 (as ", q_name, ")"});
  const int seq_dim = layout == Layout::BSHD ? 1 : 2;
  if (k.shape[0] != q.shape[0] || k.shape[seq_dim] != q.shape[seq_dim] ||
      k.shape[3] != q.shape[3]) {
    const auto bsd = [&](const ConstTensorView& v) {
      return "B = " + std::to_string(v.shape[0]) + ", S = " + std::to_string(v.shape[seq_dim]) +
             ", D = " + std::to_string(v.shape[3]);
    };
    throw Error(k_name, bsd(q) + " (those of " + q_name + ")", bsd(k));
  }
}

void check_text_len(std::int64_t text_len, std::int64_t seq) {
  if (text_len < 0 || text_len > seq) {
    throw Error("text_len", "0 to S = " + std::to_string(seq), std::to_string(text_len));
  }
}

// One of the four norm weights of a fused call and its gradient, with their names in
// the trace and in messages.
struct WeightSlot {
  const char* weight_name;      // traced: "weight_text_q"
  const char* weight_argument;  // in messages: "weights.text_q"
  const char* grad_name;        // "dw_text_q"
  const char* grad_argument;    // "weight_grads.text_q"
  const std::optional<ConstTensorView>* weight;
  const std::optional<TensorView>* grad;  // null in the forward
  bool text;                              // text positions, else image positions
  bool q;                                 // a weight of q, else of k
};

// In the order of the API's structs and of the trace: text_q, text_k, image_q, image_k.
using WeightSlots = std::array<WeightSlot, 4>;

WeightSlots weight_slots(const QkNormWeights& w, const QkNormWeightGrads* g) {
  return {{{"weight_text_q", "weights.text_q", "dw_text_q", "weight_grads.text_q", &w.text_q,
            g ? &g->text_q : nullptr, true, true},
           {"weight_text_k", "weights.text_k", "dw_text_k", "weight_grads.text_k", &w.text_k,
            g ? &g->text_k : nullptr, true, false},
           {"weight_image_q", "weights.image_q", "dw_image_q", "weight_grads.image_q", &w.image_q,
            g ? &g->image_q : nullptr, false, true},
           {"weight_image_k", "weights.image_k", "dw_image_k", "weight_grads.image_k", &w.image_k,
            g ? &g->image_k : nullptr, false, false}}};
}

// The slots in the order of the streams (problems.hpp): q text, q image, k text, k image.
constexpr std::array<int, 4> kStreamOrder = {0, 2, 1, 3};

// Every weight has length D; every gradient has its weight and length D.
void check_weight_slots(const WeightSlots& slots, int d) {
  for (const WeightSlot& s : slots) {
    if (*s.weight) {
      check_view(s.weight_argument, **s.weight, 1, 1, {kVectorRank});
      if ((*s.weight)->shape[0] != d) {
        throw Error(s.weight_argument, "length " + std::to_string(d) + " (D of q)",
                    "length " + std::to_string((*s.weight)->shape[0]));
      }
    }
    if (s.grad == nullptr || !*s.grad) continue;
    if (!*s.weight) throw Error(s.grad_argument, "no weight gradient without its weight", "one");
    check_view(s.grad_argument, **s.grad, 1, 1, {kVectorRank});
    check_same_shape(s.grad_argument, **s.grad, s.weight_argument, **s.weight);
  }
}

void add_weights(TensorArgs& tensors, const WeightSlots& slots) {
  for (const WeightSlot& s : slots) {
    if (*s.weight) tensors.push_back({s.weight_name, s.weight_argument, **s.weight, false, {}});
  }
}

void add_weight_grads(TensorArgs& tensors, const WeightSlots& slots) {
  for (const WeightSlot& s : slots) {
    if (s.grad != nullptr && *s.grad)
      tensors.push_back({s.grad_name, s.grad_argument, **s.grad, true, {}});
  }
}

CallRecord fused_record(Direction direction, const QkNormRopeOptions& options, DType output_dtype) {
  CallRecord record = record_of(OpType::QkNormRope, direction, output_dtype);
  add_option(record, choice("layout", layout_name(options.layout)));
  add_option(record, choice("pairing", pairing_name(options.pairing)));
  add_option(record, choice("mode", norm_mode_name(options.mode)));
  add_option(record, fp32_value("eps", options.eps));
  add_option(record, integer_value("text_len", options.text_len));
  return record;
}

// Sequence range of a stream: text [0, text_len), image [text_len, S).
std::pair<std::int64_t, std::int64_t> stream_range(bool text, std::int64_t text_len,
                                                   std::int64_t seq) {
  return text ? std::pair{std::int64_t{0}, text_len} : std::pair{text_len, seq};
}

}  // namespace

Call<QkNormRopeForwardProblem> qk_norm_rope_forward_call(
    const ConstTensorView& q, const ConstTensorView& k, const QkNormWeights& weights,
    const ConstTensorView& cos, const ConstTensorView& sin, const TensorView& q_out,
    const TensorView& k_out, const QkNormRopeOptions& options) {
  const RopeOptions rope{options.pairing, options.layout};
  const RopeProblem q_rope = rope_problem(q, cos, sin, q_out, rope, false, "q", "q_out");
  check_matches(k, "k", q, "q", options.layout);
  const RopeProblem k_rope = rope_problem(k, cos, sin, k_out, rope, false, "k", "k_out");
  check_text_len(options.text_len, q_rope.seq);
  const WeightSlots slots = weight_slots(weights, nullptr);
  check_weight_slots(slots, q_rope.d);
  Call<QkNormRopeForwardProblem> call{fused_record(Direction::Forward, options, q_out.dtype), {}};
  TensorArgs& tensors = call.record.tensors;
  tensors.push_back(input("q", q));
  tensors.push_back(input("k", k));
  add_weights(tensors, slots);
  tensors.push_back(input("cos", cos));
  tensors.push_back(input("sin", sin));
  tensors.push_back(output("q_out", q_out, {"q"}));
  tensors.push_back(output("k_out", k_out, {"k"}));
  check_call(call.record);

  const RmsNormOptions norm{options.eps, options.mode};
  for (const int i : kStreamOrder) {
    const WeightSlot& slot = slots[static_cast<std::size_t>(i)];
    const RopeProblem& rp = slot.q ? q_rope : k_rope;
    const auto [begin, end] = stream_range(slot.text, options.text_len, rp.seq);
    if (begin == end) continue;
    call.problem.streams.push_back({sequence_slice(rp.in, options.layout, begin, end),
                                    sequence_slice(rp.out, options.layout, begin, end),
                                    *slot.weight, rp.in_strides, rp.out_strides, cos, sin, begin,
                                    norm, rope, rp.d});
  }
  return call;
}

Call<QkNormRopeBackwardProblem> qk_norm_rope_backward_call(
    const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& dq_out,
    const ConstTensorView& dk_out, const QkNormWeights& weights, const ConstTensorView& cos,
    const ConstTensorView& sin, const TensorView& dq, const TensorView& dk,
    const QkNormWeightGrads& weight_grads, const QkNormRopeOptions& options) {
  const RopeOptions rope{options.pairing, options.layout};
  const RopeProblem q_rope = rope_problem(dq_out, cos, sin, dq, rope, true, "dq_out", "dq");
  check_matches(dk_out, "dk_out", dq_out, "dq_out", options.layout);
  const RopeProblem k_rope = rope_problem(dk_out, cos, sin, dk, rope, true, "dk_out", "dk");
  check_view("q", q, 4, 4, {"rank 4 (the shape of dq_out)"});
  check_same_shape("q", q, "dq_out", dq_out);
  check_view("k", k, 4, 4, {"rank 4 (the shape of dk_out)"});
  check_same_shape("k", k, "dk_out", dk_out);
  check_text_len(options.text_len, q_rope.seq);
  const WeightSlots slots = weight_slots(weights, &weight_grads);
  check_weight_slots(slots, q_rope.d);
  Call<QkNormRopeBackwardProblem> call{fused_record(Direction::Backward, options, dq.dtype), {}};
  if (weight_grads.text_q || weight_grads.text_k || weight_grads.image_q || weight_grads.image_k) {
    record_dw_blocks(call.record);
  }
  TensorArgs& tensors = call.record.tensors;
  tensors.push_back(input("q", q));
  tensors.push_back(input("k", k));
  tensors.push_back(input("dq_out", dq_out));
  tensors.push_back(input("dk_out", dk_out));
  add_weights(tensors, slots);
  tensors.push_back(input("cos", cos));
  tensors.push_back(input("sin", sin));
  // dq may be dq_out or q itself (each row is read whole before it is written).
  tensors.push_back(output("dq", dq, {"dq_out", "q"}));
  tensors.push_back(output("dk", dk, {"dk_out", "k"}));
  add_weight_grads(tensors, slots);
  check_call(call.record);

  // A stream's views are slices of the call's tensors, so the call's aliasing rule
  // holds for each stream's x, dy, dx, weight and dw.
  const RmsNormOptions norm{options.eps, options.mode};
  for (const int i : kStreamOrder) {
    const WeightSlot& slot = slots[static_cast<std::size_t>(i)];
    const RopeProblem& rp = slot.q ? q_rope : k_rope;
    const ConstTensorView& x_full = slot.q ? q : k;
    const auto [begin, end] = stream_range(slot.text, options.text_len, rp.seq);
    if (begin == end) {
      // A stream without positions sums no rows: its weight gradient is +0.
      if (*slot.grad) call.problem.empty_stream_grads.push_back(**slot.grad);
      continue;
    }
    call.problem.streams.push_back({sequence_slice(x_full, options.layout, begin, end),
                                    sequence_slice(rp.in, options.layout, begin, end),
                                    sequence_slice(rp.out, options.layout, begin, end),
                                    *slot.weight, *slot.grad,
                                    sequence_strides(x_full, options.layout), rp.in_strides,
                                    rp.out_strides, cos, sin, begin, norm, rope, rp.d});
  }
  return call;
}

namespace {

constexpr std::string_view kLinearRowsRank = "rank 1 to 4 ([..., K])";

// The public enum and the contract's name the same activations in the same order.
static_assert(static_cast<int>(Activation::GeluTanh) ==
                  static_cast<int>(contract::Activation::GeluTanh) &&
              static_cast<int>(Activation::Silu) == static_cast<int>(contract::Activation::Silu));

// A view of rank 1-4 as a matrix of rows (its leading dims, flattened) by its last dim:
// the leading dims must step by one row stride (a contiguous or row-sliced tensor).
GemmMatrix rows_matrix(const char* name, const ConstTensorView& v) {
  const int last = v.rank - 1;
  std::int64_t row_stride = 0;
  bool first = true;
  for (int i = last - 1; i >= 0; --i) {
    if (v.shape[i] == 1) continue;
    if (first) {
      row_stride = v.strides[i];
      first = false;
      continue;
    }
    // Dim i must step over everything the dims after it (down to the row) span. The
    // shapes' product is below 2^56 (check_view); the step may not be: overflow is a
    // mismatch.
    std::int64_t inner = 1;
    for (int j = i + 1; j < last; ++j) inner *= v.shape[j];
    std::int64_t step = 0;
    if (__builtin_mul_overflow(row_stride, inner, &step) || v.strides[i] != step) {
      throw Error(name,
                  "leading dims that flatten to one row stride (a contiguous or row-sliced "
                  "tensor)",
                  describe(v));
    }
  }
  return {v.data, v.dtype, row_stride, v.strides[last]};
}

// y (or dy): x's leading dims and N as its last dim.
void check_rows_of(const char* name, const ConstTensorView& v, const ConstTensorView& x,
                   std::int64_t n) {
  check_view(name, v, 1, kMaxRank, {kLinearRowsRank});
  bool same = v.rank == x.rank && v.shape[v.rank - 1] == n;
  for (int i = 0; same && i < v.rank - 1; ++i) same = v.shape[i] == x.shape[i];
  if (!same) {
    ConstTensorView expected = x;
    expected.shape[x.rank - 1] = n;
    throw Error(name, "shape " + shape_string(expected) + " (the leading dims of x, N)",
                "shape " + shape_string(v));
  }
}

// x, weight and bias of a linear call; returns N.
std::int64_t check_linear_inputs(const ConstTensorView& x, const ConstTensorView& weight,
                                 const std::optional<ConstTensorView>& bias) {
  check_view("x", x, 1, kMaxRank, {kLinearRowsRank});
  check_view("weight", weight, 2, 2, {"rank 2 ([N, K])"});
  const std::int64_t k = x.shape[x.rank - 1];
  if (weight.shape[1] != k) {
    throw Error("weight", "shape [N, " + std::to_string(k) + "] (K, the last dim of x)",
                "shape " + shape_string(weight));
  }
  const std::int64_t n = weight.shape[0];
  if (bias) {
    check_view("bias", *bias, 1, 1, {"rank 1 ([N])"});
    if (bias->shape[0] != n) {
      throw Error("bias", "length " + std::to_string(n) + " (N, the rows of weight)",
                  "length " + std::to_string(bias->shape[0]));
    }
  }
  return n;
}

// x, weight and bias as the record lists them, in signature order.
void add_linear_inputs(TensorArgs& tensors, const ConstTensorView& x, const ConstTensorView& weight,
                       const std::optional<ConstTensorView>& bias) {
  tensors.push_back(input("x", x));
  tensors.push_back(input("weight", weight));
  if (bias) tensors.push_back(input("bias", *bias));
}

GemmMatrix vector_matrix(const ConstTensorView& v) {
  return {v.data, v.dtype, 0, v.strides[0]};
}

CallRecord linear_record(Direction direction, const LinearOptions& options, DType output_dtype) {
  CallRecord record = record_of(OpType::Linear, direction, output_dtype);
  add_option(record, choice("activation", activation_name(options.activation)));
  return record;
}

}  // namespace

Call<GemmProblem> linear_forward_call(const ConstTensorView& x, const ConstTensorView& weight,
                                      const std::optional<ConstTensorView>& bias,
                                      const TensorView& y, const LinearOptions& options) {
  const std::int64_t n = check_linear_inputs(x, weight, bias);
  check_rows_of("y", y, x, n);
  const GemmMatrix rows = rows_matrix("x", x);
  const GemmMatrix y_rows = rows_matrix("y", y);
  Call<GemmProblem> call{linear_record(Direction::Forward, options, y.dtype), {}};
  TensorArgs& tensors = call.record.tensors;
  add_linear_inputs(tensors, x, weight, bias);
  tensors.push_back(output("y", y));
  check_call(call.record);
  GemmProblem& p = call.problem;
  p.m = row_count(x);
  p.n = n;
  p.r = x.shape[x.rank - 1];
  p.a = rows;
  // B[r][n] = w[n][r].
  p.b = {weight.data, weight.dtype, weight.strides[1], weight.strides[0]};
  if (bias) p.bias = vector_matrix(*bias);
  p.activation = static_cast<contract::Activation>(options.activation);
  p.c = y.data;
  p.c_dtype = y.dtype;
  p.c_row_stride = y_rows.row_stride;
  p.c_col_stride = y_rows.col_stride;
  return call;
}

Call<LinearBackwardProblem> linear_backward_call(
    const ConstTensorView& x, const ConstTensorView& weight,
    const std::optional<ConstTensorView>& bias, const ConstTensorView& dy,
    const std::optional<TensorView>& dx, const std::optional<TensorView>& dw,
    const std::optional<TensorView>& db, const LinearOptions& options) {
  const std::int64_t n = check_linear_inputs(x, weight, bias);
  check_rows_of("dy", dy, x, n);
  if (dx) {
    check_view("dx", *dx, 1, kMaxRank, {kLinearRowsRank});
    check_same_shape("dx", *dx, "x", x);
  }
  if (dw) {
    check_view("dw", *dw, 2, 2, {"rank 2 ([N, K])"});
    check_same_shape("dw", *dw, "weight", weight);
  }
  if (db) {
    if (!bias) throw Error("db", "no db without a bias", "a db output");
    check_view("db", *db, 1, 1, {"rank 1 ([N])"});
    check_same_shape("db", *db, "bias", *bias);
  }
  const GemmMatrix x_rows = rows_matrix("x", x);
  const GemmMatrix dy_rows = rows_matrix("dy", dy);
  const DType output_dtype = dx ? dx->dtype : dw ? dw->dtype : db ? db->dtype : dy.dtype;
  Call<LinearBackwardProblem> call{linear_record(Direction::Backward, options, output_dtype), {}};
  TensorArgs& tensors = call.record.tensors;
  add_linear_inputs(tensors, x, weight, bias);
  tensors.push_back(input("dy", dy));
  if (dx) tensors.push_back(output("dx", *dx));
  if (dw) tensors.push_back(output("dw", *dw));
  if (db) tensors.push_back(output("db", *db));
  check_call(call.record);
  LinearBackwardProblem& p = call.problem;
  p.m = row_count(x);
  p.n = n;
  p.k = x.shape[x.rank - 1];
  p.x = x_rows;
  p.w = {weight.data, weight.dtype, weight.strides[0], weight.strides[1]};
  if (bias) p.bias = vector_matrix(*bias);
  p.dy = dy_rows;
  p.activation = static_cast<contract::Activation>(options.activation);
  if (dx) {
    const GemmMatrix dx_rows = rows_matrix("dx", *dx);
    p.dx = GemmOutput{dx->data, dx->dtype, dx_rows.row_stride, dx_rows.col_stride};
  }
  if (dw) p.dw = GemmOutput{dw->data, dw->dtype, dw->strides[0], dw->strides[1]};
  if (db) p.db = GemmOutput{db->data, db->dtype, db->strides[0], 0};
  return call;
}

namespace {

// The dims of a 4-D view in `layout` in the order (batch, sequence, head, d).
std::array<std::int64_t, 4> bshd_order(const std::array<std::int64_t, kMaxRank>& dims,
                                       Layout layout) {
  if (layout == Layout::BSHD) return {dims[0], dims[1], dims[2], dims[3]};
  return {dims[0], dims[2], dims[1], dims[3]};
}

AttentionInput attention_input(const ConstTensorView& v, Layout layout) {
  return {v.data, v.dtype, bshd_order(v.strides, layout)};
}

AttentionOutput attention_output(const TensorView& v, Layout layout) {
  return {v.data, v.dtype, bshd_order(v.strides, layout)};
}

// q, k, v and the mask of an attention call; returns q's dims as (B, S, H, D).
std::array<std::int64_t, 4> check_attention_inputs(const ConstTensorView& q,
                                                   const ConstTensorView& k,
                                                   const ConstTensorView& v,
                                                   const std::optional<ConstTensorView>& mask,
                                                   Layout layout) {
  const bool bshd = layout == Layout::BSHD;
  const std::string_view rank4 =
      bshd ? "rank 4 ([B, S, H, D], layout bshd)" : "rank 4 ([B, H, S, D], layout bhsd)";
  check_view("q", q, 4, 4, {rank4});
  const std::array<std::int64_t, 4> dims = bshd_order(q.shape, layout);
  if (dims[3] > kMaxHeadDim) {
    throw Error("q", "a last dim D from 1 to " + std::to_string(kMaxHeadDim),
                "D = " + std::to_string(dims[3]));
  }
  check_view("k", k, 4, 4, {rank4});
  check_same_shape("k", k, "q", q);
  check_view("v", v, 4, 4, {rank4});
  check_same_shape("v", v, "q", q);
  if (mask) {
    check_view_extents("mask", *mask, 2, 2, {"rank 2 ([B, S])"});
    if (mask->dtype != DType::Bool) {
      throw Error("mask", "dtype bool (true for a token that takes part)",
                  std::string("dtype ") + dtype_name(mask->dtype));
    }
    if (mask->shape[0] != dims[0] || mask->shape[1] != dims[1]) {
      throw Error(
          "mask",
          "shape [" + std::to_string(dims[0]) + ", " + std::to_string(dims[1]) + "] ([B, S] of q)",
          "shape " + shape_string(*mask));
    }
  }
  return dims;
}

void add_attention_inputs(TensorArgs& tensors, const ConstTensorView& q, const ConstTensorView& k,
                          const ConstTensorView& v, const std::optional<ConstTensorView>& mask) {
  tensors.push_back(input("q", q));
  tensors.push_back(input("k", k));
  tensors.push_back(input("v", v));
  if (mask) tensors.push_back(input("mask", *mask));
}

AttentionMask attention_mask(const std::optional<ConstTensorView>& mask) {
  if (!mask) return {};
  return {static_cast<const std::uint8_t*>(mask->data), mask->strides[0], mask->strides[1]};
}

CallRecord attention_record(Direction direction, const AttentionOptions& options,
                            DType output_dtype) {
  CallRecord record = record_of(OpType::Attention, direction, output_dtype);
  add_option(record, choice("layout", layout_name(options.layout)));
  return record;
}

}  // namespace

Call<AttentionProblem> attention_forward_call(const ConstTensorView& q, const ConstTensorView& k,
                                              const ConstTensorView& v,
                                              const std::optional<ConstTensorView>& mask,
                                              const TensorView& out,
                                              const AttentionOptions& options) {
  const Layout layout = options.layout;
  const std::array<std::int64_t, 4> dims = check_attention_inputs(q, k, v, mask, layout);
  check_view("out", out, 4, 4, {"rank 4 (the shape of q)"});
  check_same_shape("out", out, "q", q);
  Call<AttentionProblem> call{attention_record(Direction::Forward, options, out.dtype), {}};
  TensorArgs& tensors = call.record.tensors;
  add_attention_inputs(tensors, q, k, v, mask);
  tensors.push_back(output("out", out));
  check_call(call.record);
  call.problem = {dims[0],
                  dims[1],
                  dims[2],
                  dims[3],
                  attention_input(q, layout),
                  attention_input(k, layout),
                  attention_input(v, layout),
                  attention_mask(mask),
                  attention_output(out, layout)};
  return call;
}

Call<AttentionBackwardProblem> attention_backward_call(
    const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
    const std::optional<ConstTensorView>& mask, const ConstTensorView& out,
    const ConstTensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv,
    const AttentionOptions& options) {
  const Layout layout = options.layout;
  const std::array<std::int64_t, 4> dims = check_attention_inputs(q, k, v, mask, layout);
  const auto check_like_q = [&](const char* name, const ConstTensorView& t) {
    check_view(name, t, 4, 4, {"rank 4 (the shape of q)"});
    check_same_shape(name, t, "q", q);
  };
  check_like_q("out", out);
  check_like_q("dout", dout);
  check_like_q("dq", dq);
  check_like_q("dk", dk);
  check_like_q("dv", dv);
  Call<AttentionBackwardProblem> call{attention_record(Direction::Backward, options, dq.dtype), {}};
  TensorArgs& tensors = call.record.tensors;
  add_attention_inputs(tensors, q, k, v, mask);
  tensors.push_back(input("out", out));
  tensors.push_back(input("dout", dout));
  tensors.push_back(output("dq", dq));
  tensors.push_back(output("dk", dk));
  tensors.push_back(output("dv", dv));
  check_call(call.record);
  call.problem = {dims[0],
                  dims[1],
                  dims[2],
                  dims[3],
                  attention_input(q, layout),
                  attention_input(k, layout),
                  attention_input(v, layout),
                  attention_mask(mask),
                  attention_input(out, layout),
                  attention_input(dout, layout),
                  attention_output(dq, layout),
                  attention_output(dk, layout),
                  attention_output(dv, layout)};
  return call;
}

namespace {

constexpr std::string_view kTokensRank = "rank 3 ([B, S, D])";
constexpr std::string_view kModulationRank = "rank 2 or 3 ([B, D] or [B, 1, D])";

// x of adaln_modulation (or a tensor of its shape): its D.
int check_adaln_tokens(const char* name, const ConstTensorView& t) {
  check_view(name, t, 3, 3, {kTokensRank});
  const std::int64_t d = t.shape[2];
  if (d < 1 || d > kMaxHeadDim) {
    throw Error(name, "a last dim D from 1 to " + std::to_string(kMaxHeadDim),
                "D = " + std::to_string(d));
  }
  return static_cast<int>(d);
}

// A sample's modulation: [B, D] or [B, 1, D] with x's B and D.
void check_modulation(const char* name, const ConstTensorView& t, const ConstTensorView& x) {
  check_view(name, t, 2, 3, {kModulationRank});
  const bool ok = t.shape[0] == x.shape[0] && t.shape[t.rank - 1] == x.shape[2] &&
                  (t.rank == 2 || t.shape[1] == 1);
  if (!ok) {
    const std::string b = std::to_string(x.shape[0]);
    const std::string d = std::to_string(x.shape[2]);
    throw Error(name, "shape [" + b + ", " + d + "] or [" + b + ", 1, " + d + "] (B and D of x)",
                "shape " + shape_string(t));
  }
}

template <class Pointer, class View>
Strided3<Pointer> tokens_of(const View& v) {
  return {v.data, v.dtype, {v.strides[0], v.strides[1], v.strides[2]}};
}

// A [B, D] or [B, 1, D] view as [B, S, D] whose every token reads (or writes) the sample's row.
template <class Pointer, class View>
Strided3<Pointer> modulation_of(const View& v) {
  return {v.data, v.dtype, {v.strides[0], 0, v.strides[v.rank - 1]}};
}

CallRecord adaln_record(Direction direction, const AdaLnOptions& options, DType output_dtype) {
  CallRecord record = record_of(OpType::AdaLnModulation, direction, output_dtype);
  add_option(record, choice("mode", norm_mode_name(options.mode)));
  add_option(record, fp32_value("eps", options.eps));
  return record;
}

}  // namespace

Call<AdaLnProblem> adaln_forward_call(const ConstTensorView& x, const ConstTensorView& scale,
                                      const ConstTensorView& shift, const TensorView& y,
                                      const AdaLnOptions& options) {
  const int d = check_adaln_tokens("x", x);
  check_modulation("scale", scale, x);
  check_modulation("shift", shift, x);
  check_view("y", y, 3, 3, {kTokensRank});
  check_same_shape("y", y, "x", x);
  Call<AdaLnProblem> call{adaln_record(Direction::Forward, options, y.dtype), {}};
  TensorArgs& tensors = call.record.tensors;
  tensors.push_back(input("x", x));
  tensors.push_back(input("scale", scale));
  tensors.push_back(input("shift", shift));
  // A row of y is written after the row's x is read (twice: the mean, the variance).
  tensors.push_back(output("y", y, {"x"}));
  check_call(call.record);
  call.problem = {x.shape[0],
                  x.shape[1],
                  d,
                  options.eps,
                  options.mode,
                  tokens_of<const void*>(x),
                  modulation_of<const void*>(scale),
                  modulation_of<const void*>(shift),
                  tokens_of<void*>(y)};
  return call;
}

Call<AdaLnBackwardProblem> adaln_backward_call(const ConstTensorView& x,
                                               const ConstTensorView& scale,
                                               const ConstTensorView& dy, const TensorView& dx,
                                               const std::optional<TensorView>& dscale,
                                               const std::optional<TensorView>& dshift,
                                               const AdaLnOptions& options) {
  const int d = check_adaln_tokens("x", x);
  check_modulation("scale", scale, x);
  check_view("dy", dy, 3, 3, {kTokensRank});
  check_same_shape("dy", dy, "x", x);
  check_view("dx", dx, 3, 3, {kTokensRank});
  check_same_shape("dx", dx, "x", x);
  for (const auto& [name, grad] : {std::pair{"dscale", &dscale}, std::pair{"dshift", &dshift}}) {
    if (*grad) {
      check_view(name, **grad, 2, 3, {kModulationRank});
      check_same_shape(name, **grad, "scale", scale);
    }
  }
  Call<AdaLnBackwardProblem> call{adaln_record(Direction::Backward, options, dx.dtype), {}};
  if (dscale || dshift) record_dw_blocks(call.record);
  TensorArgs& tensors = call.record.tensors;
  tensors.push_back(input("x", x));
  tensors.push_back(input("scale", scale));
  tensors.push_back(input("dy", dy));
  // dx is written after every read of x and dy (the sums over tokens come first).
  tensors.push_back(output("dx", dx, {"x", "dy"}));
  if (dscale) tensors.push_back(output("dscale", *dscale));
  if (dshift) tensors.push_back(output("dshift", *dshift));
  check_call(call.record);
  const AdaLnOutput none{nullptr, dx.dtype, {0, 0, 0}};
  call.problem = {x.shape[0],
                  x.shape[1],
                  d,
                  options.eps,
                  options.mode,
                  tokens_of<const void*>(x),
                  modulation_of<const void*>(scale),
                  tokens_of<const void*>(dy),
                  tokens_of<void*>(dx),
                  dscale ? modulation_of<void*>(*dscale) : none,
                  dshift ? modulation_of<void*>(*dshift) : none};
  return call;
}

}  // namespace kernel_align::detail
