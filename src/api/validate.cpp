// The argument checks every op's validator uses (api/validate.hpp) and the checks of a
// whole call: the aliasing rule and the one device, read from the record's list of
// tensors. Each failure names the argument, what was expected and what was found
// (kernel_align::Error). Messages are built only when a check fails: a valid call
// allocates nothing here. Each op's own checks, and the call they build, are in
// api/ops/<op>.cpp.
#include "api/validate.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <string_view>

#include "kernel_align/contract/rmsnorm.hpp"
#include "kernel_align/error.hpp"

namespace kernel_align::detail {
namespace {

// 2^56 elements of 4 bytes, summed over four dims, stay far below 2^63.
constexpr std::int64_t kMaxViewElements = std::int64_t{1} << 56;

}  // namespace

std::string joined(Words words) {
  std::string text;
  for (const std::string_view w : words) text += w;
  return text;
}

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

namespace {

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

}  // namespace

// Lists the call's tensors from its signature, then checks the whole call: the aliasing
// rule, eps (where the op has one) and one device; the record then holds that device.
void check_call(CallRecord& record, std::initializer_list<std::optional<ConstTensorView>> views) {
  const OpDescriptor& op = descriptor(record.op);
  const Signature& signature = op.signature(record.direction);
  const auto library_bug = [&](const std::string& what) {
    return std::logic_error(std::string("a call record of ") + op_type_name(record.op) + ' ' +
                            direction_name(record.direction) + ' ' + what);
  };
  if (record.options.size() != op.option_count) {
    throw library_bug("without every option of its descriptor");
  }
  if (views.size() != static_cast<std::size_t>(signature.count)) {
    throw library_bug("whose tensors are not its signature's");
  }
  const TensorSpec* spec = signature.tensors().data();
  for (const std::optional<ConstTensorView>& view : views) {
    if (view) {
      record.tensors.push_back({spec->name, spec->error_name(), *view,
                                spec->role == TensorRole::Output, spec->in_place_of});
    } else if (!spec->optional) {
      throw library_bug(std::string("without its required tensor ") + spec->name);
    }
    ++spec;
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

// The dw blocks of a backward call that computes a weight gradient.
void record_dw_blocks(CallRecord& record) {
  record.block_sizes.push_back({"dw_block_rows", contract::kDwBlockRows});
}

}  // namespace kernel_align::detail
