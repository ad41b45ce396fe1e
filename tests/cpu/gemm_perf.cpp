// Timing of the CPU GEMM engine (not a test): y = x w^T (forward layout) for a table of
// shapes, fp32 or bf16 x and w (fp32 accumulation; y of the inputs' dtype), on the best
// ISA path, against the FMA peak of this core measured in the same run (independent
// vfmadd chains, times the threads), and for M <= 16 (weight-streaming calls) against a
// memcpy of the weight's bytes timed in the same run.
// `gemm_perf attention S H D [threads [f32|bf16]]` times joint attention's CPU engine
// (cpu/attention.hpp, one sample of S tokens, H heads of D, no mask) forward and backward,
// counting its GEMM-like parts (forward: scores and P V, 4 S^2 H D flops; backward: the
// recomputed scores, dP, dV, dQ and dK, 10 S^2 H D) against the same-run FMA peak.
// Usage: gemm_perf [M N K [threads [f32|bf16 [avx512|avx2]]]]; without arguments the
// table of issue 31's shapes, 1 and 2 threads, fp32 and bf16. Needs AVX-512 (the peak
// loop is AVX-512 assembly). Prints one line per case:
//   M N K dtype isa threads seconds GFLOP/s %peak [memcpy-ratio]
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "api/attention_problem.hpp"
#include "api/gemm_problem.hpp"
#include "cpu/attention.hpp"
#include "cpu/gemm/gemm.hpp"
#include "kernel_align/contract/convert.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// 2 * 16 * 24 flops per iteration: 24 independent zmm fma chains, more than FMA latency
// times ports, written in assembly so that nothing but the fmas runs in the loop.
[[gnu::target("avx512f")]] double fma_peak_gflops() {
  const std::int64_t iterations = 20'000'000;
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
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
    best = std::max(best,
                    2.0 * 16 * 24 * static_cast<double>(iterations) / seconds_since(start) * 1e-9);
  }
  return best;
}

struct Case {
  std::int64_t m, n, k;
  kernel_align::DType dtype;
  int threads;
  kernel_align::Isa isa;
};

// Best of `reps` after one warm-up call.
template <class F>
double best_seconds(int reps, const F& f) {
  f();
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    const auto start = Clock::now();
    f();
    best = std::min(best, seconds_since(start));
  }
  return best;
}

void run_case(const Case& c, double peak_1thread) {
  using namespace kernel_align;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const std::size_t size = dtype_size(c.dtype);
  std::vector<std::uint8_t> x(static_cast<std::size_t>(c.m * c.k) * size),
      w(static_cast<std::size_t>(c.n * c.k) * size), y(static_cast<std::size_t>(c.m * c.n) * size);
  const auto fill = [&](std::vector<std::uint8_t>& v) {
    for (std::size_t i = 0; i < v.size() / size; ++i) {
      const float f = dist(rng);
      if (c.dtype == DType::F32) {
        std::memcpy(v.data() + i * 4, &f, 4);
      } else {
        const std::uint16_t h = contract::stored_bits16(c.dtype, f);
        std::memcpy(v.data() + i * 2, &h, 2);
      }
    }
  };
  fill(x);
  fill(w);
  const detail::GemmProblem p{c.m,
                              c.n,
                              c.k,
                              {x.data(), c.dtype, c.k, 1},
                              {w.data(), c.dtype, 1, c.k},
                              std::nullopt,
                              contract::Activation::None,
                              std::nullopt,
                              y.data(),
                              c.dtype,
                              c.n,
                              1};
  const double flops =
      2.0 * static_cast<double>(c.m) * static_cast<double>(c.n) * static_cast<double>(c.k);
  const int reps = flops > 1e10 ? 3 : flops > 1e9 ? 5 : 20;
  const double t = best_seconds(reps, [&] { cpu::gemm(p, c.threads, c.isa); });
  const double gflops = flops / t * 1e-9;
  std::printf("%6lld %6lld %6lld %5s %7s %d  %9.6f s %7.1f GFLOP/s %5.1f%% peak",
              static_cast<long long>(c.m), static_cast<long long>(c.n), static_cast<long long>(c.k),
              dtype_name(c.dtype), isa_name(c.isa), c.threads, t, gflops,
              100 * gflops / (peak_1thread * c.threads));
  if (c.m <= 16) {
    // The weight's bytes copied once (a read and a write of every byte), one thread.
    std::vector<std::uint8_t> copy(w.size());
    const double tc = best_seconds(reps, [&] { std::memcpy(copy.data(), w.data(), w.size()); });
    std::printf("  memcpy %9.6f s  memcpy/ours %.2f", tc, tc / t);
  }
  std::printf("\n");
  std::fflush(stdout);
}

void run_attention(std::int64_t seq, std::int64_t heads, std::int64_t dim, int threads,
                   kernel_align::DType dtype, double peak_1thread) {
  using namespace kernel_align;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  const std::int64_t count = seq * heads * dim;
  const std::size_t size = dtype_size(dtype);
  std::vector<std::uint8_t> q(static_cast<std::size_t>(count) * size), k(q), v(q), dout(q), out(q),
      dq(q), dk(q), dv(q);
  for (std::vector<std::uint8_t>* t : {&q, &k, &v, &dout}) {
    for (std::int64_t i = 0; i < count; ++i)
      contract::store_output(dtype, t->data(), i, normal(rng));
  }
  const std::array<std::int64_t, 4> strides{seq * heads * dim, heads * dim, dim, 1};
  const auto in = [&](const std::vector<std::uint8_t>& t) {
    return detail::AttentionInput{t.data(), dtype, strides};
  };
  const auto output = [&](std::vector<std::uint8_t>& t) {
    return detail::AttentionOutput{t.data(), dtype, strides};
  };
  const detail::AttentionProblem forward{1, seq, heads, dim, in(q), in(k), in(v), {}, output(out)};
  const detail::AttentionBackwardProblem backward{
      1,  seq,     heads,    dim,        in(q),      in(k),     in(v),
      {}, in(out), in(dout), output(dq), output(dk), output(dv)};
  const double s2hd = static_cast<double>(seq) * static_cast<double>(seq) *
                      static_cast<double>(heads) * static_cast<double>(dim);
  const double tf = best_seconds(2, [&] { cpu::attention_forward(forward, threads, best_isa()); });
  const double tb =
      best_seconds(2, [&] { cpu::attention_backward(backward, threads, best_isa()); });
  for (const auto& [name, t, flops] :
       {std::tuple{"forward", tf, 4 * s2hd}, std::tuple{"backward", tb, 10 * s2hd}}) {
    const double gflops = flops / t * 1e-9;
    std::printf(
        "attention %-8s S %6lld H %3lld D %4lld %5s %d  %9.6f s %7.1f GFLOP/s %5.1f%% peak\n", name,
        static_cast<long long>(seq), static_cast<long long>(heads), static_cast<long long>(dim),
        dtype_name(dtype), threads, t, gflops, 100 * gflops / (peak_1thread * threads));
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kernel_align;
  const double peak = fma_peak_gflops();
  std::printf("fma peak (1 thread): %.1f GFLOP/s\n", peak);
  if (argc > 4 && std::string(argv[1]) == "attention") {
    run_attention(std::atoll(argv[2]), std::atoll(argv[3]), std::atoll(argv[4]),
                  argc > 5 ? std::atoi(argv[5]) : 1,
                  argc > 6 && std::string(argv[6]) == "bf16" ? DType::BF16 : DType::F32, peak);
    return 0;
  }
  std::vector<Case> cases;
  if (argc > 3) {
    Case c{std::atoll(argv[1]), std::atoll(argv[2]), std::atoll(argv[3]), DType::F32, 1,
           best_isa()};
    if (argc > 4) c.threads = std::atoi(argv[4]);
    if (argc > 5 && std::string(argv[5]) == "bf16") c.dtype = DType::BF16;
    if (argc > 6 && std::string(argv[6]) == "avx2") c.isa = Isa::Avx2;
    cases.push_back(c);
  } else {
    const std::int64_t nk[][2] = {{3072, 64},    {3072, 3584},  {3072, 3072}, {18432, 3072},
                                  {12288, 3072}, {3072, 12288}, {64, 3072}};
    for (DType t : {DType::F32, DType::BF16}) {
      for (int threads : {1, 2}) {
        for (std::int64_t m : {4352, 1, 4}) {
          for (const auto& s : nk) cases.push_back({m, s[0], s[1], t, threads, best_isa()});
        }
      }
    }
  }
  for (const Case& c : cases) run_case(c, peak);
  return 0;
}
