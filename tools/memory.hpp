// How much memory a command may ask for, checked before it allocates: a request above
// what the machine can give is a clear error naming the flag, never std::bad_alloc.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

namespace kernel_align::cli {

// The product of `factors`, or nothing when it exceeds 2^64 - 1.
std::optional<std::uint64_t> checked_product(std::initializer_list<std::uint64_t> factors);

// Bytes the system can still hand out: MemAvailable plus SwapFree (/proc/meminfo), or
// the free physical pages where that file is missing.
std::uint64_t available_memory();

// Throws Error(flag) when `bytes` (nothing: a size past 2^64) exceed available_memory().
// `what` says what needs them, e.g. "the sample (7145 tokens x 24 heads x 128, bf16)".
void check_fits_in_memory(const std::string& flag, std::optional<std::uint64_t> bytes,
                          const std::string& what);

}  // namespace kernel_align::cli
