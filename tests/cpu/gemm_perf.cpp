// Timing of the CPU GEMM engine (not a test): fp32 y = x w^T for M x N x K (default
// 1024 x 3072 x 3072), one thread by default, each ISA path this CPU has, against the
// FMA peak of this core measured in the same run (independent vfmadd chains).
// Usage: gemm_perf [M N K [threads]]. Needs AVX-512 (the peak loop is AVX-512 assembly).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "api/gemm_problem.hpp"
#include "cpu/gemm/gemm.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// 2 * 16 * 24 flops per iteration: 24 independent zmm fma chains, more than FMA latency
// times ports, written in assembly so that nothing but the fmas runs in the loop.
[[gnu::target("avx512f")]] double fma_peak_gflops() {
  const std::int64_t iterations = 50'000'000;
  const auto start = Clock::now();
  for (std::int64_t it = 0; it < iterations; ++it) {
    __asm__ volatile(
        ".irp r,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31\n"
        "vfmadd231ps %%zmm0, %%zmm1, %%zmm\\r\n"
        ".endr" ::
            : "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16",
              "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25",
              "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31");
  }
  const double elapsed = seconds_since(start);
  return 2.0 * 16 * 24 * static_cast<double>(iterations) / elapsed * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kernel_align;
  const std::int64_t m = argc > 3 ? std::atoll(argv[1]) : 1024;
  const std::int64_t n = argc > 3 ? std::atoll(argv[2]) : 3072;
  const std::int64_t k = argc > 3 ? std::atoll(argv[3]) : 3072;
  const int threads = argc > 4 ? std::atoi(argv[4]) : 1;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(m * k)), w(static_cast<std::size_t>(n * k)),
      y(static_cast<std::size_t>(m * n));
  for (float& v : x) v = dist(rng);
  for (float& v : w) v = dist(rng);
  const detail::GemmProblem p{m,
                              n,
                              k,
                              {x.data(), DType::F32, k, 1},
                              {w.data(), DType::F32, 1, k},
                              std::nullopt,
                              contract::Activation::None,
                              std::nullopt,
                              y.data(),
                              DType::F32,
                              n,
                              1};
  const double flops =
      2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const double peak = fma_peak_gflops() * threads;
  std::printf("fma peak (%d thread%s): %.1f GFLOP/s\n", threads, threads == 1 ? "" : "s", peak);
  for (Isa isa : {Isa::Avx512, Isa::Avx2}) {
    if (isa > best_isa()) continue;
    cpu::gemm(p, threads, isa);  // warm-up (page faults, pool)
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      const auto start = Clock::now();
      cpu::gemm(p, threads, isa);
      best = std::min(best, seconds_since(start));
    }
    std::printf("%s: M=%lld N=%lld K=%lld  %.3f s  %.1f GFLOP/s  %.1f%% of fma peak\n",
                isa_name(isa), static_cast<long long>(m), static_cast<long long>(n),
                static_cast<long long>(k), best, flops / best * 1e-9,
                100 * flops / best * 1e-9 / peak);
  }
  return 0;
}
