// What the kernel bodies are written in: the grid (thread and block indices, barriers,
// shuffles), vector loads and stores, and the contract's row tree over a group of
// threads. Everything here compiles with nvcc for a device and with the host compiler
// for the grid emulator (src/cuda/emulator), which runs the same bodies in CI.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernel_align/contract/convert.hpp"
#include "kernel_align/contract/float_ops.hpp"
#include "kernel_align/contract/row_tree.hpp"

#if defined(__CUDACC__)
#define KA_DEVICE __device__ __forceinline__
#define KA_UNROLL _Pragma("unroll")
#else
#define KA_DEVICE inline
#define KA_UNROLL
#endif

namespace kernel_align::cuda {

#if defined(__CUDACC__)
// The grid of a real launch (1-D blocks, grids of up to 3 dims).
struct CudaGrid {
  static __device__ __forceinline__ unsigned thread() { return threadIdx.x; }
  static __device__ __forceinline__ unsigned threads() { return blockDim.x; }
  static __device__ __forceinline__ unsigned block() { return blockIdx.x; }
  static __device__ __forceinline__ unsigned block_y() { return blockIdx.y; }
  static __device__ __forceinline__ unsigned block_z() { return blockIdx.z; }
  static __device__ __forceinline__ unsigned blocks() { return gridDim.x; }
  static __device__ __forceinline__ unsigned blocks_y() { return gridDim.y; }
  static __device__ __forceinline__ unsigned blocks_z() { return gridDim.z; }
  // The launch's dynamic shared memory (LaunchRecord::dynamic_shared_bytes of it), for
  // tiles whose size the call decides.
  static __device__ __forceinline__ unsigned char* dynamic_shared() {
    extern __shared__ __align__(16) unsigned char ka_dynamic_shared[];
    return ka_dynamic_shared;
  }
  static __device__ __forceinline__ void sync() { __syncthreads(); }
  static __device__ __forceinline__ float shfl_xor(float value, unsigned lane_mask) {
    return __shfl_xor_sync(0xFFFFFFFFu, value, static_cast<int>(lane_mask));
  }
};
#endif

// The launch-wide index of the calling thread (1-D blocks along grid x): kernels of one
// item a thread.
template <class Grid>
KA_DEVICE std::int64_t global_thread() {
  return static_cast<std::int64_t>(Grid::block()) * Grid::threads() + Grid::thread();
}

// Four consecutive elements of a dtype as one aligned load or store: 16 bytes of fp32,
// 8 bytes of bf16/fp16.
template <DType T>
struct alignas(T == DType::F32 ? 16 : 8) Quad {
  using Bits = std::conditional_t<T == DType::F32, std::uint32_t, std::uint16_t>;
  Bits bits[4];
};

template <DType T>
KA_DEVICE Quad<T> load_quad(const void* base, std::int64_t index) {
  const auto* p = static_cast<const Quad<T>*>(base) + index / 4;
#if defined(__CUDA_ARCH__)
  return *p;  // one ld.global.v4.u32 / v2.u32 (the plan checked the alignment)
#else
  Quad<T> q;
  std::memcpy(&q, p, sizeof q);
  return q;
#endif
}

template <DType T>
KA_DEVICE void store_quad(void* base, std::int64_t index, const Quad<T>& q) {
  auto* p = static_cast<Quad<T>*>(base) + index / 4;
#if defined(__CUDA_ARCH__)
  *p = q;
#else
  std::memcpy(p, &q, sizeof q);
#endif
}

// Elements index .. index + 3 (index a multiple of 4), widened to fp32.
template <DType T>
KA_DEVICE void load4(const void* base, std::int64_t index, float (&out)[4]) {
  const Quad<T> q = load_quad<T>(base, index);
  for (int l = 0; l < 4; ++l) {
    if constexpr (T == DType::F32) {
      out[l] = contract::float_of(q.bits[l]);
    } else if constexpr (T == DType::BF16) {
      out[l] = contract::bf16_to_f32(q.bits[l]);
    } else {
      out[l] = contract::f16_to_f32(q.bits[l]);
    }
  }
}

// Stores as contract::store_output does, four at once.
template <DType T>
KA_DEVICE void store4(void* base, std::int64_t index, const float (&v)[4]) {
  Quad<T> q;
  for (int l = 0; l < 4; ++l) {
    if constexpr (T == DType::F32) {
      q.bits[l] = contract::bits_of(contract::stored_f32(v[l]));
    } else {
      q.bits[l] = contract::stored_bits16(T, v[l]);
    }
  }
  store_quad<T>(base, index, q);
}

// The contract's row tree (contract/row_tree.hpp) kept by a group of 16 / L threads, of
// which the caller owns lanes [g*L, g*L + L) in `lane` (already summed over its terms
// j, j + 16, ... in index order). The halving steps with offset >= L are shuffles with
// the thread offset / L away, the others happen inside the thread: with L = 1 the steps
// are the shuffles xor 8, 4, 2, 1. Every thread of the group gets the sum: a thread of
// the upper half adds the same two values in the other order, which gives the same bits
// (addition is commutative; a NaN's payload, which may differ, is canonicalised when
// stored).
template <class Grid, int L>
KA_DEVICE float group_tree_sum(float (&lane)[L]) {
  static_assert(L == 1 || L == 2 || L == 4 || L == 8 || L == 16);
  KA_UNROLL
  for (int offset = contract::kTreeLanes / 2; offset >= 1; offset /= 2) {
    if (offset >= L) {
      KA_UNROLL
      for (int l = 0; l < L; ++l) {
        lane[l] =
            contract::add(lane[l], Grid::shfl_xor(lane[l], static_cast<unsigned>(offset / L)));
      }
    } else {
      KA_UNROLL
      for (int l = 0; l < offset; ++l) lane[l] = contract::add(lane[l], lane[l + offset]);
    }
  }
  return lane[0];
}

}  // namespace kernel_align::cuda
