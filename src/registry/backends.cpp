// The built-in backends: one registration each (the CUDA ones where the build has them).
// A new backend (Ascend, ...) is one more entry here with its platform, priority,
// capabilities and entry points.
#include "cpu/cpu_backend.hpp"
#if KERNEL_ALIGN_HAS_CUDA
#include "cuda/cuda_backend.hpp"
#endif
#include "kernel_align/fingerprints.hpp"
#include "kernel_align/runtime.hpp"
#include "reference/adaln.hpp"
#include "reference/attention.hpp"
#include "reference/gemm.hpp"
#include "reference/reference.hpp"
#include "registry/registry.hpp"

namespace kernel_align::registry {
namespace {

std::string always_available() {
  return "";
}

std::string simd_paths() {
  std::string paths;
  for (Isa i = best_isa();; i = static_cast<Isa>(static_cast<int>(i) - 1)) {
    paths += paths.empty() ? std::string(isa_name(i)) + " (best)" : std::string(", ") + isa_name(i);
    if (i == Isa::Portable) break;
  }
  return paths;
}

std::string scalar_path() {
  return "scalar";
}

// The reference runs every pass on the calling thread, as one range of rows (recorded
// when the call is traced).
void record_scalar(Execution& exec, std::initializer_list<std::int64_t> pass_rows) {
  exec.isa = "scalar";
  exec.threads = 1;
  if (exec.traced) {
    for (const std::int64_t rows : pass_rows) exec.partition.push_back({{0, rows}});
  }
}

// Each backend's kernels, keyed by (op, direction).
Kernels reference_kernels() {
  Kernels k;
  k.set<OpType::QkRmsNorm, Direction::Forward>(
      [](const detail::RmsNormForwardProblem& p, Execution& exec) {
        record_scalar(exec, {detail::row_count(p.x)});
        reference::qk_rmsnorm_forward(p);
      });
  k.set<OpType::QkRmsNorm, Direction::Backward>(
      [](const detail::RmsNormBackwardProblem& p, Execution& exec) {
        record_scalar(exec, {detail::row_count(p.x)});
        reference::qk_rmsnorm_backward(p);
      });
  const auto rope = [](const detail::RopeProblem& p, Execution& exec) {
    record_scalar(exec, {detail::row_count(p.in)});
    reference::multi_axis_rope(p);
  };
  k.set<OpType::MultiAxisRope, Direction::Forward>(rope);
  k.set<OpType::MultiAxisRope, Direction::Backward>(rope);
  k.set<OpType::QkNormRope, Direction::Forward>(
      [](const detail::QkNormRopeForwardProblem& p, Execution& exec) {
        for (const auto& stream : p.streams) {
          record_scalar(exec, {detail::row_count(stream.x)});
          reference::norm_rope_forward(stream);
        }
      });
  k.set<OpType::QkNormRope, Direction::Backward>(
      [](const detail::QkNormRopeBackwardProblem& p, Execution& exec) {
        for (const auto& stream : p.streams) {
          record_scalar(exec, {detail::row_count(stream.x)});
          reference::norm_rope_backward(stream);
        }
        detail::zero_empty_stream_grads_on_host(p);
      });
  k.set<OpType::Linear, Direction::Forward>([](const detail::GemmProblem& p, Execution& exec) {
    record_scalar(exec, {p.m});
    reference::gemm(p);
  });
  k.set<OpType::Linear, Direction::Backward>(
      [](const detail::LinearBackwardProblem& p, Execution& exec) {
        record_scalar(exec, {});
        reference::linear_backward(p, [&](const detail::GemmProblem& g) {
          if (exec.traced) exec.partition.push_back({{0, g.m}});
          reference::gemm(g);
        });
      });
  k.set<OpType::Attention, Direction::Forward>(
      [](const detail::AttentionProblem& p, Execution& exec) {
        record_scalar(exec, {});
        reference::attention_forward(p);
      });
  k.set<OpType::Attention, Direction::Backward>(
      [](const detail::AttentionBackwardProblem& p, Execution& exec) {
        record_scalar(exec, {});
        reference::attention_backward(p);
      });
  k.set<OpType::AdaLnModulation, Direction::Forward>(
      [](const detail::AdaLnProblem& p, Execution& exec) {
        record_scalar(exec, {p.batch * p.seq});
        reference::adaln_forward(p);
      });
  k.set<OpType::AdaLnModulation, Direction::Backward>(
      [](const detail::AdaLnBackwardProblem& p, Execution& exec) {
        record_scalar(exec, {p.batch * p.seq});
        reference::adaln_backward(p);
      });
  return k;
}

}  // namespace

std::vector<Backend> builtin_backends() {
  Backend simd;
  simd.name = "simd";
  simd.platform = Platform::Cpu;
  simd.priority = 0;
  simd.unavailable_reason = always_available;  // the portable path runs on any CPU
  simd.isa_paths = simd_paths;
  simd.fingerprint = fingerprints::kSimd;
  simd.kernels = cpu::simd_kernels();

  Backend reference;
  reference.name = "reference";
  reference.platform = Platform::Cpu;
  reference.priority = 100;
  reference.unavailable_reason = always_available;
  reference.isa_paths = scalar_path;
  reference.fingerprint = fingerprints::kReference;
  reference.kernels = reference_kernels();

  std::vector<Backend> backends{simd, reference};
#if KERNEL_ALIGN_HAS_CUDA
  for (Backend& b : cuda::cuda_backends()) backends.push_back(std::move(b));
#endif
  return backends;
}

}  // namespace kernel_align::registry
