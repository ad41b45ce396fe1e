// What every op's validator (api/ops/<op>.cpp) builds its call from: the checks of one
// tensor argument, the record's option entries, and check_call, which lists the call's
// tensors from the op's descriptor and checks the whole call (the aliasing rule, eps, one
// device). Each
// failure throws kernel_align::Error naming the argument, what was expected and what was
// found; messages are built only when a check fails.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "api/call.hpp"

namespace kernel_align::detail {

// The pieces of a phrase, joined only when a check fails and its message is built.
using Words = std::initializer_list<std::string_view>;
std::string joined(Words words);

inline constexpr std::string_view kRowsRank = "rank 1 to 4 ([..., D])";
inline constexpr std::string_view kVectorRank = "rank 1 ([D])";

// The checks of every tensor argument but its dtype: rank in [min_rank, max_rank]
// (`rank_meaning` says what the ranks are), non-empty, non-negative strides, offsets that
// fit, a non-null pointer aligned to the dtype.
void check_view_extents(const char* name, const ConstTensorView& v, int min_rank, int max_rank,
                        Words rank_meaning);
// A tensor of numbers (every argument but a mask): the extents and a floating dtype.
void check_view(const char* name, const ConstTensorView& v, int min_rank, int max_rank,
                Words rank_meaning);
// An even last dim from 2 to kMaxHeadDim (the norm and RoPE rows); returns it.
int check_head_dim(const char* name, std::int64_t d);
void check_same_shape(const char* name, const ConstTensorView& v, const char* reference_name,
                      const ConstTensorView& reference);

// The checks of a whole call: its tensors, listed as `views` in the order of its signature
// (descriptor(op).signature(direction); an absent optional one as nullopt), are added to
// the record with their names, then the aliasing rule (contract section 7), eps (where
// the op has one) and one device; the record then holds that device.
void check_call(CallRecord& record, std::initializer_list<std::optional<ConstTensorView>> views);

// A record of `op` with no tensors and no options yet.
CallRecord record_of(OpType op, Direction direction, DType output_dtype);
// Appends the value of the record's next option: its name and kind must be the
// descriptor's (a mismatch is the library's bug).
void add_option(CallRecord& record, const OptionValue& value);
OptionValue choice(const char* name, const char* value);
OptionValue fp32_value(const char* name, float value);
OptionValue integer_value(const char* name, std::int64_t value);
// The dw blocks of a backward call that computes a weight gradient.
void record_dw_blocks(CallRecord& record);

}  // namespace kernel_align::detail
