// The grid emulator (src/cuda/emulator) gives kernel bodies the semantics of a CUDA
// launch: indices in three grid dims, __syncthreads ordering shared memory, lockstep
// shuffles, fresh poisoned shared memory (fixed and dynamic) per block; and it refuses
// what a GPU would leave undefined.
#include "cuda/emulator/grid_emulator.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace kernel_align::cuda::emulation {
namespace {

using Grid = EmulatedGrid;

struct Indices {
  struct Params {
    unsigned* out;
  };
  struct Shared {};
  static void run(const Params& p, Shared&) {
    const unsigned block =
        (Grid::block_z() * Grid::blocks_y() + Grid::block_y()) * Grid::blocks() + Grid::block();
    const unsigned global = block * Grid::threads() + Grid::thread();
    p.out[global] = global;
  }
};

TEST(GridEmulator, EveryThreadOfEveryBlockRunsOnceWithItsIndices) {
  std::vector<unsigned> out(3 * 2 * 4 * 64, 0xFFFFFFFFu);
  const LaunchStats stats = launch<Indices>({3, 2, 4}, {64, 1, 1}, {out.data()});
  EXPECT_EQ(stats.blocks, 24u);
  for (unsigned i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], i);
}

// Each thread writes its slot, then after the barrier reads its neighbour's: right only
// if every write happened before any read; repeated, the barrier also stops a fast
// thread from overwriting a slot before a slow one has read it.
struct Rotate {
  struct Params {
    float* out;
    int rounds;
  };
  struct Shared {
    float slot[128];
  };
  static void run(const Params& p, Shared& s) {
    const unsigned t = Grid::thread();
    float value = static_cast<float>(t);
    for (int r = 0; r < p.rounds; ++r) {
      s.slot[t] = value;
      Grid::sync();
      value = s.slot[(t + 1) % Grid::threads()];
      Grid::sync();
    }
    p.out[Grid::block() * Grid::threads() + t] = value;
  }
};

TEST(GridEmulator, SyncThreadsOrdersSharedMemory) {
  std::vector<float> out(2 * 128);
  launch<Rotate>({2, 1, 1}, {128, 1, 1}, {out.data(), 5});
  for (unsigned i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i], static_cast<float>((i % 128 + 5) % 128)) << i;
  }
}

// A butterfly sum over each warp and a chain of shuffles: each step must see the values
// of the same step in every lane.
struct Butterfly {
  struct Params {
    float* out;
  };
  struct Shared {};
  static void run(const Params& p, Shared&) {
    const unsigned t = Grid::thread();
    float sum = static_cast<float>(t % kWarpSize);
    for (unsigned mask = 16; mask >= 1; mask /= 2) sum += Grid::shfl_xor(sum, mask);
    float chain = static_cast<float>(t);
    for (int step = 0; step < 7; ++step) chain = Grid::shfl_xor(chain, 1) + 1.0f;
    p.out[2 * t] = sum;
    p.out[2 * t + 1] = chain;
  }
};

TEST(GridEmulator, ShufflesAreLockstep) {
  std::vector<float> out(2 * 64);
  launch<Butterfly>({1, 1, 1}, {64, 1, 1}, {out.data()});
  for (unsigned t = 0; t < 64; ++t) {
    EXPECT_EQ(out[2 * t], 496.0f) << t;  // 0 + 1 + ... + 31
    // Seven swaps with the neighbour, +1 each: an odd count ends on the neighbour's value.
    EXPECT_EQ(out[2 * t + 1], static_cast<float>(t ^ 1u) + 7.0f) << t;
  }
}

struct ReadShared {
  struct Params {
    float* out;
  };
  struct Shared {
    float value[32];
  };
  static void run(const Params& p, Shared& s) {
    const unsigned t = Grid::thread();
    p.out[Grid::block() * 32 + t] = s.value[t];
    s.value[t] = 1.0f;  // must not reach the next block
  }
};

TEST(GridEmulator, SharedMemoryStartsPoisonedInEveryBlock) {
  std::vector<float> out(2 * 32, 0.0f);
  launch<ReadShared>({2, 1, 1}, {32, 1, 1}, {out.data()});
  for (const float v : out) EXPECT_TRUE(std::isnan(v));
}

// Dynamic shared memory: the launch's bytes, 16-byte aligned, poisoned in every block and
// shared by the block's threads (each reads its neighbour's slot after the barrier).
struct DynamicRotate {
  struct Params {
    float* out;
    float* poison;
  };
  struct Shared {};
  static void run(const Params& p, Shared&) {
    auto* slot = reinterpret_cast<float*>(Grid::dynamic_shared());
    const unsigned t = Grid::thread();
    const unsigned n = Grid::threads();
    p.poison[Grid::block() * n + t] = slot[n + t];  // beyond the slots: never written
    slot[t] = static_cast<float>(Grid::block() * 1000 + t);
    Grid::sync();
    p.out[Grid::block() * n + t] = slot[(t + 1) % n];
  }
};

TEST(GridEmulator, DynamicSharedMemoryIsTheLaunchsSizePoisonedPerBlock) {
  constexpr unsigned kThreads = 64;
  std::vector<float> out(2 * kThreads), poison(2 * kThreads);
  launch<DynamicRotate>({2, 1, 1}, {kThreads, 1, 1}, {out.data(), poison.data()},
                        2 * kThreads * sizeof(float));
  for (unsigned b = 0; b < 2; ++b) {
    for (unsigned t = 0; t < kThreads; ++t) {
      EXPECT_EQ(out[b * kThreads + t], static_cast<float>(b * 1000 + (t + 1) % kThreads));
      EXPECT_TRUE(std::isnan(poison[b * kThreads + t]));
    }
  }
}

struct SkipsTheBarrier {
  struct Params {
    unsigned skipping;
  };
  struct Shared {};
  static void run(const Params& p, Shared&) {
    if (Grid::thread() == p.skipping) return;
    Grid::sync();
  }
};

struct PartialShuffle {
  struct Params {};
  struct Shared {};
  static void run(const Params&, Shared&) {
    if (Grid::thread() % 2 == 0) Grid::shfl_xor(1.0f, 1);
  }
};

template <class Kernel>
std::string error_of(Dim3 block, const typename Kernel::Params& p) {
  try {
    launch<Kernel>({1, 1, 1}, block, p);
  } catch (const std::logic_error& e) {
    return e.what();
  }
  return "no error";
}

TEST(GridEmulator, BarriersNotEveryThreadReachesAreErrors) {
  // Thread 0 returns first: the others then wait forever.
  EXPECT_NE(error_of<SkipsTheBarrier>({64, 1, 1}, {0}).find("deadlock"), std::string::npos);
  // The last thread returns after the others arrived.
  EXPECT_NE(error_of<SkipsTheBarrier>({64, 1, 1}, {63}).find("returned while"), std::string::npos);
  EXPECT_NE(error_of<PartialShuffle>({32, 1, 1}, {}).find("wait at a shuffle"), std::string::npos);
  EXPECT_NE(error_of<Indices>({48, 1, 1}, {nullptr}).find("multiple of 32"), std::string::npos);
}

}  // namespace
}  // namespace kernel_align::cuda::emulation
