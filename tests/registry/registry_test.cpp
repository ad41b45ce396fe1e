// The backend registry (registry.hpp): selection in priority order, a fallback for
// each capability mismatch (recorded, counted, warned about once, traced), strict
// mode, and the override by API. The environment variables are tested in fresh
// processes by tests/cpu/controls_test.cpp.
//
// The built-in backends support every call, so these tests register a backend
// ("narrow") ahead of them whose capabilities leave out one thing at a time.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "cpu/cpu_backend.hpp"
#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/registry.hpp"
#include "registry/registry.hpp"
#include "support/op_cases.hpp"
#include "support/runtime_guard.hpp"
#include "support/tensors.hpp"

namespace kernel_align {
namespace {

using test::HostTensor;

// Restores the override, strict mode and tracing when a test ends.
class RegistryGuard {
 public:
  RegistryGuard() : strict_(strict()) {}
  ~RegistryGuard() {
    set_strict(strict_);
    set_trace_path("");
  }
  RegistryGuard(const RegistryGuard&) = delete;
  RegistryGuard& operator=(const RegistryGuard&) = delete;

 private:
  test::RuntimeGuard runtime_;
  bool strict_;
};

// A CPU backend that runs the simd kernels but declares `caps`, ahead of simd.
registry::Backend narrow_backend(
    const registry::Capabilities& caps,
    std::string (*unavailable)() = [] { return std::string(); }) {
  registry::Backend b;
  b.name = "narrow";
  b.platform = Platform::Cpu;
  b.priority = -1;
  b.capabilities = caps;
  b.unavailable_reason = unavailable;
  b.isa_paths = [] { return std::string("as simd"); };
  b.fingerprint = "0000000000000000";
  const registry::Kernels simd = cpu::simd_kernels();
  b.kernels.set<OpType::QkRmsNorm, Direction::Forward>(
      simd.get<OpType::QkRmsNorm, Direction::Forward>());
  b.kernels.set<OpType::QkRmsNorm, Direction::Backward>(
      simd.get<OpType::QkRmsNorm, Direction::Backward>());
  b.kernels.set<OpType::QkNormRope, Direction::Forward>(
      simd.get<OpType::QkNormRope, Direction::Forward>());
  return b;  // no rope: "narrow" does not implement multi_axis_rope
}

constexpr std::int64_t kB = 2, kS = 5, kH = 3, kD = 32;

// Whether the call's option `name` has the value `value`: what a backend's own test
// (Capabilities::unsupported) reads.
bool option_is(const detail::CallRecord& c, const char* name, std::string_view value) {
  const detail::OptionValue* o = c.option(name);
  return o != nullptr && o->choice == value;
}

// Why a call whose head dim (the last dim of its first tensor) is below `min` is refused.
std::string head_dim_below(const detail::CallRecord& c, std::int64_t min) {
  const ConstTensorView& v = c.tensors.front().view;
  const std::int64_t d = v.shape[v.rank - 1];
  return d < min ? "head dim " + std::to_string(d) + " is below " + std::to_string(min) : "";
}

// One rmsnorm forward of [kB, kS, kH, d] in `dtype`; returns y.
HostTensor rmsnorm_call(DType dtype, int d = kD, std::optional<NormMode> mode = std::nullopt) {
  test::Rng rng(7);
  const HostTensor x = test::random_tensor(dtype, {kB, kS, kH, d}, rng);
  HostTensor y(dtype, {kB, kS, kH, d});
  RmsNormOptions options;
  if (mode) options.mode = *mode;
  qk_rmsnorm_forward(x.cview(), std::nullopt, y.view(), options);
  return y;
}

HostTensor reference_rmsnorm(DType dtype, int d = kD, std::optional<NormMode> mode = std::nullopt) {
  set_backend("reference");
  HostTensor y = rmsnorm_call(dtype, d, mode);
  set_backend("");
  return y;
}

TEST(Registry, DefaultIsSimdThenReference) {
  const RegistryGuard guard;
  const registry::BackendList list =
      registry::candidates(Platform::Cpu, OpType::QkNormRope, Direction::Backward);
  ASSERT_EQ(list.count, 2);
  EXPECT_EQ(list.items[0]->name, "simd");
  EXPECT_EQ(list.items[1]->name, "reference");
  rmsnorm_call(DType::F32);
  EXPECT_EQ(last_call().backend, "simd");
  EXPECT_EQ(last_call().requested_backend, "simd");
  EXPECT_EQ(last_call().isa, isa_name(isa()));
  EXPECT_EQ(last_call().fallback, "");
}

TEST(Registry, LastCallTimesTheBackendWithinTheLibraryCall) {
  const RegistryGuard guard;
  test::Rng rng(3);
  const HostTensor x = test::random_tensor(DType::BF16, {1, 64, 24, kD}, rng);
  HostTensor y(DType::BF16, {1, 64, 24, kD});
  for (int call = 0; call < 3; ++call) {
    const auto start = std::chrono::steady_clock::now();
    qk_rmsnorm_forward(x.cview(), std::nullopt, y.view(), {});
    const std::chrono::duration<double> whole = std::chrono::steady_clock::now() - start;
    const CallReport report = last_call();
    EXPECT_GT(report.backend_seconds, 0.0) << "call " << call;
    EXPECT_LE(report.backend_seconds, report.call_seconds) << "call " << call;
    EXPECT_LE(report.call_seconds, whole.count()) << "call " << call;
  }
}

// Off the CPU only CUDA has backends, in builds with it: "cuda", then the opt-in host
// fallback "cuda-host". A call there without them (or with both unavailable, as on a
// machine with no GPU) is an Error naming the platform and every reason.
TEST(Registry, OnlyCudaHasBackendsOffTheCpu) {
  for (const Platform p : {Platform::Rocm, Platform::Musa, Platform::Npu}) {
    EXPECT_EQ(registry::candidates(p, OpType::QkRmsNorm, Direction::Forward).count, 0);
  }
  const registry::BackendList cuda =
      registry::candidates(Platform::Cuda, OpType::QkRmsNorm, Direction::Forward);
  ASSERT_EQ(cuda.count, KA_CUDA_BUILD ? 2 : 0);
  if (KA_CUDA_BUILD) {
    EXPECT_EQ(cuda.items[0]->name, "cuda");
    EXPECT_EQ(cuda.items[1]->name, "cuda-host");
    if (cuda.items[0]->unavailable_reason().empty()) {
      GTEST_SKIP() << "a CUDA device is available here: the no-backend error cannot show";
    }
  }
  detail::CallRecord call;
  call.device = Device::cuda(0);
  try {
    registry::choose(call);
    ADD_FAILURE() << "a cuda call was given a backend";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "backend");
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
    if (KA_CUDA_BUILD) {
      EXPECT_NE(std::string(e.what()).find("cuda-host: unavailable: the host fallback is off"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(Registry, OverrideByApiRunsThatBackend) {
  const RegistryGuard guard;
  set_backend("reference");
  const HostTensor by_reference = rmsnorm_call(DType::BF16);
  EXPECT_EQ(last_call().backend, "reference");
  EXPECT_EQ(last_call().isa, "scalar");
  set_backend("");
  const HostTensor by_simd = rmsnorm_call(DType::BF16);
  EXPECT_EQ(last_call().backend, "simd");
  EXPECT_TRUE(by_reference == by_simd);
}

// set_thread_backend: one thread's calls on one backend while the process-wide choice
// (and every other thread) stays on another.
TEST(Registry, ThreadOverrideRunsThatBackendOnThatThreadOnly) {
  const RegistryGuard guard;
  set_backend("simd");
  std::string on_thread;
  std::string thread_override;
  std::optional<HostTensor> by_reference;
  std::thread([&] {
    set_thread_backend("reference");
    by_reference.emplace(rmsnorm_call(DType::BF16));
    on_thread = last_call().backend;
    thread_override = thread_backend_override();
  }).join();
  EXPECT_EQ(on_thread, "reference");
  EXPECT_EQ(thread_override, "reference");
  EXPECT_EQ(thread_backend_override(), "") << "another thread's override leaked here";
  const HostTensor by_simd = rmsnorm_call(DType::BF16);
  EXPECT_EQ(last_call().backend, "simd");
  ASSERT_TRUE(by_reference.has_value());
  EXPECT_TRUE(*by_reference == by_simd);

  set_thread_backend("reference");  // ahead of set_backend's choice
  (void)rmsnorm_call(DType::BF16);
  EXPECT_EQ(last_call().backend, "reference");
  set_thread_backend("");
  (void)rmsnorm_call(DType::BF16);
  EXPECT_EQ(last_call().backend, "simd");
}

TEST(Registry, ThreadOverrideOfAnUnknownOrRemovedBackendIsAnError) {
  const RegistryGuard guard;
  EXPECT_THROW(set_thread_backend("gpu"), Error);
  EXPECT_EQ(thread_backend_override(), "");
  {
    const registry::ScopedRegistration narrow(narrow_backend({}));
    set_thread_backend("narrow");
  }
  try {
    (void)rmsnorm_call(DType::F32);
    ADD_FAILURE() << "a call ran with its thread's backend unregistered";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "backend");
    EXPECT_NE(std::string(e.what()).find("'narrow'"), std::string::npos) << e.what();
  }
  set_thread_backend("");
}

TEST(Registry, UnknownNameIsAnErrorListingTheValidNames) {
  const RegistryGuard guard;
  try {
    set_backend("gpu");
    ADD_FAILURE() << "accepted an unknown backend";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "backend");
    const std::string message = e.what();
    EXPECT_NE(message.find("simd, reference"), std::string::npos) << message;
    EXPECT_NE(message.find("'gpu'"), std::string::npos) << message;
  }
  EXPECT_EQ(backend_override(), "");
}

// Each capability left out, and a call that needs it.
struct Mismatch {
  const char* name;
  registry::Capabilities caps;
  DType dtype;
  int d;
  std::optional<NormMode> mode;
  const char* reason;  // expected in the fallback reason
};

std::vector<Mismatch> mismatches() {
  std::vector<Mismatch> all;
  registry::Capabilities fp32_only;
  fp32_only.dtypes = registry::bit(DType::F32);
  all.push_back({"dtype", fp32_only, DType::BF16, kD, std::nullopt,
                 "narrow: dtype bf16 is not supported (supports fp32)"});
  registry::Capabilities single_only;
  single_only.unsupported = [](const detail::CallRecord& c) -> std::string {
    return option_is(c, "mode", "diffusers") ? "mode diffusers is not supported" : "";
  };
  all.push_back({"mode", single_only, DType::F32, kD, NormMode::Diffusers,
                 "narrow: mode diffusers is not supported"});
  registry::Capabilities wide_rows;
  wide_rows.unsupported = [](const detail::CallRecord& c) { return head_dim_below(c, 64); };
  all.push_back(
      {"head_dim", wide_rows, DType::F32, kD, std::nullopt, "narrow: head dim 32 is below 64"});
  registry::Capabilities page_aligned;
  page_aligned.min_alignment = std::size_t{1} << 20;  // no heap buffer is that aligned
  all.push_back({"alignment", page_aligned, DType::F32, kD, std::nullopt,
                 "narrow: needs data aligned to 1048576 bytes"});
  return all;
}

TEST(Registry, EveryCapabilityMismatchFallsBackWithItsReason) {
  for (const Mismatch& m : mismatches()) {
    SCOPED_TRACE(m.name);
    const RegistryGuard guard;
    const HostTensor expected = reference_rmsnorm(m.dtype, m.d, m.mode);
    const registry::ScopedRegistration narrow(narrow_backend(m.caps));
    const std::uint64_t before = fallback_count();
    const HostTensor y = rmsnorm_call(m.dtype, m.d, m.mode);
    EXPECT_TRUE(y == expected);
    EXPECT_EQ(last_call().requested_backend, "narrow");
    EXPECT_EQ(last_call().backend, "simd");
    EXPECT_NE(last_call().fallback.find(m.reason), std::string::npos) << last_call().fallback;
    EXPECT_EQ(fallback_count(), before + 1);
  }
}

TEST(Registry, LayoutPairingAndContiguityMismatchesFallBack) {
  const RegistryGuard guard;
  registry::Capabilities caps;
  caps.unsupported = [](const detail::CallRecord& c) -> std::string {
    if (option_is(c, "layout", "bhsd")) return "layout bhsd is not supported";
    if (option_is(c, "pairing", "half")) return "pairing half is not supported";
    return "";
  };
  caps.needs_contiguous_rows = true;
  const registry::ScopedRegistration narrow(narrow_backend(caps));
  test::Rng rng(3);
  const HostTensor q = test::random_tensor(DType::F32, {1, kS, kH, kD}, rng);
  const test::TablePair t = test::random_tables(kS, kD, rng);
  const auto fused = [&](Layout layout, Pairing pairing) {
    HostTensor q_out(DType::F32, {1, kS, kH, kD});
    HostTensor k_out(DType::F32, {1, kS, kH, kD});
    QkNormRopeOptions options;
    options.layout = layout;
    options.pairing = pairing;
    ConstTensorView qv = q.cview();
    if (layout == Layout::BHSD)
      qv = test::strided(qv, {1, kH, kS, kD}, {kS * kH * kD, kD, kH * kD, 1});
    TensorView qo = q_out.view();
    TensorView ko = k_out.view();
    if (layout == Layout::BHSD) {
      qo = test::strided(qo, {1, kH, kS, kD}, {kS * kH * kD, kD, kH * kD, 1});
      ko = test::strided(ko, {1, kH, kS, kD}, {kS * kH * kD, kD, kH * kD, 1});
    }
    qk_norm_rope_forward(qv, qv, {}, t.cos.cview(), t.sin.cview(), qo, ko, options);
    return last_call();
  };
  EXPECT_EQ(fused(Layout::BSHD, Pairing::Interleaved).backend, "narrow");
  const CallReport bhsd = fused(Layout::BHSD, Pairing::Interleaved);
  EXPECT_EQ(bhsd.backend, "simd");
  EXPECT_NE(bhsd.fallback.find("layout bhsd is not supported"), std::string::npos) << bhsd.fallback;
  const CallReport half = fused(Layout::BSHD, Pairing::Half);
  EXPECT_EQ(half.backend, "simd");
  EXPECT_NE(half.fallback.find("pairing half is not supported"), std::string::npos)
      << half.fallback;

  // A strided last dim.
  HostTensor wide = test::random_tensor(DType::F32, {kS, 2 * kD}, rng);
  HostTensor y(DType::F32, {kS, kD});
  qk_rmsnorm_forward(test::strided(wide.cview(), {kS, kD}, {2 * kD, 2}), std::nullopt, y.view());
  EXPECT_EQ(last_call().backend, "simd");
  EXPECT_NE(last_call().fallback.find("needs rows with unit stride"), std::string::npos)
      << last_call().fallback;
}

TEST(Registry, UnavailableAndUnimplementedFallBack) {
  const RegistryGuard guard;
  {
    const registry::ScopedRegistration narrow(
        narrow_backend({}, [] { return std::string("no test device"); }));
    rmsnorm_call(DType::F32);
    EXPECT_EQ(last_call().backend, "simd");
    EXPECT_EQ(last_call().fallback, "narrow: unavailable: no test device");
  }
  const registry::ScopedRegistration narrow(narrow_backend({}));
  set_backend("narrow");  // forced, although it has no RoPE
  test::Rng rng(5);
  const HostTensor x = test::random_tensor(DType::F32, {1, kS, kH, kD}, rng);
  const test::TablePair t = test::random_tables(kS, kD, rng);
  HostTensor y(DType::F32, {1, kS, kH, kD});
  multi_axis_rope_forward(x.cview(), t.cos.cview(), t.sin.cview(), y.view(), {});
  EXPECT_EQ(last_call().backend, "simd");
  EXPECT_EQ(last_call().fallback, "narrow: does not implement multi_axis_rope forward");
}

TEST(Registry, StrictModeRefusesInsteadOfFallingBack) {
  const RegistryGuard guard;
  registry::Capabilities fp32_only;
  fp32_only.dtypes = registry::bit(DType::F32);
  const registry::ScopedRegistration narrow(narrow_backend(fp32_only));
  set_strict(true);
  test::Rng rng(9);
  const HostTensor x = test::random_tensor(DType::BF16, {kS, kD}, rng);
  HostTensor y(DType::BF16, {kS, kD});
  y.fill_bytes(std::byte{0x5A});
  const HostTensor untouched = y;
  const std::uint64_t before = fallback_count();
  try {
    qk_rmsnorm_forward(x.cview(), std::nullopt, y.view());
    ADD_FAILURE() << "strict mode fell back";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "backend");
    const std::string message = e.what();
    EXPECT_NE(message.find("strict"), std::string::npos) << message;
    EXPECT_NE(message.find("dtype bf16 is not supported"), std::string::npos) << message;
  }
  EXPECT_TRUE(y == untouched) << "a refused call wrote its output";
  EXPECT_EQ(fallback_count(), before);
  // A call the first choice supports still runs.
  const HostTensor x32 = test::random_tensor(DType::F32, {kS, kD}, rng);
  HostTensor y32(DType::F32, {kS, kD});
  EXPECT_NO_THROW(qk_rmsnorm_forward(x32.cview(), std::nullopt, y32.view()));
  EXPECT_EQ(last_call().backend, "narrow");
}

TEST(Registry, FirstFallbackPerOpAndReasonWarnsOnce) {
  const RegistryGuard guard;
  registry::Capabilities caps;
  // A reason no other test gives.
  caps.unsupported = [](const detail::CallRecord& c) { return head_dim_below(c, 4000); };
  const registry::ScopedRegistration narrow(narrow_backend(caps));
  testing::internal::CaptureStderr();
  rmsnorm_call(DType::F32);
  rmsnorm_call(DType::F32);
  const std::string err = testing::internal::GetCapturedStderr();
  const std::string line =
      "kernel-align: warning: qk_rmsnorm forward fell back from narrow to simd (narrow: head dim "
      "32 is below 4000)";
  EXPECT_NE(err.find(line), std::string::npos) << err;
  EXPECT_EQ(err.find(line), err.rfind(line)) << "warned twice: " << err;
}

TEST(Registry, FallbackIsInTheTraceRecord) {
  const RegistryGuard guard;
  registry::Capabilities fp32_only;
  fp32_only.dtypes = registry::bit(DType::F32);
  const registry::ScopedRegistration narrow(narrow_backend(fp32_only));
  const std::string path = testing::TempDir() + "registry_fallback.jsonl";
  std::remove(path.c_str());  // traces are appended to
  set_trace_path(path);
  rmsnorm_call(DType::BF16);
  set_trace_path("");
  std::ifstream in(path);
  std::string record;
  ASSERT_TRUE(std::getline(in, record));
  EXPECT_NE(record.find("\"requested_backend\":\"narrow\",\"backend\":\"simd\""), std::string::npos)
      << record;
  EXPECT_NE(record.find("\"fallback\":\"narrow: dtype bf16 is not supported (supports fp32)\""),
            std::string::npos)
      << record;
  std::string extra;
  EXPECT_FALSE(std::getline(in, extra)) << "one call, one record";
}

TEST(Registry, TableListsEveryPlatformAndOp) {
  const std::vector<RegistryRow> rows = registry_table();
  EXPECT_EQ(rows.size(), 5u * kOpCount);  // 5 platforms x every op
  for (const RegistryRow& row : rows) {
    // Every op has CUDA kernels (cuda/device_plans.hpp) and the host fallback.
    if (row.platform == Platform::Cuda && KA_CUDA_BUILD) {
      ASSERT_EQ(row.backends.size(), 2u);
      EXPECT_EQ(row.backends[0].name, "cuda");
      EXPECT_EQ(row.backends[0].fingerprint.size(), 16u);
      // Where no device is, the row says why (the driver's error on these CI machines).
      EXPECT_EQ(row.backends[0].available, row.backends[0].unavailable_reason.empty());
      EXPECT_EQ(row.backends[1].name, "cuda-host");
      continue;
    }
    if (row.platform != Platform::Cpu) {
      EXPECT_TRUE(row.backends.empty());
      continue;
    }
    ASSERT_EQ(row.backends.size(), 2u);
    EXPECT_EQ(row.backends[0].name, "simd");
    EXPECT_TRUE(row.backends[0].available);
    EXPECT_NE(row.backends[0].isa_paths.find(std::string(isa_name(best_isa())) + " (best)"),
              std::string::npos);
    EXPECT_EQ(row.backends[0].fingerprint.size(), 16u);
    EXPECT_EQ(row.backends[1].name, "reference");
    EXPECT_EQ(row.backends[1].isa_paths, "scalar");
  }
}

}  // namespace
}  // namespace kernel_align
