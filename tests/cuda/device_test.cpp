// The CUDA backend on a GPU (CUDA builds; every test skips, saying why, where no device
// is usable, as on CI machines): the matrix of cuda_matrix.hpp run by the real kernels on
// device copies of its host buffers ("cuda-device-copies": misalignment, strides and the
// gaps between elements kept), then the public API on device tensors: batch invariance
// across batches of 1 to 64 samples crossing every launch threshold, run-to-run
// determinism, a stream of the caller's, and trace digests taken on the device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "cuda/rebase.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/registry.hpp"
#include "registry/registry.hpp"
#include "support/op_cases.hpp"
#include "support/runtime_guard.hpp"
#include "trace/digest.hpp"

namespace kernel_align {
namespace {

void check(cudaError_t status, const char* what) {
  ASSERT_EQ(status, cudaSuccess) << what << ": " << cudaGetErrorString(status);
}

const registry::Backend& cuda_backend() {
  static const registry::Backend* backend = [] {
    for (const registry::Backend* b :
         registry::candidates(Platform::Cuda, OpType::QkRmsNorm, Direction::Forward)) {
      if (b->name == "cuda") return b;
    }
    return static_cast<const registry::Backend*>(nullptr);
  }();
  return *backend;
}

const char* const kBackendUnderTest = "cuda-device-copies";
std::string unavailable() {
  const std::string why = cuda_backend().unavailable_reason();
  return why.empty() ? "" : "the CUDA backend cannot run here: " + why;
}

// Device copies of the host memory a call's views reach (rebase.hpp's Mirror): each
// view's whole extent, placed at the same offset from a 64-byte boundary as on the host,
// and the outputs' copies brought back after the call.
class DeviceMirror {
 public:
  ~DeviceMirror() {
    for (const Copy& c : copies_) cudaFree(c.allocation);
  }
  template <class View>
  View map(View v, bool output) {
    std::int64_t last = 0;
    for (int i = 0; i < v.rank; ++i) last += (v.shape[i] - 1) * v.strides[i];
    const std::size_t bytes = static_cast<std::size_t>(last + 1) * dtype_size(v.dtype);
    auto* host = static_cast<unsigned char*>(const_cast<void*>(static_cast<const void*>(v.data)));
    Copy* copy = nullptr;
    for (Copy& c : copies_) {
      if (c.host == host && c.bytes == bytes) copy = &c;
    }
    if (copy == nullptr) {
      const std::size_t offset = reinterpret_cast<std::uintptr_t>(host) % 64;
      void* allocation = nullptr;
      if (cudaMalloc(&allocation, bytes + 64) != cudaSuccess) throw std::bad_alloc();
      copy = &copies_.emplace_back(
          Copy{host, bytes, allocation, static_cast<unsigned char*>(allocation) + offset, false});
      if (cudaMemcpy(copy->device, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        throw std::runtime_error("cudaMemcpy to the device failed");
      }
    }
    copy->output = copy->output || output;
    v.data = copy->device;
    v.device = Device::cuda(0);
    return v;
  }
  void write_back() {
    if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("the kernels failed");
    for (const Copy& c : copies_) {
      if (c.output &&
          cudaMemcpy(c.host, c.device, c.bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        throw std::runtime_error("cudaMemcpy to the host failed");
      }
    }
  }

 private:
  struct Copy {
    unsigned char* host;
    std::size_t bytes;
    void* allocation;
    unsigned char* device;
    bool output;
  };
  std::deque<Copy> copies_;
};

template <OpType op, Direction direction>
void on_device_copies(const detail::Problem<op, direction>& p, registry::Execution& exec) {
  DeviceMirror mirror;
  registry::Execution device_exec;
  device_exec.device = Device::cuda(0);
  cuda_backend().kernels.get<op, direction>()(cuda::rebased(p, mirror), device_exec);
  mirror.write_back();
  exec.isa = device_exec.isa;
  exec.launches = device_exec.launches;
}

template <OpType op>
void for_each_kernel(registry::Backend& b) {
  b.kernels.set<op, Direction::Forward>(on_device_copies<op, Direction::Forward>);
  b.kernels.set<op, Direction::Backward>(on_device_copies<op, Direction::Backward>);
}

registry::Backend device_copies_backend() {
  registry::Backend b;
  b.name = kBackendUnderTest;
  b.platform = Platform::Cpu;
  b.priority = 1000;
  b.unavailable_reason = [] { return cuda_backend().unavailable_reason(); };
  b.isa_paths = [] { return std::string("the cuda backend on device copies"); };
  b.fingerprint = "device-copies";
  for_each_kernel<OpType::QkRmsNorm>(b);
  for_each_kernel<OpType::MultiAxisRope>(b);
  for_each_kernel<OpType::QkNormRope>(b);
  return b;
}

class DeviceCopiesBackend : public ::testing::Environment {
 public:
  void SetUp() override { registration_.emplace(device_copies_backend()); }
  void TearDown() override { registration_.reset(); }

 private:
  std::optional<registry::ScopedRegistration> registration_;
};
const auto* const kEnvironment =
    ::testing::AddGlobalTestEnvironment(new DeviceCopiesBackend);  // NOLINT: gtest owns it

}  // namespace
}  // namespace kernel_align

#include "cuda/cuda_matrix.hpp"

namespace kernel_align {
namespace {

// A device buffer of a host tensor's bytes, and its views on cuda:0.
class DeviceTensor {
 public:
  explicit DeviceTensor(const test::HostTensor& host) : host_(host) {
    bytes_ = static_cast<std::size_t>(host.elements()) * dtype_size(host.dtype());
    if (cudaMalloc(&data_, bytes_) != cudaSuccess) throw std::bad_alloc();
    if (cudaMemcpy(data_, host.data(), bytes_, cudaMemcpyHostToDevice) != cudaSuccess) {
      throw std::runtime_error("cudaMemcpy");
    }
  }
  ~DeviceTensor() { cudaFree(data_); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;

  TensorView view() {
    TensorView v = host_.view();
    v.data = data_;
    v.device = Device::cuda(0);
    return v;
  }
  test::HostTensor to_host() const {
    test::HostTensor out = host_;
    if (cudaMemcpy(out.data(), data_, bytes_, cudaMemcpyDeviceToHost) != cudaSuccess) {
      throw std::runtime_error("cudaMemcpy");
    }
    return out;
  }

 private:
  test::HostTensor host_;  // shape, dtype (and the first contents)
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

struct FusedOnDevice {
  test::HostTensor q_out, k_out;
};

// The fused forward on device tensors of [batch, seq, heads, 128] bf16.
FusedOnDevice fused_forward(const test::HostTensor& q, const test::HostTensor& k,
                            const test::HostTensor& w, const test::TablePair& t,
                            std::int64_t text_len, ExecutionContext context = {}) {
  DeviceTensor dq(q), dk(k), dw(w), cos(t.cos), sin(t.sin);
  DeviceTensor q_out(q), k_out(k);
  const ConstTensorView wv = dw.view();
  qk_norm_rope_forward(
      dq.view(), dk.view(), {wv, wv, wv, wv}, cos.view(), sin.view(), q_out.view(), k_out.view(),
      {1e-6f, NormMode::Diffusers, Pairing::Interleaved, Layout::BSHD, text_len}, context);
  cudaDeviceSynchronize();
  return {q_out.to_host(), k_out.to_host()};
}

// Batch element `b` of a [B, ...] tensor's bytes.
std::vector<std::byte> element_bytes(const test::HostTensor& t, std::int64_t b) {
  const std::size_t element =
      static_cast<std::size_t>(t.elements() / t.shape()[0]) * dtype_size(t.dtype());
  const auto* base =
      static_cast<const std::byte*>(t.data()) + static_cast<std::size_t>(b) * element;
  return {base, base + element};
}

// A sample's bytes do not depend on its batch: alone and as element 0 of batches of 2 to
// 64 (the launches cross the fast path's 16384-row threshold: 300 rows a sample).
TEST(CudaDevice, BatchInvarianceAcrossBatchesOfOneTo64) {
  KA_SKIP_WITHOUT_BACKEND();
  Rng rng(11);
  constexpr std::int64_t kSeq = 100, kHeads = 3, kD = 128, kText = 17;
  const test::HostTensor w = test::random_weight(DType::BF16, kD, rng);
  const test::TablePair t = test::random_tables(kSeq, kD, rng);
  const test::HostTensor q1 = test::varied_rows(DType::BF16, {1, kSeq, kHeads, kD}, rng);
  const test::HostTensor k1 = test::varied_rows(DType::BF16, {1, kSeq, 1, kD}, rng);
  const FusedOnDevice alone = fused_forward(q1, k1, w, t, kText);
  for (const std::int64_t batch : {2, 3, 8, 33, 54, 55, 64}) {
    test::HostTensor qb = test::varied_rows(DType::BF16, {batch, kSeq, kHeads, kD}, rng);
    test::HostTensor kb = test::varied_rows(DType::BF16, {batch, kSeq, 1, kD}, rng);
    std::memcpy(qb.data(), q1.data(), element_bytes(q1, 0).size());
    std::memcpy(kb.data(), k1.data(), element_bytes(k1, 0).size());
    const FusedOnDevice batched = fused_forward(qb, kb, w, t, kText);
    EXPECT_EQ(element_bytes(batched.q_out, 0), element_bytes(alone.q_out, 0)) << batch;
    EXPECT_EQ(element_bytes(batched.k_out, 0), element_bytes(alone.k_out, 0)) << batch;
  }
}

// The same call three times gives the same bytes, on the default stream and on one of
// the caller's.
TEST(CudaDevice, RunToRunDeterminismOnTheCallersStream) {
  KA_SKIP_WITHOUT_BACKEND();
  Rng rng(12);
  const test::HostTensor w = test::random_weight(DType::F32, 128, rng);
  const test::TablePair t = test::random_tables(257, 128, rng);
  const test::HostTensor q = test::varied_rows(DType::F32, {2, 257, 4, 128}, rng);
  const test::HostTensor k = test::varied_rows(DType::F32, {2, 257, 2, 128}, rng);
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  const FusedOnDevice first = fused_forward(q, k, w, t, 31);
  for (int run = 0; run < 3; ++run) {
    const FusedOnDevice again = fused_forward(q, k, w, t, 31, ExecutionContext{stream});
    EXPECT_TRUE(again.q_out == first.q_out) << run;
    EXPECT_TRUE(again.k_out == first.k_out) << run;
  }
  cudaStreamDestroy(stream);
}

// While tracing, the digests of device outputs are computed on the device and equal the
// host's digests of the same bytes; the record names the device and the launches.
TEST(CudaDevice, TraceDigestsTakenOnTheDevice) {
  KA_SKIP_WITHOUT_BACKEND();
  const test::RuntimeGuard guard;
  const std::string path = testing::TempDir() + "cuda_device_trace.jsonl";
  std::remove(path.c_str());
  Rng rng(13);
  const test::HostTensor x = test::varied_rows(DType::BF16, {3, 50, 2, 128}, rng);
  DeviceTensor dx(x), dy(x);
  set_trace_path(path);
  qk_rmsnorm_forward(dx.view(), std::nullopt, dy.view());
  set_trace_path("");
  const test::HostTensor y = dy.to_host();
  std::ifstream in(path);
  std::string record;
  ASSERT_TRUE(std::getline(in, record));
  EXPECT_NE(record.find(R"("device":"cuda:0")"), std::string::npos) << record;
  EXPECT_NE(record.find(R"("backend":"cuda")"), std::string::npos) << record;
  EXPECT_NE(record.find(R"("kernel":"rmsnorm_forward")"), std::string::npos) << record;
  std::string expected = "\"digests\":{\"y\":[";
  const std::vector<std::uint64_t> digests = trace::batch_digests(y.cview());
  for (std::size_t b = 0; b < digests.size(); ++b) {
    char hex[24];
    std::snprintf(hex, sizeof hex, "%s\"%016llx\"", b == 0 ? "" : ",",
                  static_cast<unsigned long long>(digests[b]));
    expected += hex;
  }
  EXPECT_NE(record.find(expected + "]}"), std::string::npos) << record << "\n" << expected;
}

}  // namespace
}  // namespace kernel_align
