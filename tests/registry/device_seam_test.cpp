// The device seam: every tensor of a call on one device, which picks the registry's
// platform; the caller's execution context reaches the backend; a device call is
// validated exactly like a host call, before any backend runs; and device tensors
// never fall back to the host unless the caller opted in.
//
// No GPU is needed: a planted backend of platform cuda ("planted-cuda") records what it
// was handed and touches no memory, so views may claim cuda:0 for host buffers.
#include <gtest/gtest.h>

#include <string>

#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/registry.hpp"
#include "registry/registry.hpp"
#include "support/runtime_guard.hpp"
#include "support/tensors.hpp"

namespace kernel_align {
namespace {

using test::HostTensor;

// What the planted backend was last handed.
struct Seen {
  int calls = 0;
  Device device;
  void* stream = nullptr;
};
Seen seen;

registry::Backend planted_cuda(const registry::Capabilities& caps = {}) {
  registry::Backend b;
  b.name = "planted-cuda";
  b.platform = Platform::Cuda;
  b.priority = -10;
  b.capabilities = caps;
  b.unavailable_reason = [] { return std::string(); };
  b.isa_paths = [] { return std::string("none"); };
  b.fingerprint = "0000000000000000";
  b.kernels.set<OpType::QkRmsNorm, Direction::Forward>(
      [](const detail::RmsNormForwardProblem&, registry::Execution& exec) {
        ++seen.calls;
        seen.device = exec.device;
        seen.stream = exec.context.cuda_stream;
        exec.isa = "planted";
      });
  return b;
}

TensorView on(TensorView v, Device d) {
  v.device = d;
  return v;
}

class DeviceSeam : public ::testing::Test {
 protected:
  test::RuntimeGuard runtime;
  bool strict_before = strict();
  bool fallback_before = host_fallback();
  HostTensor x{DType::F32, {4, 8}};
  HostTensor y{DType::F32, {4, 8}};
  HostTensor w{DType::F32, {8}};
  static constexpr Device kCuda0 = Device::cuda(0);

  void SetUp() override { seen = {}; }
  void TearDown() override {
    set_strict(strict_before);
    set_host_fallback(fallback_before);
  }
};

TEST_F(DeviceSeam, TheTensorsDevicePicksThePlatformAndTheContextReachesTheBackend) {
  const registry::ScopedRegistration planted(planted_cuda());
  int stream_stand_in = 0;
  qk_rmsnorm_forward(on(x.view(), kCuda0), on(w.view(), kCuda0), on(y.view(), kCuda0), {},
                     ExecutionContext{&stream_stand_in});
  EXPECT_EQ(seen.calls, 1);
  EXPECT_EQ(seen.device, kCuda0);
  EXPECT_EQ(seen.stream, &stream_stand_in);
  EXPECT_EQ(last_call().backend, "planted-cuda");
  // Host tensors still go to the CPU backends.
  qk_rmsnorm_forward(x.cview(), w.cview(), y.view());
  EXPECT_EQ(seen.calls, 1);
  EXPECT_EQ(last_call().backend, "simd");
}

TEST_F(DeviceSeam, TensorsOnTwoDevicesAreAnErrorNamingBoth) {
  const registry::ScopedRegistration planted(planted_cuda());
  const auto expect_devices = [](const auto& call, const std::string& argument,
                                 const std::string& first, const std::string& second) {
    try {
      call();
      ADD_FAILURE() << "accepted tensors on two devices";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
      EXPECT_NE(e.expected().find("a tensor on " + first), std::string::npos) << e.what();
      EXPECT_EQ(e.found(), "one on " + second) << e.what();
    }
  };
  expect_devices([&] { qk_rmsnorm_forward(x.cview(), std::nullopt, on(y.view(), kCuda0)); }, "y",
                 "cpu", "cuda:0");
  expect_devices(
      [&] {
        qk_rmsnorm_forward(on(x.view(), kCuda0), on(w.view(), Device::cuda(1)),
                           on(y.view(), kCuda0));
      },
      "weight", "cuda:0", "cuda:1");
  EXPECT_EQ(seen.calls, 0);
}

// The validation layer is the one of host calls: the same argument and expectation, the
// view described with its device.
TEST_F(DeviceSeam, DeviceCallsAreValidatedLikeHostCalls) {
  const registry::ScopedRegistration planted(planted_cuda());
  const auto error_of = [](const auto& call) {
    try {
      call();
    } catch (const Error& e) {
      return std::pair{e.argument(), e.expected()};
    }
    return std::pair{std::string("none"), std::string()};
  };
  HostTensor short_w(DType::F32, {6});
  HostTensor odd(DType::F32, {4, 7});
  const auto host_weight =
      error_of([&] { qk_rmsnorm_forward(x.cview(), short_w.cview(), y.view()); });
  const auto device_weight = error_of([&] {
    qk_rmsnorm_forward(on(x.view(), kCuda0), on(short_w.view(), kCuda0), on(y.view(), kCuda0));
  });
  EXPECT_EQ(device_weight, host_weight);
  EXPECT_EQ(device_weight.first, "weight");
  const auto host_d = error_of([&] { qk_rmsnorm_forward(odd.cview(), std::nullopt, odd.view()); });
  const auto device_d = error_of(
      [&] { qk_rmsnorm_forward(on(odd.view(), kCuda0), std::nullopt, on(odd.view(), kCuda0)); });
  EXPECT_EQ(device_d, host_d);
  EXPECT_EQ(seen.calls, 0) << "a refused call reached the backend";
}

// A call the device backends cannot run is an Error naming every backend's reason, not
// a run on the host; the host fallback exists only by opt-in, and is then a recorded
// fallback (refused in strict mode).
TEST_F(DeviceSeam, NoSilentHostFallback) {
  registry::Capabilities fp32_only;
  fp32_only.dtypes = registry::bit(DType::F32);
  const registry::ScopedRegistration planted(planted_cuda(fp32_only));
  HostTensor xb(DType::BF16, {4, 8});
  HostTensor yb(DType::BF16, {4, 8});
  set_host_fallback(false);
  try {
    qk_rmsnorm_forward(on(xb.view(), kCuda0), std::nullopt, on(yb.view(), kCuda0));
    ADD_FAILURE() << "a bf16 call ran without a backend that supports it";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "backend");
    EXPECT_NE(std::string(e.what()).find("planted-cuda: dtype bf16 is not supported"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(seen.calls, 0);
  // A backend registered for cuda that needs the opt-in: unavailable until it is given.
  registry::Backend host = planted_cuda();
  host.name = "planted-host";
  host.priority = 100;
  host.unavailable_reason = [] {
    return host_fallback() ? std::string() : std::string("host fallback is off");
  };
  const registry::ScopedRegistration host_registration(host);
  EXPECT_THROW(qk_rmsnorm_forward(on(xb.view(), kCuda0), std::nullopt, on(yb.view(), kCuda0)),
               Error);
  set_host_fallback(true);
  const std::uint64_t fallbacks = fallback_count();
  qk_rmsnorm_forward(on(xb.view(), kCuda0), std::nullopt, on(yb.view(), kCuda0));
  EXPECT_EQ(last_call().backend, "planted-host");
  EXPECT_NE(last_call().fallback.find("planted-cuda"), std::string::npos);
  EXPECT_EQ(fallback_count(), fallbacks + 1);
  set_strict(true);
  EXPECT_THROW(qk_rmsnorm_forward(on(xb.view(), kCuda0), std::nullopt, on(yb.view(), kCuda0)),
               Error);
}

}  // namespace
}  // namespace kernel_align
