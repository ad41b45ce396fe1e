// Many threads calling every op at once while another keeps changing the backend, the
// ISA path and the thread count, with tracing on: every call's bytes equal the
// single-threaded reference's, the trace holds every call, whole, with distinct seqs.
// Run under ThreadSanitizer by scripts/sanitizers.sh. And faults: an allocation that
// fails inside a call (a process memory limit) is a std::bad_alloc that leaves the
// caller's output untouched.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kernel_align/ops.hpp"
#include "kernel_align/registry.hpp"
#include "kernel_align/runtime.hpp"
#include "support/op_cases.hpp"
#include "support/runtime_guard.hpp"

namespace kernel_align {
namespace {

using test::CaseSpec;
using test::OpKind;

constexpr int kCallers = 6;
constexpr int kRounds = 6;

TEST(Concurrency, ManyThreadsEveryOpChangingSettingsTracingOn) {
  const test::RuntimeGuard guard;
  const std::string path = testing::TempDir() + "concurrency_trace.jsonl";
  std::remove(path.c_str());
  // One case per op, and its bytes from the reference alone.
  test::Rng rng(99);
  struct Expected {
    OpKind op;
    CaseSpec spec;
  };
  std::vector<Expected> cases;
  for (OpKind op : test::kAllOps) {
    CaseSpec c;
    c.in = DType::BF16;
    c.out = DType::BF16;
    c.weight = DType::BF16;
    c.dw = test::is_backward(op) ? std::optional<DType>(DType::F32) : std::nullopt;
    c.mode = NormMode::Diffusers;
    c.seq = 37;
    c.d = 128;
    cases.push_back({op, c});
  }
  set_backend("reference");
  std::vector<test::Outputs> expected;
  for (const Expected& e : cases) {
    test::Rng case_rng(static_cast<std::uint64_t>(e.op) + 1);
    test::with_case(e.op, e.spec, case_rng,
                    [&](const auto& one) { expected.push_back(one.run()); });
  }
  set_backend("");
  set_trace_path(path);
  std::atomic<bool> done{false};
  std::atomic<int> mismatches{0};
  std::atomic<int> calls{0};
  // The settings change under the callers' feet: none of them changes a bit.
  std::thread changer([&] {
    test::Rng r(5);
    while (!done) {
      set_num_threads(1 + static_cast<int>(r.below(4)));
      const auto isas = test::available_isas();
      set_isa(isas[static_cast<std::size_t>(r.below(static_cast<std::int64_t>(isas.size())))]);
      set_backend(r.below(3) == 0 ? "reference" : "simd");
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> callers;
  for (int t = 0; t < kCallers; ++t) {
    callers.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        const std::size_t i =
            static_cast<std::size_t>((t + round) % static_cast<int>(cases.size()));
        test::Rng case_rng(static_cast<std::uint64_t>(cases[i].op) + 1);
        test::with_case(cases[i].op, cases[i].spec, case_rng, [&](const auto& one) {
          const test::Outputs got = one.run();
          // A fused call makes one record, every other op one too.
          calls.fetch_add(1);
          if (!test::same_bytes(expected[i], got)) mismatches.fetch_add(1);
        });
      }
    });
  }
  for (std::thread& c : callers) c.join();
  done = true;
  changer.join();
  set_trace_path("");
  EXPECT_EQ(mismatches.load(), 0);
  std::ifstream in(path);
  std::set<std::string> seqs;
  int records = 0;
  for (std::string line; std::getline(in, line); ++records) {
    ASSERT_EQ(line.front(), '{') << line;
    ASSERT_EQ(line.back(), '}') << line;
    seqs.insert(line.substr(0, line.find(',')));
  }
  EXPECT_EQ(records, calls.load());
  EXPECT_EQ(seqs.size(), static_cast<std::size_t>(records)) << "a seq repeated";
}

// A call whose scratch allocation fails (RLIMIT_AS) throws std::bad_alloc and has
// written nothing into the caller's output. In a fresh process (this binary re-run on
// this test alone): in one that ran other tests the allocator would have free memory
// to hand out under the limit.
void allocation_failure_child() {
  // The inputs first, then a limit at what is in use: the dw scratch of the simd backend
  // (512 dw blocks x 128 fp32, 256 KiB: an mmap) cannot be allocated.
  constexpr std::int64_t kRows = std::int64_t{1} << 17;
  test::Rng rng(3);
  const test::HostTensor x = test::random_tensor(DType::F32, {kRows, 128}, rng);
  const test::HostTensor dy = test::random_tensor(DType::F32, {kRows, 128}, rng);
  const test::HostTensor w = test::random_weight(DType::F32, 128, rng);
  test::HostTensor dx(DType::F32, {kRows, 128});
  test::HostTensor dw(DType::F32, {128});
  dx.fill_bytes(std::byte{0x5A});
  dw.fill_bytes(std::byte{0x5A});
  const test::HostTensor untouched = dx;
  set_backend("simd");
  set_num_threads(1);  // no pool thread to start under the limit
  std::ifstream status("/proc/self/status");
  std::size_t vm_kib = 0;
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmSize:", 0) == 0) vm_kib = std::stoul(line.substr(7));
  }
  const rlimit limit{vm_kib * 1024, vm_kib * 1024};
  if (::setrlimit(RLIMIT_AS, &limit) != 0) std::_Exit(3);
  try {
    qk_rmsnorm_backward(x.cview(), dy.cview(), w.cview(), dx.view(), dw.view());
  } catch (const std::bad_alloc&) {
    std::_Exit(dx == untouched ? 0 : 1);
  }
  std::_Exit(2);
}

TEST(Faults, AllocationFailureInsideACallLeavesTheOutputUntouched) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's allocator reserves its shadow memory: RLIMIT_AS cannot make "
                  "one allocation fail under it";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  GTEST_SKIP() << "a sanitizer's allocator reserves its shadow memory: RLIMIT_AS cannot make "
                  "one allocation fail under it";
#endif
#endif
  if (std::getenv("KA_FAULT_CHILD") != nullptr) allocation_failure_child();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setenv("KA_FAULT_CHILD", "1", 1);
    char self[] = "/proc/self/exe";
    char filter[] = "--gtest_filter=Faults.AllocationFailureInsideACallLeavesTheOutputUntouched";
    char* argv[] = {self, filter, nullptr};
    ::execv(self, argv);
    std::_Exit(127);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: the output was written, 2: no allocation failed, 3: "
                                       "no limit";
}

}  // namespace
}  // namespace kernel_align
