// The CUDA backends: "cuda" runs the plans of cuda/plan.hpp on the device, queued on the
// caller's stream; "cuda-host" (opt-in, set_host_fallback) runs the CPU reference on
// host copies of the tensors.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "cuda/device_plans.hpp"
#include "cuda/plan.hpp"
#include "cuda/rebase.hpp"
#include "kernel_align/fingerprints.hpp"
#include "kernel_align/registry.hpp"
#include "reference/kernels.hpp"
#include "trace/trace.hpp"

namespace kernel_align::cuda {
namespace {

// The dynamic shared memory a launch may take without opting in.
constexpr unsigned kDefaultDynamicSharedBytes = 48 * 1024;

template <class Kernel>
__global__ void __launch_bounds__(kMaxBlockThreads) kernel_entry(const typename Kernel::Params p) {
  __shared__ typename Kernel::Shared shared;
  Kernel::run(p, shared);
}

void check(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) {
    throw std::runtime_error("kernel_align: CUDA error in " + what + ": " +
                             cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
  }
}

// Why this process sees no CUDA device ("" when it sees one), asked once.
std::string no_device() {
  static const std::string reason = [] {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      cudaGetLastError();  // clear it: nothing else here is affected
      return std::string("no CUDA device: ") + cudaGetErrorName(status) + " (" +
             cudaGetErrorString(status) + ")";
    }
    return count == 0 ? std::string("no CUDA device") : std::string();
  }();
  return reason;
}

// Why the CUDA backend cannot run here ("" when it can).
std::string device_unavailable() {
  static const std::string reason = [] {
    if (std::string why = no_device(); !why.empty()) return why;
    int count = 0;
    check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    for (int d = 0; d < count; ++d) {
      cudaDeviceProp props{};
      if (cudaGetDeviceProperties(&props, d) == cudaSuccess && props.major < 8) {
        return "device " + std::to_string(d) + " (" + props.name + ") has compute capability " +
               std::to_string(props.major) + "." + std::to_string(props.minor) +
               ", below the 8.0 this build's kernels are compiled for";
      }
    }
    return std::string();
  }();
  return reason;
}

// The caller's current device while a call runs on another, restored after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// plan.hpp's Executor on a device: launches on the call's stream; scratch from the
// stream-ordered allocator, freed in stream order when the call ends; while tracing,
// the launches are timed with events (which waits for them).
class DeviceExecutor {
 public:
  explicit DeviceExecutor(registry::Execution& exec)
      : exec_(exec),
        guard_(exec.device.ordinal),
        stream_(static_cast<cudaStream_t>(exec.context.cuda_stream)),
        timed_(trace::enabled()) {
    exec_.isa = "cuda";
    exec_.threads = 0;
    if (timed_) {
      check(cudaEventCreate(&start_), "cudaEventCreate");
      check(cudaEventCreate(&stop_), "cudaEventCreate");
      check(cudaEventRecord(start_, stream_), "cudaEventRecord");
    }
  }

  ~DeviceExecutor() {
    for (void* p : scratch_) cudaFreeAsync(p, stream_);
    if (timed_) {
      cudaEventDestroy(start_);
      cudaEventDestroy(stop_);
    }
  }
  DeviceExecutor(const DeviceExecutor&) = delete;
  DeviceExecutor& operator=(const DeviceExecutor&) = delete;

  // Ends the call: the device time when timed.
  void finish() {
    if (!timed_) return;
    check(cudaEventRecord(stop_, stream_), "cudaEventRecord");
    check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    exec_.device_milliseconds = ms;
  }

  template <template <class> class Kernel>
  void launch(const registry::LaunchRecord& l, const typename Kernel<CudaGrid>::Params& p) {
    exec_.launches.push_back(l);
    if (l.dynamic_shared_bytes > kDefaultDynamicSharedBytes) {
      // Above 48 KiB a kernel must opt in to its dynamic shared memory.
      check(cudaFuncSetAttribute(kernel_entry<Kernel<CudaGrid>>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(l.dynamic_shared_bytes)),
            "the dynamic shared memory of " + l.kernel);
    }
    kernel_entry<Kernel<CudaGrid>>
        <<<dim3(l.grid[0], l.grid[1], l.grid[2]), dim3(l.block[0], l.block[1], l.block[2]),
           l.dynamic_shared_bytes, stream_>>>(p);
    check(cudaGetLastError(), "the launch of " + l.kernel);
  }

  float* scratch_floats(std::size_t count) {
    return static_cast<float*>(scratch(count * sizeof(float)));
  }
  std::uint64_t* scratch_digests(std::size_t count) {
    return static_cast<std::uint64_t*>(scratch(count * sizeof(std::uint64_t)));
  }
  std::int64_t* scratch_indices(std::size_t count) {
    return static_cast<std::int64_t*>(scratch(count * sizeof(std::int64_t)));
  }
  void copy_to_host(void* host, const void* device, std::size_t bytes) {
    check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  const float* one() {
    static constexpr float kOne = 1.0f;
    float* device = scratch_floats(1);
    check(cudaMemcpyAsync(device, &kOne, sizeof kOne, cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync");
    return device;
  }
  // +0 is all-zero bits in every dtype: one 2-D memset over the strided elements.
  void zero(const TensorView& v) {
    const std::size_t size = dtype_size(v.dtype);
    check(cudaMemset2DAsync(v.data, static_cast<std::size_t>(v.strides[0]) * size, 0, size,
                            static_cast<std::size_t>(v.shape[0]), stream_),
          "cudaMemset2DAsync");
  }

 private:
  void* scratch(std::size_t bytes) {
    void* p = nullptr;
    check(cudaMallocAsync(&p, bytes, stream_), "cudaMallocAsync");
    scratch_.push_back(p);
    return p;
  }

  registry::Execution& exec_;
  DeviceGuard guard_;
  cudaStream_t stream_;
  bool timed_;
  cudaEvent_t start_{};
  cudaEvent_t stop_{};
  std::vector<void*> scratch_;
};

template <class Problem, void (*Plan)(const Problem&, DeviceExecutor&)>
void on_device(const Problem& p, registry::Execution& exec) {
  DeviceExecutor executor(exec);
  Plan(p, executor);
  executor.finish();
}

std::vector<std::uint64_t> device_digests(const ConstTensorView& v,
                                          const registry::Execution& call) {
  registry::Execution exec;
  exec.device = call.device;
  exec.context = call.context;
  DeviceExecutor executor(exec);
  return plan::batch_digests(v, executor);
}

// ---- cuda-host: the reference on host copies ----------------------------------------

// Host copies of the device memory a call's views reach (rebase.hpp's Mirror): each
// view's whole extent, once per distinct (address, extent), and after the call the
// outputs' copies written back.
class HostMirror {
 public:
  explicit HostMirror(const registry::Execution& exec)
      : guard_(exec.device.ordinal), stream_(static_cast<cudaStream_t>(exec.context.cuda_stream)) {}

  template <class View>
  View map(View v, bool output) {
    std::int64_t last = 0;
    for (int i = 0; i < v.rank; ++i) last += (v.shape[i] - 1) * v.strides[i];
    const std::size_t bytes = static_cast<std::size_t>(last + 1) * dtype_size(v.dtype);
    const auto* device = static_cast<const unsigned char*>(v.data);
    Copy* copy = nullptr;
    for (Copy& c : copies_) {
      if (c.device == device && c.bytes.size() == bytes) copy = &c;
    }
    if (copy == nullptr) {
      copy = &copies_.emplace_back(Copy{device, std::vector<unsigned char>(bytes), false});
      check(cudaMemcpyAsync(copy->bytes.data(), device, bytes, cudaMemcpyDeviceToHost, stream_),
            "cudaMemcpyAsync");
      check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    }
    copy->output = copy->output || output;
    v.data = copy->bytes.data();
    v.device = Device::cpu();
    return v;
  }

  void write_back() {
    for (const Copy& c : copies_) {
      if (!c.output) continue;
      check(cudaMemcpyAsync(const_cast<unsigned char*>(c.device), c.bytes.data(), c.bytes.size(),
                            cudaMemcpyHostToDevice, stream_),
            "cudaMemcpyAsync");
    }
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

 private:
  struct Copy {
    const unsigned char* device;
    std::vector<unsigned char> bytes;
    bool output;
  };
  DeviceGuard guard_;
  cudaStream_t stream_;
  std::deque<Copy> copies_;  // a deque: copies never move once made
};

// The reference backend's kernel of (op, direction) on host copies of the call's tensors
// (rebase.hpp maps each problem's views): every op the reference runs, with no code of
// its own here.
template <OpType op, Direction direction>
void on_host_copies(const detail::Problem<op, direction>& p, registry::Execution& exec) {
  static const registry::Kernels reference_kernels = reference::kernels();
  exec.isa = "scalar (host copies)";
  exec.threads = 1;
  HostMirror mirror(exec);
  registry::Execution on_host;  // the reference's own notes (its row ranges) are not this call's
  reference_kernels.get<op, direction>()(rebased(p, mirror), on_host);
  mirror.write_back();
}

std::string host_fallback_unavailable() {
  if (!host_fallback()) {
    return "the host fallback is off (set_host_fallback(true) or KERNEL_ALIGN_HOST_FALLBACK=1 "
           "allows it)";
  }
  return no_device();
}

registry::Kernels host_kernels() {
  registry::Kernels k;
#define KERNEL_ALIGN_ON_HOST_COPIES(Enumerator, name)          \
  k.set<OpType::Enumerator, Direction::Forward>(               \
      on_host_copies<OpType::Enumerator, Direction::Forward>); \
  k.set<OpType::Enumerator, Direction::Backward>(              \
      on_host_copies<OpType::Enumerator, Direction::Backward>);
  KERNEL_ALIGN_OPS(KERNEL_ALIGN_ON_HOST_COPIES)
#undef KERNEL_ALIGN_ON_HOST_COPIES
  return k;
}

registry::Kernels device_kernels() {
  registry::Kernels k;
#define KERNEL_ALIGN_ON_DEVICE(op, direction, step) \
  k.set<OpType::op, Direction::direction>(          \
      on_device<detail::Problem<OpType::op, Direction::direction>, plan::step>);
  KERNEL_ALIGN_CUDA_PLANS(KERNEL_ALIGN_ON_DEVICE)
#undef KERNEL_ALIGN_ON_DEVICE
  return k;
}

}  // namespace

std::vector<registry::Backend> cuda_backends() {
  registry::Backend device;
  device.name = "cuda";
  device.platform = Platform::Cuda;
  device.priority = 0;
  device.unavailable_reason = device_unavailable;
  device.isa_paths = [] { return std::string("sm_80, sm_90 (fast: D = 128; generic: any D)"); };
  device.fingerprint = fingerprints::kCuda;
  device.kernels = device_kernels();
  device.batch_digests = device_digests;

  registry::Backend host;
  host.name = "cuda-host";
  host.platform = Platform::Cuda;
  host.priority = 100;
  host.unavailable_reason = host_fallback_unavailable;
  host.isa_paths = [] { return std::string("scalar, on host copies"); };
  host.fingerprint = fingerprints::kReference;
  host.kernels = host_kernels();
  host.batch_digests = device_digests;
  return {device, host};
}

}  // namespace kernel_align::cuda
