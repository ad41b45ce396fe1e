#include "cuda/emulator/emulated_backend.hpp"

#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "cuda/device_plans.hpp"
#include "cuda/emulator/grid_emulator.hpp"
#include "cuda/plan.hpp"

namespace kernel_align::cuda::emulation {
namespace {

// plan.hpp's Executor over the emulator. Scratch memory starts as NaN bytes, as the
// emulator's shared memory does: a kernel that reads what nothing wrote shows.
class EmulatedExecutor {
 public:
  explicit EmulatedExecutor(registry::Execution& exec) : exec_(exec) {
    exec_.isa = "emulated";
    exec_.threads = 1;
  }

  template <template <class> class Kernel>
  void launch(const registry::LaunchRecord& l, const typename Kernel<EmulatedGrid>::Params& p) {
    exec_.launches.push_back(l);
    emulation::launch<Kernel<EmulatedGrid>>({l.grid[0], l.grid[1], l.grid[2]},
                                            {l.block[0], l.block[1], l.block[2]}, p,
                                            l.dynamic_shared_bytes);
  }

  float* scratch_floats(std::size_t count) {
    auto& buffer = floats_.emplace_back(count, std::numeric_limits<float>::quiet_NaN());
    return buffer.data();
  }
  std::uint64_t* scratch_digests(std::size_t count) {
    return digests_.emplace_back(count, ~std::uint64_t{0}).data();
  }
  std::int64_t* scratch_indices(std::size_t count) {
    return indices_.emplace_back(count, -1).data();
  }
  void copy_to_host(void* host, const void* device, std::size_t bytes) {
    std::memcpy(host, device, bytes);
  }
  const float* one() {
    float* one = scratch_floats(1);
    *one = 1.0f;
    return one;
  }
  void zero(const TensorView& v) {
    for (std::int64_t i = 0; i < v.shape[0]; ++i) {
      contract::store_output(v.dtype, v.data, i * v.strides[0], 0.0f);
    }
  }

 private:
  registry::Execution& exec_;
  std::vector<std::vector<float>> floats_;
  std::vector<std::vector<std::uint64_t>> digests_;
  std::vector<std::vector<std::int64_t>> indices_;
};

template <class Problem, void (*Plan)(const Problem&, EmulatedExecutor&)>
void run(const Problem& p, registry::Execution& exec) {
  EmulatedExecutor executor(exec);
  Plan(p, executor);
}

}  // namespace

registry::Backend emulated_cuda_backend() {
  registry::Backend b;
  b.name = "cuda-emulated";
  b.platform = Platform::Cpu;
  b.priority = 1000;
  b.unavailable_reason = [] { return std::string(); };
  b.isa_paths = [] { return std::string("the CUDA kernels on the grid emulator"); };
  b.fingerprint = "emulated";
#define KERNEL_ALIGN_EMULATED(op, direction, step) \
  b.kernels.set<OpType::op, Direction::direction>( \
      run<detail::Problem<OpType::op, Direction::direction>, plan::step>);
  KERNEL_ALIGN_CUDA_PLANS(KERNEL_ALIGN_EMULATED)
#undef KERNEL_ALIGN_EMULATED
  b.batch_digests = [](const ConstTensorView& v, const registry::Execution&) {
    registry::Execution digest_exec;
    EmulatedExecutor executor(digest_exec);
    return plan::batch_digests(v, executor);
  };
  return b;
}

}  // namespace kernel_align::cuda::emulation
