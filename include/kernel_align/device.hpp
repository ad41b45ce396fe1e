// Where a tensor's memory lives, and where an op's work is queued.
#pragma once

#include <string>

namespace kernel_align {

// A kind of device. Only cpu and cuda have backends; the others name the registry's
// rows for backends to come.
enum class Platform : unsigned char { Cpu, Cuda, Rocm, Musa, Npu };

const char* platform_name(Platform p);

// One device: its platform and its index there (cuda:1). The CPU is always cpu:0.
struct Device {
  Platform platform = Platform::Cpu;
  int ordinal = 0;

  static constexpr Device cpu() { return {}; }
  static constexpr Device cuda(int ordinal) { return {Platform::Cuda, ordinal}; }
  bool operator==(const Device&) const = default;
};

// "cpu", "cuda:1".
std::string device_name(Device d);

// Where a call's work is queued. CPU calls run on the calling thread (and the CPU
// backend's pool) and have returned when their outputs are written. A CUDA call queues
// its kernels on `cuda_stream` (a cudaStream_t, opaque here so that this header needs no
// CUDA headers; nullptr is the legacy default stream) and returns once they are queued:
// its outputs are ready in stream order, as for any CUDA launch. The torch binding passes
// the caller's current stream.
struct ExecutionContext {
  void* cuda_stream = nullptr;
};

}  // namespace kernel_align
