// digest-v1 of each batch element of a tensor, on the device (trace/digest_v1.hpp): the
// trace never copies an output back. The digest is one chain over the element's bytes
// in logical order, so one thread feeds it; the whole block gathers the next tile of
// elements (any strides) into shared memory meanwhile.
#pragma once

#include <cstdint>

#include "cuda/device/params.hpp"
#include "cuda/device/primitives.cuh"
#include "trace/digest_v1.hpp"

namespace kernel_align::cuda {

// One thread block per batch element (blockIdx.x).
template <class Grid>
struct DigestV1 {
  using Params = DigestParams;
  static constexpr int kTile = 2048;  // elements gathered per step
  struct Shared {
    std::uint32_t bits[kTile];  // an element's storage bits (16-bit types in the low half)
  };

  static KA_DEVICE void run(const Params& p, Shared& s) {
    const std::int64_t batch = Grid::block();
    // A 4-D tensor's batch element b is the tensor narrowed to [b, b + 1) in dim 0.
    const int first_dim = p.rank == kMaxRank ? 1 : 0;
    const std::int64_t base = first_dim == 1 ? batch * p.strides[0] : 0;
    std::int64_t count = 1;
    for (int d = first_dim; d < p.rank; ++d) count *= p.shape[d];
    const int size = p.dtype == DType::F32 ? 4 : 2;
    std::uint64_t state = trace::digest_v1::start(static_cast<std::uint64_t>(count * size));
    std::uint64_t word = 0;
    int word_bytes = 0;
    for (std::int64_t tile = 0; tile < count; tile += kTile) {
      const int here = count - tile < kTile ? static_cast<int>(count - tile) : kTile;
      for (int e = static_cast<int>(Grid::thread()); e < here;
           e += static_cast<int>(Grid::threads())) {
        // The offset of logical element tile + e (row-major over the dims used).
        std::int64_t rest = tile + e;
        std::int64_t offset = base;
        for (int d = p.rank - 1; d >= first_dim; --d) {
          offset += (rest % p.shape[d]) * p.strides[d];
          rest /= p.shape[d];
        }
        s.bits[e] = size == 4 ? static_cast<const std::uint32_t*>(p.data)[offset]
                              : static_cast<const std::uint16_t*>(p.data)[offset];
      }
      Grid::sync();
      if (Grid::thread() == 0) {
        for (int e = 0; e < here; ++e) {  // little-endian bytes, 8 to a word
          word |= static_cast<std::uint64_t>(s.bits[e]) << (8 * word_bytes);
          word_bytes += size;
          if (word_bytes == 8) {
            state = trace::digest_v1::mix(state, word);
            word = 0;
            word_bytes = 0;
          }
        }
      }
      Grid::sync();
    }
    if (Grid::thread() == 0) {
      if (word_bytes != 0) state = trace::digest_v1::mix(state, word);  // zero-padded
      p.digests[batch] = trace::digest_v1::finish(state);
    }
  }
};

}  // namespace kernel_align::cuda
