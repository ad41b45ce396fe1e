// What the tests of an op's CUDA kernels through the public API share: a fixture that
// registers the emulated CUDA backend ("cuda-emulated") for each test and restores the
// runtime's settings after it, and poisoned outputs.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <optional>
#include <vector>

#include "cuda/emulator/emulated_backend.hpp"
#include "registry/registry.hpp"
#include "support/runtime_guard.hpp"
#include "support/tensors.hpp"

namespace kernel_align::test {

class OnEmulatedCuda : public ::testing::Test {
 protected:
  void SetUp() override { registration_.emplace(cuda::emulation::emulated_cuda_backend()); }
  void TearDown() override { registration_.reset(); }

 private:
  RuntimeGuard guard_;
  std::optional<registry::ScopedRegistration> registration_;
};

// A fresh output with 0xA5 in every byte: a stray or missing write shows when it is
// compared whole.
inline HostTensor poisoned(DType dtype, const std::vector<std::int64_t>& shape) {
  HostTensor t(dtype, shape);
  t.fill_bytes(std::byte{0xA5});
  return t;
}

}  // namespace kernel_align::test
