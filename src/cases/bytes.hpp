// Byte comparison of op outputs, with a report of where they differ: how verify and the
// tests decide that two backends (or two runs) computed the same bits.
#pragma once

#include <cstddef>
#include <span>
#include <string>

namespace kernel_align::cases {

// "" when the bytes are equal, else which elements (of element_size bytes) differ:
// "q_out: 3 of 81920 elements differ, first at element 17: expected 0x3f80, found
// 0x3f81", or "q_out: 64 bytes expected, 32 found".
std::string byte_difference(const std::string& name, std::size_t element_size,
                            std::span<const std::byte> expected, std::span<const std::byte> found);

}  // namespace kernel_align::cases
