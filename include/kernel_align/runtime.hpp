// How the CPU's `simd` backend runs: its instruction-set path and thread count.
// Every choice gives the same bytes (docs/contract.md); these controls exist for
// speed, for tests and for users who pin behaviour. Which backend runs a call is
// the registry's choice (registry.hpp).
#pragma once

#include <string>
#include <string_view>

namespace kernel_align {

// Instruction-set paths of the CPU backend, lowest first.
enum class Isa : unsigned char {
  Portable,  // plain C++ (any CPU, any architecture)
  Avx2,      // AVX2 + F16C
  Avx512,    // AVX-512 F/BW/VL (+ the BF16 conversion instruction where present)
};

// "portable", "avx2", "avx512": the names of KERNEL_ALIGN_ISA, the CLI and trace records.
const char* isa_name(Isa i);

// The best path this CPU and build support.
Isa best_isa();
// Force a path at or below best_isa() (kernel_align::Error naming "isa" otherwise). Default:
// best_isa(), or KERNEL_ALIGN_ISA=portable|avx2|avx512 read at first use.
void set_isa(Isa i);
Isa isa();  // the path the simd backend runs now

// Threads of the CPU backend, 1 to 4096 (Error naming "threads" otherwise). Default:
// all cores, or KERNEL_ALIGN_NUM_THREADS.
void set_num_threads(long long n);
int num_threads();  // the thread count the simd backend uses now

// The thread count written in `text`: decimal digits only ("4"; no sign, space or
// suffix), 1 to 4096; Error naming `argument` otherwise. The one parser of
// KERNEL_ALIGN_NUM_THREADS and the command line's --threads.
int parse_num_threads(const std::string& argument, std::string_view text);

}  // namespace kernel_align
