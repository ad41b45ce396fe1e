// The serial work around the kernels (drawing inputs, zero-filling outputs, comparing
// bytes) split over the machine's cores. verify's full matrix spent about 40% of its CPU
// time there on one core while the other waited for the next kernel call.
#pragma once

#include <cstddef>
#include <functional>
#include <span>

namespace kernel_align::cases {

// Below about this many bytes per range, a thread's start (tens of microseconds) costs
// more than it saves: the grain of the byte-wise work (zero_fill, byte_difference).
inline constexpr std::size_t kBytesPerThread = std::size_t{1} << 20;

// Calls fn(begin, end) on contiguous ranges that cover [0, n) in order, each on its own
// thread (the caller runs the first), at most one range per hardware thread and each at
// least `grain` long (one range, on the caller, when n < 2 * grain). Returns when every
// range is done. fn must not throw: a thread has nowhere to send an exception.
void split_over_cores(std::size_t n, std::size_t grain,
                      const std::function<void(std::size_t, std::size_t)>& fn);

// Sets every byte to zero, split over the cores.
void zero_fill(std::span<std::byte> bytes);

}  // namespace kernel_align::cases
