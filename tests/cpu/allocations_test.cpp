// The CPU backend allocates nothing from the heap for an untraced call once warmed up
// (the dw scratch is kept per thread): the row partition is recorded only when the call
// is traced, and the thread pool takes its task by reference, not as a std::function.
// Counted by replacing the global operator new in this test binary only. (The layers
// above the backend, validation and the registry's choice, still allocate a few strings
// and vectors per call: docs/cpu-backend.md.)
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "api/problems.hpp"
#include "cpu/cpu_backend.hpp"
#include "kernel_align/runtime.hpp"
#include "registry/registry.hpp"
#include "support/op_cases.hpp"
#include "support/runtime_guard.hpp"
#include "support/tensors.hpp"

namespace {

std::atomic<bool> counting{false};
std::atomic<long> allocations{0};

#if KA_COUNT_ALLOCATIONS
void* allocate(std::size_t bytes) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1);
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
#endif

}  // namespace

#if KA_COUNT_ALLOCATIONS
void* operator new(std::size_t bytes) {
  return allocate(bytes);
}
void* operator new[](std::size_t bytes) {
  return allocate(bytes);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t /*bytes*/) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t /*bytes*/) noexcept {
  std::free(p);
}
#endif

namespace kernel_align {
namespace {

using test::HostTensor;

// Heap allocations made by f() (any thread), after one call of it to warm up.
template <class F>
long allocations_of(const F& f) {
  f();
  allocations = 0;
  counting = true;
  f();
  counting = false;
  return allocations.load();
}

TEST(CpuAllocations, UntracedBackendCallsAllocateNothing) {
  if (!KA_COUNT_ALLOCATIONS) {
    GTEST_SKIP() << "built with a sanitizer, whose runtime defines operator new: allocations "
                    "are counted in the release and clang builds";
  }
  const test::RuntimeGuard guard;
  test::Rng rng(5);
  // 2 x 64 x 4 rows of 128: enough elements for two threads, and a dw of two blocks.
  constexpr std::int64_t kB = 2, kS = 64, kH = 4, kD = 128;
  const HostTensor x = test::random_tensor(DType::BF16, {kB, kS, kH, kD}, rng);
  const HostTensor dy = test::random_tensor(DType::BF16, {kB, kS, kH, kD}, rng);
  const HostTensor w = test::random_weight(DType::BF16, kD, rng);
  const test::TablePair t = test::random_tables(kS, kD, rng);
  HostTensor y(DType::BF16, {kB, kS, kH, kD});
  HostTensor dw(DType::F32, {kD});
  const detail::RmsNormForwardProblem forward{x.cview(), w.cview(), y.view(), {}, kD};
  const detail::RmsNormBackwardProblem backward{x.cview(), dy.cview(), w.cview(), y.view(),
                                                dw.view(), {},         kD};
  detail::RopeProblem rope;
  rope.in = x.cview();
  rope.out = y.view();
  rope.in_strides = detail::sequence_strides(rope.in, Layout::BSHD);
  rope.out_strides = detail::sequence_strides(rope.out, Layout::BSHD);
  rope.cos = t.cos.cview();
  rope.sin = t.sin.cview();
  rope.batch = kB;
  rope.seq = kS;
  rope.heads = kH;
  rope.d = kD;
  for (const bool traced : {false, true}) {
    for (const int threads : {1, 2}) {
      set_num_threads(threads);
      SCOPED_TRACE(testing::Message() << threads << " threads, traced " << traced);
      const auto allocations_of_call = [&](const auto& call) {
        return allocations_of([&] {
          registry::Execution exec;
          exec.traced = traced;
          call(exec);
          EXPECT_EQ(exec.threads, threads);  // the split is into `threads` ranges here
          EXPECT_EQ(exec.partition.empty(), !traced);
        });
      };
      const long counts[] = {
          allocations_of_call([&](auto& exec) { cpu::qk_rmsnorm_forward(forward, exec); }),
          allocations_of_call([&](auto& exec) { cpu::qk_rmsnorm_backward(backward, exec); }),
          allocations_of_call([&](auto& exec) { cpu::multi_axis_rope(rope, exec); }),
      };
      for (const long count : counts) {
        if (traced) {
          EXPECT_GT(count, 0);  // the counter sees the partition's vectors
        } else {
          EXPECT_EQ(count, 0);
        }
      }
    }
  }
}

}  // namespace
}  // namespace kernel_align
