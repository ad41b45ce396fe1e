#include "views.hpp"

#include <c10/util/Exception.h>
#include <sys/sysinfo.h>
#if defined(KERNEL_ALIGN_TORCH_CUDA)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <array>
#include <cstdint>
#include <limits>
#include <string>

#include "kernel_align/registry.hpp"

namespace kernel_align::torch_ext {
namespace {

std::string prefix(const char* op, const char* argument) {
  return std::string("kernel_align.") + op + ": argument '" + argument + "': ";
}

// "simd, reference": the registered backends, for messages.
std::string backend_list() {
  std::string out;
  for (const std::string& name : backend_names()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

DType library_dtype(const char* op, const char* argument, at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return DType::F32;
    case at::kBFloat16:
      return DType::BF16;
    case at::kHalf:
      return DType::F16;
    default:
      throw c10::TypeError({__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)},
                           prefix(op, argument) +
                               "expected dtype torch.float32, torch.bfloat16 or torch.float16, "
                               "found " +
                               torch_dtype_name(type));
  }
}

namespace {

// The library's dtype of a tensor of numbers (library_dtype) or of a mask (torch.bool or
// torch.uint8, nonzero for true).
DType number_dtype(const char* op, const char* argument, at::ScalarType type) {
  return library_dtype(op, argument, type);
}
DType mask_dtype(const char* op, const char* argument, at::ScalarType type) {
  if (type == at::kBool || type == at::kByte) return DType::Bool;
  throw c10::TypeError({__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)},
                       prefix(op, argument) + "expected dtype torch.bool (or torch.uint8), found " +
                           torch_dtype_name(type));
}

template <class View, class Pointer>
View view_of(const char* op, const char* argument, const at::Tensor& tensor, Pointer data,
             DType (*dtype_of)(const char*, const char*, at::ScalarType) = number_dtype) {
  TORCH_CHECK_VALUE(tensor.defined(), prefix(op, argument), "expected a tensor, found None");
  const bool cuda = tensor.device().is_cuda() && kCudaBuild;
  if (!tensor.device().is_cpu() && !cuda) {
    raise_value_error(op, "argument '" + std::string(argument) + "': expected a tensor on " +
                              supported_devices() + ", found one on " + tensor.device().str() +
                              " (kernel-align's backends: " + backend_list() + ")");
  }
  TORCH_CHECK_TYPE(tensor.layout() == at::kStrided, prefix(op, argument),
                   "expected a strided (dense) tensor, found layout ", tensor.layout());
  // A negated view would need its sign applied on every read; torch resolves it on copy.
  TORCH_CHECK_VALUE(!tensor.is_neg(), prefix(op, argument),
                    "expected a tensor without the negative bit, found a negated view "
                    "(call .resolve_neg() first)");
  View view;
  view.dtype = dtype_of(op, argument, tensor.scalar_type());
  if (tensor.dim() > kMaxRank) {
    raise_value_error(op, "argument '" + std::string(argument) + "': expected rank 1 to " +
                              std::to_string(kMaxRank) + ", found rank " +
                              std::to_string(tensor.dim()));
  }
  view.data = data;
  view.device = cuda ? Device::cuda(tensor.device().index()) : Device::cpu();
  view.rank = static_cast<int>(tensor.dim());
  for (int i = 0; i < view.rank; ++i) {
    view.shape[i] = tensor.size(i);
    view.strides[i] = tensor.stride(i);
  }
  return view;
}

}  // namespace

ConstTensorView input_view(const char* op, const char* argument, const at::Tensor& tensor) {
  return view_of<ConstTensorView>(op, argument, tensor,
                                  tensor.defined() ? tensor.const_data_ptr() : nullptr);
}

std::optional<ConstTensorView> input_view(const char* op, const char* argument,
                                          const std::optional<at::Tensor>& tensor) {
  if (!tensor) return std::nullopt;
  return input_view(op, argument, *tensor);
}

std::optional<ConstTensorView> mask_view(const char* op, const char* argument,
                                         const std::optional<at::Tensor>& tensor) {
  if (!tensor) return std::nullopt;
  return view_of<ConstTensorView>(
      op, argument, *tensor, tensor->defined() ? tensor->const_data_ptr() : nullptr, mask_dtype);
}

TensorView output_view(const char* op, const char* argument, const at::Tensor& tensor) {
  return view_of<TensorView>(op, argument, tensor,
                             tensor.defined() ? tensor.mutable_data_ptr() : nullptr);
}

std::string torch_dtype_name(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return "torch.float32";
    case at::kDouble:
      return "torch.float64";
    case at::kHalf:
      return "torch.float16";
    case at::kBFloat16:
      return "torch.bfloat16";
    case at::kByte:
      return "torch.uint8";
    case at::kChar:
      return "torch.int8";
    case at::kShort:
      return "torch.int16";
    case at::kInt:
      return "torch.int32";
    case at::kLong:
      return "torch.int64";
    case at::kBool:
      return "torch.bool";
    case at::kComplexFloat:
      return "torch.complex64";
    case at::kComplexDouble:
      return "torch.complex128";
    default:
      return std::string("torch.") + c10::toString(type);
  }
}

ExecutionContext context_of(const at::Tensor& tensor) {
#if defined(KERNEL_ALIGN_TORCH_CUDA)
  if (tensor.is_cuda()) {
    return {c10::cuda::getCurrentCUDAStream(tensor.device().index()).stream()};
  }
#endif
  (void)tensor;
  return {};
}

Error renamed(const Error& e, Renames renames) {
  std::string argument = e.argument();
  std::string expected = e.expected();
  for (const Rename& r : renames) {
    if (r.library.ends_with('*')) {
      const std::string_view prefix = r.library.substr(0, r.library.size() - 1);
      if (argument.starts_with(prefix)) {
        // "spec.axes_dim[1]" -> "axes_dim[1]" under {"spec.axes_dim*", "axes_dim*"}.
        argument = r.python.ends_with('*') ? std::string(r.python.substr(0, r.python.size() - 1))
                                                 .append(argument, prefix.size())
                                           : std::string(r.python);
      }
      continue;
    }
    if (argument == r.library) argument = std::string(r.python);
    // Strings built by appending: g++ 12's -Wrestrict misfires on the inserts of
    // std::string::replace and of "'" + std::string.
    const std::string quoted = std::string("'").append(r.library).append("'");
    std::string text;
    std::size_t from = 0;
    for (std::size_t at = expected.find(quoted); at != std::string::npos;
         at = expected.find(quoted, from)) {
      text.append(expected, from, at - from).append("'").append(r.python).append("'");
      from = at + quoted.size();
    }
    expected = text.append(expected, from);
  }
  return Error(argument, expected, e.found());
}

std::uint64_t memory_bytes(const at::Device& device) {
#if defined(KERNEL_ALIGN_TORCH_CUDA)
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard guard(device.index());
    std::size_t free = 0;
    std::size_t total = 0;
    // Unknown: no bound here; the allocation or the backend reports what fails.
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      (void)cudaGetLastError();  // not left for the next CUDA call to report
      return std::numeric_limits<std::uint64_t>::max();
    }
    return total;
  }
#endif
  (void)device;
  struct sysinfo info {};
  if (sysinfo(&info) != 0) return std::numeric_limits<std::uint64_t>::max();
  return (static_cast<std::uint64_t>(info.totalram) + info.totalswap) * info.mem_unit;
}

void check_fits_memory(const char* argument, const at::Device& device, std::uint64_t bytes,
                       const std::string& what) {
  const std::uint64_t limit = memory_bytes(device);
  if (bytes <= limit) return;
  const bool cpu = device.is_cpu();
  throw Error(argument,
              "a tensor whose " + what + " fit in the memory of " + device.str() + " (" +
                  std::to_string(limit) + (cpu ? " bytes of RAM and swap)" : " bytes)"),
              "one whose " + what + " take " + std::to_string(bytes) + " bytes");
}

void raise_value_error(const char* op, const std::string& message) {
  throw c10::ValueError({__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)},
                        std::string("kernel_align.") + op + ": " + message);
}

}  // namespace kernel_align::torch_ext
