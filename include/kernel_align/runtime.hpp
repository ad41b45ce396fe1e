// Which code runs an op, and on how many threads. Every choice gives the same
// bytes (docs/contract.md); these controls exist for speed, for tests and for
// users who pin behaviour.
#pragma once

namespace kernel_align {

enum class Backend : unsigned char {
  Cpu,        // SIMD paths and the thread pool (the default)
  Reference,  // the scalar reference, single-threaded
};

// Instruction-set paths of the CPU backend, lowest first.
enum class Isa : unsigned char {
  Portable,  // plain C++ (any CPU, any architecture)
  Avx2,      // AVX2 + F16C
  Avx512,    // AVX-512 F/BW/VL (+ the BF16 conversion instruction where present)
};

const char* backend_name(Backend b);
const char* isa_name(Isa i);

// Backend for later calls. Default: Cpu, or KERNEL_ALIGN_BACKEND=cpu|reference.
void set_backend(Backend b);
Backend backend();

// The best path this CPU and build support.
Isa best_isa();
// Force a path at or below best_isa() (kernel_align::Error otherwise). Default:
// best_isa(), or KERNEL_ALIGN_ISA=portable|avx2|avx512 read at first use.
void set_isa(Isa i);
Isa isa();

// Threads of the CPU backend (>= 1). Default: all cores, or KERNEL_ALIGN_NUM_THREADS.
void set_num_threads(int n);
int num_threads();

}  // namespace kernel_align
