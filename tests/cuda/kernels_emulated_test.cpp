// The CUDA backend's device code, proved without a GPU: its plans (cuda/plan.hpp) and
// kernel bodies (cuda/device/), the very source nvcc compiles, run by the grid emulator
// ("cuda-emulated") through the matrix of cuda_matrix.hpp; and the trace of such calls:
// launch records, the path taken (fast: D = 128, one dtype, vector-aligned rows; generic:
// everything else), digests computed by the device digest kernel.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "cuda/emulator/emulated_backend.hpp"
#include "kernel_align/registry.hpp"
#include "registry/registry.hpp"

namespace kernel_align {
namespace {

const char* const kBackendUnderTest = "cuda-emulated";
std::string unavailable() {
  return "";
}

// Registers the emulated backend for the whole test binary.
class EmulatedBackend : public ::testing::Environment {
 public:
  void SetUp() override { registration_.emplace(cuda::emulation::emulated_cuda_backend()); }
  void TearDown() override { registration_.reset(); }

 private:
  std::optional<registry::ScopedRegistration> registration_;
};
const auto* const kEnvironment =
    ::testing::AddGlobalTestEnvironment(new EmulatedBackend);  // NOLINT: gtest owns it

}  // namespace
}  // namespace kernel_align

#include "cuda/cuda_matrix.hpp"

namespace kernel_align {
namespace {

// The trace of a call on the emulated backend names its launches; D = 128 in one dtype
// with aligned rows takes the fast path, an unaligned view the generic one; the digests
// computed by the device digest kernel are the host's.
TEST(EmulatedCudaTrace, LaunchRecordsPathsAndDeviceDigests) {
  const test::RuntimeGuard guard;
  const std::string path = testing::TempDir() + "cuda_emulated_trace.jsonl";
  std::remove(path.c_str());
  Rng rng(3);
  CaseSpec c;
  c.in = DType::BF16;
  c.out = DType::BF16;
  c.weight = DType::BF16;
  c.seq = 9;  // 2 x 9 x 3 = 54 rows: two blocks of 32 (128 threads, below 16384 rows)
  c.d = 128;
  const test::NormForwardCase aligned = test::make_norm_forward(c, rng);
  c.inputs.unaligned = true;
  const test::NormForwardCase unaligned = test::make_norm_forward(c, rng);
  set_backend("cuda-emulated");
  set_trace_path(path);
  aligned.run();
  unaligned.run();
  set_backend("reference");
  aligned.run();
  set_trace_path("");
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(
      lines[0].find(
          R"("launches":[{"kernel":"rmsnorm_forward","grid":[2,1,1],"block":[128,1,1],"rows_per_block":32,"dynamic_shared_bytes":0,"path":"fast"}])"),
      std::string::npos)
      << lines[0];
  EXPECT_NE(lines[1].find(R"("path":"generic")"), std::string::npos) << lines[1];
  EXPECT_NE(lines[2].find(R"("launches":[])"), std::string::npos) << lines[2];
  const auto digests = [](const std::string& line) {
    return line.substr(line.find("\"digests\""));
  };
  EXPECT_EQ(digests(lines[0]), digests(lines[2])) << "device digests differ from the host's";
}

}  // namespace
}  // namespace kernel_align
