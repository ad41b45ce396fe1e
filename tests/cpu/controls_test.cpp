// Runtime controls (runtime.hpp, and the backend override of registry.hpp): forcing
// backends, paths and thread counts, their errors, and the KERNEL_ALIGN_BACKEND /
// KERNEL_ALIGN_STRICT / KERNEL_ALIGN_ISA / KERNEL_ALIGN_NUM_THREADS environment
// variables. The library reads the environment once, at first use,
// so those are tested in fresh processes: this binary re-runs itself
// (/proc/self/exe) with KA_RUNTIME_PROBE set, and then, before any test runs,
// only reports the settings it starts with and exits.
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/registry.hpp"
#include "kernel_align/runtime.hpp"
#include "support/runtime_guard.hpp"
#include "support/tensors.hpp"

namespace kernel_align {
namespace {

// The probe: first use of the library in this process, one small op on whatever
// backend the environment chose, then one line on stdout naming the backend that ran.
//   "backend=<name> isa=<name> threads=<n>" and exit 0, or
//   "error argument=<argument>" and exit 3 when the library rejects a setting.
[[maybe_unused]] const bool kProbed = [] {
  if (std::getenv("KA_RUNTIME_PROBE") == nullptr) return false;
  int status = 0;
  try {
    const Isa i = isa();
    const int n = num_threads();
    test::HostTensor x(DType::F32, {2, 4});
    for (std::int64_t e = 0; e < 8; ++e) x.set(e, static_cast<double>(e) - 3.5);
    test::HostTensor y(DType::F32, {2, 4});
    qk_rmsnorm_forward(x.cview(), std::nullopt, y.view());
    std::printf("backend=%s isa=%s threads=%d\n", last_call().backend.c_str(), isa_name(i), n);
  } catch (const Error& e) {
    std::printf("error argument=%s\n", e.argument().c_str());
    status = 3;
  }
  std::fflush(stdout);
  std::_Exit(status);
}();

struct ProbeResult {
  int status = -1;
  std::string out;
};

// Runs this binary as the probe with exactly the given KERNEL_ALIGN_* variables
// set (the others unset).
ProbeResult probe(const std::map<std::string, std::string>& env) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return {};
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipe_fds[0]);
    if (::dup2(pipe_fds[1], 1) < 0) std::_Exit(127);
    for (const char* name : {"KERNEL_ALIGN_BACKEND", "KERNEL_ALIGN_STRICT", "KERNEL_ALIGN_TRACE",
                             "KERNEL_ALIGN_ISA", "KERNEL_ALIGN_NUM_THREADS"}) {
      ::unsetenv(name);
    }
    for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
    ::setenv("KA_RUNTIME_PROBE", "1", 1);
    char self[] = "/proc/self/exe";
    char* argv[] = {self, nullptr};
    ::execv(self, argv);
    std::_Exit(127);
  }
  ::close(pipe_fds[1]);
  ProbeResult result;
  char buffer[256];
  ssize_t n = 0;
  while ((n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0) {
    result.out.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(pipe_fds[0]);
  int wait_status = 0;
  if (pid < 0 || ::waitpid(pid, &wait_status, 0) != pid || !WIFEXITED(wait_status)) {
    ADD_FAILURE() << "the probe process did not run or exit normally";
    return result;
  }
  result.status = WEXITSTATUS(wait_status);
  return result;
}

std::string settings_line(const char* backend_value, Isa isa_value, int threads) {
  return std::string("backend=") + backend_value + " isa=" + isa_name(isa_value) +
         " threads=" + std::to_string(threads) + "\n";
}

int all_cores() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

// ---------------------------------------------------------------------------
// In process.

TEST(RuntimeNames, AreTheEnvironmentSpellings) {
  EXPECT_STREQ(isa_name(Isa::Portable), "portable");
  EXPECT_STREQ(isa_name(Isa::Avx2), "avx2");
  EXPECT_STREQ(isa_name(Isa::Avx512), "avx512");
}

TEST(RuntimeControls, SetAndGetRoundTrip) {
  const test::RuntimeGuard guard;
  for (const char* name : {"reference", "simd", ""}) {
    set_backend(name);
    EXPECT_EQ(backend_override(), name);
  }
  for (Isa i : test::available_isas()) {
    set_isa(i);
    EXPECT_EQ(isa(), i);
  }
  for (int n : {1, 2, 3, 7, 64}) {
    set_num_threads(n);
    EXPECT_EQ(num_threads(), n);
  }
}

TEST(RuntimeControls, PortableIsAlwaysAvailable) {
  const test::RuntimeGuard guard;
  EXPECT_NO_THROW(set_isa(Isa::Portable));
  EXPECT_LE(Isa::Portable, best_isa());
#if defined(__x86_64__)
  // This build targets x86-64; where the CPU has AVX2 and F16C the AVX2 path is
  // expected (every CI machine of this project has them).
  __builtin_cpu_init();
  // F16C: CPUID.1:ECX bit 29 (clang 14's __builtin_cpu_supports does not know it).
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
  if (__builtin_cpu_supports("avx2") && f16c) {
    EXPECT_GE(best_isa(), Isa::Avx2);
  }
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl")) {
    EXPECT_EQ(best_isa(), Isa::Avx512);
  }
#endif
}

TEST(RuntimeControls, IsaAboveTheBestIsRejectedAndChangesNothing) {
  const test::RuntimeGuard guard;
  if (best_isa() == Isa::Avx512) {
    GTEST_SKIP() << "best_isa() is avx512, the highest path: nothing lies above it";
  }
  set_isa(Isa::Portable);
  for (Isa i : test::kAllIsas) {
    if (i <= best_isa()) continue;
    EXPECT_THROW(set_isa(i), Error) << isa_name(i);
    EXPECT_EQ(isa(), Isa::Portable) << "a rejected set_isa changed the path";
  }
}

TEST(RuntimeControls, ThreadCountBelowOneIsRejectedAndChangesNothing) {
  const test::RuntimeGuard guard;
  set_num_threads(3);
  for (int n : {0, -1, -7}) {
    try {
      set_num_threads(n);
      ADD_FAILURE() << "set_num_threads(" << n << ") did not throw";
    } catch (const Error& e) {
      EXPECT_FALSE(e.argument().empty());
    }
    EXPECT_EQ(num_threads(), 3);
  }
}

// The reference backend ignores path and thread settings; the CPU backend uses
// them. Either way a call gives the same bytes.
TEST(RuntimeControls, BackendSwitchGivesTheSameBytes) {
  const test::RuntimeGuard guard;
  test::Rng rng(51);
  const test::HostTensor x = test::random_tensor(DType::BF16, {3, 5, 64}, rng);
  std::vector<test::HostTensor> results;
  for (const test::RunConfig& c : test::all_cpu_configs()) {
    test::HostTensor y(DType::BF16, {3, 5, 64});
    c.apply();
    qk_rmsnorm_forward(x.cview(), std::nullopt, y.view());
    results.push_back(std::move(y));
  }
  test::RunConfig::reference().apply();
  test::HostTensor expected(DType::BF16, {3, 5, 64});
  qk_rmsnorm_forward(x.cview(), std::nullopt, expected.view());
  for (const test::HostTensor& y : results) EXPECT_TRUE(y == expected);
}

// ---------------------------------------------------------------------------
// The environment, in fresh processes.

TEST(RuntimeEnvironment, DefaultsAreCpuBestPathAllCores) {
  const ProbeResult r = probe({});
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out, settings_line("simd", best_isa(), all_cores()));
}

TEST(RuntimeEnvironment, BackendVariable) {
  EXPECT_EQ(probe({{"KERNEL_ALIGN_BACKEND", "reference"}}).out,
            settings_line("reference", best_isa(), all_cores()));
  EXPECT_EQ(probe({{"KERNEL_ALIGN_BACKEND", "simd"}}).out,
            settings_line("simd", best_isa(), all_cores()));
}

TEST(RuntimeEnvironment, IsaVariable) {
  for (Isa i : test::available_isas()) {
    const ProbeResult r = probe({{"KERNEL_ALIGN_ISA", isa_name(i)}});
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(r.out, settings_line("simd", i, all_cores()));
  }
}

TEST(RuntimeEnvironment, NumThreadsVariable) {
  for (int n : {1, 3, 7}) {
    const ProbeResult r = probe({{"KERNEL_ALIGN_NUM_THREADS", std::to_string(n)}});
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(r.out, settings_line("simd", best_isa(), n));
  }
}

TEST(RuntimeEnvironment, AllThreeTogether) {
  const ProbeResult r = probe({{"KERNEL_ALIGN_BACKEND", "reference"},
                               {"KERNEL_ALIGN_ISA", "portable"},
                               {"KERNEL_ALIGN_NUM_THREADS", "2"}});
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out, settings_line("reference", Isa::Portable, 2));
}

// A bad value is an error naming the variable at first use, never a silent default.
TEST(RuntimeEnvironment, BadValuesAreErrorsNamingTheVariable) {
  struct Bad {
    const char* name;
    const char* value;
  };
  std::vector<Bad> bad = {
      {"KERNEL_ALIGN_BACKEND", "gpu"},
      {"KERNEL_ALIGN_BACKEND", "simd "},
      {"KERNEL_ALIGN_BACKEND", "cpu"},
      {"KERNEL_ALIGN_STRICT", "yes"},
      {"KERNEL_ALIGN_ISA", "sse2"},
      {"KERNEL_ALIGN_ISA", "avx"},
      {"KERNEL_ALIGN_NUM_THREADS", "0"},
      {"KERNEL_ALIGN_NUM_THREADS", "-2"},
      {"KERNEL_ALIGN_NUM_THREADS", "3x"},
      {"KERNEL_ALIGN_NUM_THREADS", "many"},
      // What strtoll took and --threads refused: one parser for both now.
      {"KERNEL_ALIGN_NUM_THREADS", "+4"},
      {"KERNEL_ALIGN_NUM_THREADS", " 3"},
      {"KERNEL_ALIGN_NUM_THREADS", "99999999999999999999"},
  };
  // A path this machine lacks is as bad as an unknown one.
  for (Isa i : test::kAllIsas) {
    if (i > best_isa()) bad.push_back({"KERNEL_ALIGN_ISA", isa_name(i)});
  }
  for (const Bad& b : bad) {
    const ProbeResult r = probe({{b.name, b.value}});
    EXPECT_EQ(r.status, 3) << b.name << "=" << b.value << ": " << r.out;
    EXPECT_EQ(r.out, std::string("error argument=") + b.name + "\n") << b.name << "=" << b.value;
  }
}

}  // namespace
}  // namespace kernel_align
