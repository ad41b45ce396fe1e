// Traces beyond the library's own calls (docs/trace.md, docs/alignment.md): digest-v1 of
// any strided host array, and records that a caller (kernel_align.alignment's module
// hooks) appends to the library's trace, in one sequence with the library's records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace kernel_align {

// A strided host array of any rank and element type: `data` points at element
// [0, ..., 0], strides count elements of `element_size` bytes.
struct StridedBytes {
  const void* data = nullptr;
  std::size_t element_size = 1;
  std::span<const std::int64_t> shape;
  std::span<const std::int64_t> strides;
};

// digest-v1 of each index of `batch_dim` (the elements of that slice in row-major
// order), or one digest of the whole array when `batch_dim` is empty: the code the
// library's own records use. Error naming `batch_dim` when it is not below the rank,
// naming `strides` when their count differs from the shape's or one is negative.
std::vector<std::uint64_t> digests_along(const StridedBytes& array,
                                         std::optional<std::size_t> batch_dim);

// Appends one record to the open trace: `{"seq":N,"session":...,"pid":P` + `members` +
// `}` and a newline, under the lock and with the seq counter of the library's own records,
// in one write to the O_APPEND file. `members` is the rest of a JSON object, starting
// with a comma (",\"kind\":\"module\",..."). Returns false, writing nothing, when no trace
// is open. Error naming `members` when it does not start with a comma or holds a line
// break (a record is one line); naming `trace` when the write fails.
bool append_trace_record(std::string_view members);

}  // namespace kernel_align
