// Where a tensor's memory lives, and where an op's work is queued.
#pragma once

#include <string>

namespace kernel_align {

// A kind of device. Only cpu and cuda have backends; the others (AMD ROCm, Moore Threads
// MUSA, Ascend NPU) name the registry's rows for backends to come.
enum class Platform : unsigned char { Cpu, Cuda, Rocm, Musa, Npu };

// "cpu", "cuda", "rocm", "musa", "npu": the name the registry table and messages use.
const char* platform_name(Platform p);

// One device: its platform and its index there (cuda:1). The CPU is always cpu:0.
struct Device {
  Platform platform = Platform::Cpu;
  int ordinal = 0;  // the device's index on its platform (CUDA's device ordinal); 0 on the CPU

  // cpu:0, the default-constructed Device.
  static constexpr Device cpu() { return {}; }
  // cuda:<ordinal>. Not checked here: a call on a device that does not exist fails in
  // the backend.
  static constexpr Device cuda(int ordinal) { return {Platform::Cuda, ordinal}; }
  // Same platform and ordinal.
  bool operator==(const Device&) const = default;
};

// "cpu", "cuda:1": the platform's name, then ":<ordinal>" for every device but the CPU.
std::string device_name(Device d);

// Where a call's work is queued. CPU calls run on the calling thread (and the CPU
// backend's pool) and have returned when their outputs are written. A CUDA call queues
// its kernels on `cuda_stream` (a cudaStream_t, opaque here so that this header needs no
// CUDA headers; nullptr is the legacy default stream) and returns once they are queued:
// its outputs are ready in stream order, as for any CUDA launch. The torch binding passes
// the caller's current stream.
struct ExecutionContext {
  void* cuda_stream = nullptr;  // cudaStream_t of a CUDA call; ignored by CPU calls
};

}  // namespace kernel_align
