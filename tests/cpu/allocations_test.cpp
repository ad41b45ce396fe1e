// An untraced call allocates nothing from the heap once warmed up, whether through
// the public functions or into the CPU backend directly: validation lists the call's
// tensors in its fixed-size record and builds message strings only for an error, the
// registry chooses without a sort buffer, a fused call keeps its streams in place, and
// the backend keeps the dw scratch per thread, records the row partition only when the
// call is traced and hands the thread pool its task by reference (not as a
// std::function). Counted by replacing the global operator new in this test binary
// only; a traced call allocates (its record), which shows the counter counting.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <new>
#include <string>
#include <utility>

#include "api/problems.hpp"
#include "cpu/cpu_backend.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/runtime.hpp"
#include "kernel_align/trace.hpp"
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

constexpr const char* kSanitizerSkip =
    "built with a sanitizer, whose runtime defines operator new: allocations are counted in "
    "the release build (and the clang preset's)";

// Every public op, forward and backward, with and without dw, at 1 and 2 threads.
TEST(CpuAllocations, UntracedPublicCallsAllocateNothing) {
  if (!KA_COUNT_ALLOCATIONS) GTEST_SKIP() << kSanitizerSkip;
  const test::RuntimeGuard guard;
  set_backend("simd");
  test::Rng rng(7);
  // 2 x 64 x 4 rows of 128: two threads for the unfused ops and the image streams, one
  // for the text streams (16 positions), and a dw of two blocks.
  constexpr std::int64_t kB = 2, kS = 64, kH = 4, kD = 128;
  const HostTensor q = test::random_tensor(DType::BF16, {kB, kS, kH, kD}, rng);
  const HostTensor k = test::random_tensor(DType::BF16, {kB, kS, kH, kD}, rng);
  const HostTensor dq_out = test::random_tensor(DType::BF16, {kB, kS, kH, kD}, rng);
  const HostTensor dk_out = test::random_tensor(DType::BF16, {kB, kS, kH, kD}, rng);
  const HostTensor w = test::random_weight(DType::BF16, kD, rng);
  const test::TablePair t = test::random_tables(kS, kD, rng);
  HostTensor q_out(DType::BF16, {kB, kS, kH, kD});
  HostTensor k_out(DType::BF16, {kB, kS, kH, kD});
  HostTensor dw[4] = {HostTensor(DType::F32, {kD}), HostTensor(DType::F32, {kD}),
                      HostTensor(DType::F32, {kD}), HostTensor(DType::F32, {kD})};
  const QkNormWeights weights{w.cview(), w.cview(), w.cview(), w.cview()};
  const QkNormWeightGrads grads{dw[0].view(), dw[1].view(), dw[2].view(), dw[3].view()};
  QkNormRopeOptions fused;
  fused.text_len = 16;
  const std::pair<const char*, std::function<void()>> calls[] = {
      {"qk_rmsnorm_forward", [&] { qk_rmsnorm_forward(q.cview(), w.cview(), q_out.view(), {}); }},
      {"qk_rmsnorm_backward",
       [&] {
         qk_rmsnorm_backward(q.cview(), dq_out.cview(), w.cview(), q_out.view(), std::nullopt, {});
       }},
      {"qk_rmsnorm_backward with dw",
       [&] {
         qk_rmsnorm_backward(q.cview(), dq_out.cview(), w.cview(), q_out.view(), dw[0].view(), {});
       }},
      {"multi_axis_rope_forward",
       [&] { multi_axis_rope_forward(q.cview(), t.cos.cview(), t.sin.cview(), q_out.view(), {}); }},
      {"multi_axis_rope_backward",
       [&] {
         multi_axis_rope_backward(dq_out.cview(), t.cos.cview(), t.sin.cview(), q_out.view(), {});
       }},
      {"qk_norm_rope_forward",
       [&] {
         qk_norm_rope_forward(q.cview(), k.cview(), weights, t.cos.cview(), t.sin.cview(),
                              q_out.view(), k_out.view(), fused);
       }},
      {"qk_norm_rope_backward",
       [&] {
         qk_norm_rope_backward(q.cview(), k.cview(), dq_out.cview(), dk_out.cview(), weights,
                               t.cos.cview(), t.sin.cview(), q_out.view(), k_out.view(), {}, fused);
       }},
      {"qk_norm_rope_backward with dw",
       [&] {
         qk_norm_rope_backward(q.cview(), k.cview(), dq_out.cview(), dk_out.cview(), weights,
                               t.cos.cview(), t.sin.cview(), q_out.view(), k_out.view(), grads,
                               fused);
       }},
  };
  for (const int threads : {1, 2}) {
    set_num_threads(threads);
    for (const auto& [name, call] : calls) {
      EXPECT_EQ(allocations_of(call), 0) << name << ", " << threads << " threads";
      EXPECT_EQ(last_call().backend, "simd") << name;
    }
  }
  // Traced, the same calls allocate (the record's strings): the counter sees them.
  const std::string path = testing::TempDir() + "allocations_test_trace.jsonl";
  set_trace_path(path);
  for (const auto& [name, call] : calls) EXPECT_GT(allocations_of(call), 0) << name << ", traced";
  set_trace_path("");
  std::remove(path.c_str());
}

// The backend alone: traced calls record the partition (and allocate for it), untraced
// ones allocate nothing; the split is into `threads` ranges at this size.
TEST(CpuAllocations, UntracedBackendCallsAllocateNothing) {
  if (!KA_COUNT_ALLOCATIONS) GTEST_SKIP() << kSanitizerSkip;
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
  const registry::Kernels simd = cpu::simd_kernels();
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
          allocations_of_call([&](auto& exec) {
            simd.get<OpType::QkRmsNorm, Direction::Forward>()(forward, exec);
          }),
          allocations_of_call([&](auto& exec) {
            simd.get<OpType::QkRmsNorm, Direction::Backward>()(backward, exec);
          }),
          allocations_of_call([&](auto& exec) {
            simd.get<OpType::MultiAxisRope, Direction::Forward>()(rope, exec);
          }),
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
