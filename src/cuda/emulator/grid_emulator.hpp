// Runs CUDA kernel bodies on the host, for CI machines without a GPU: the kernels of
// src/cuda/device/ are templates on a Grid (thread and block indices, __syncthreads,
// __shfl_xor_sync); EmulatedGrid gives them the semantics of a real launch.
//
// Each CUDA thread of a block is a fiber (its own stack, ucontext); one host thread runs
// a block's fibers in turn. A fiber runs until it reaches a barrier: sync_threads (every
// thread of the block) or a shuffle (its warp of 32; two barriers, write then read, so
// every lane sees the values of the same step, as in lockstep). Blocks run one after the
// other with a fresh, poisoned (0xFF bytes: NaN) shared-memory object each. What a real
// GPU would make undefined is an error here: a barrier that not every thread reaches
// (a deadlock, or a thread that returned while others wait), a block size that is not a
// multiple of the warp.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>

namespace kernel_align::cuda::emulation {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

inline constexpr unsigned kWarpSize = 32;

// The interface kernel bodies see, as CudaGrid gives it on a device.
struct EmulatedGrid {
  static unsigned thread();                                // threadIdx.x
  static unsigned threads();                               // blockDim.x
  static unsigned block();                                 // blockIdx.x
  static unsigned block_y();                               // blockIdx.y
  static unsigned block_z();                               // blockIdx.z
  static unsigned blocks();                                // gridDim.x
  static unsigned blocks_y();                              // gridDim.y
  static unsigned blocks_z();                              // gridDim.z
  static unsigned char* dynamic_shared();                  // extern __shared__ (launch-sized)
  static void sync();                                      // __syncthreads()
  static float shfl_xor(float value, unsigned lane_mask);  // __shfl_xor_sync(full mask)
};

// Counts of one launch, for tests of the emulator itself.
struct LaunchStats {
  std::uint64_t blocks = 0;
  std::uint64_t fiber_switches = 0;
};

// Runs body(shared) for every thread of every block of `grid` x `block` (block.y =
// block.z = 1; blocks in x, then y, then z order). `shared_bytes` of shared memory per
// block, poisoned, are passed to the body as `shared`; `dynamic_shared_bytes` more,
// poisoned too, are EmulatedGrid::dynamic_shared() (a launch's extern __shared__ array).
LaunchStats run_grid(Dim3 grid, Dim3 block, std::size_t shared_bytes,
                     std::size_t dynamic_shared_bytes,
                     const std::function<void(void* shared)>& body);

// Launches Kernel<EmulatedGrid>-style bodies: Kernel::run(params, shared).
template <class Kernel>
LaunchStats launch(Dim3 grid, Dim3 block, const typename Kernel::Params& params,
                   std::size_t dynamic_shared_bytes = 0) {
  return run_grid(
      grid, block, sizeof(typename Kernel::Shared), dynamic_shared_bytes,
      [&](void* shared) { Kernel::run(params, *static_cast<typename Kernel::Shared*>(shared)); });
}

}  // namespace kernel_align::cuda::emulation
