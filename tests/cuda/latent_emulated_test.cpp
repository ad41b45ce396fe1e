// latent_normalize's and latent_pack's CUDA kernels (cuda/device/latent_kernels.cuh) and
// plans, the very source nvcc compiles, run by the grid emulator ("cuda-emulated") through
// the public API against the reference backend, byte for byte: every dtype, both transforms
// and directions, ranks 3 and 4, rows of odd lengths, fewer elements than a block and
// several blocks, constants of another dtype, in place; the patchify both ways on random bit
// patterns (NaN payloads kept); strided views (a last dim of stride 2, every other sample,
// padded rows); and the launches. Outputs start as 0xA5 bytes and are compared whole, so a
// stray or missing write shows.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "emulated_fixture.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/registry.hpp"
#include "kernel_align/runtime.hpp"
#include "support/tensors.hpp"

namespace kernel_align {
namespace {

using test::HostTensor;
using test::poisoned;

constexpr DType kDTypes[] = {DType::F32, DType::BF16, DType::F16};
constexpr LatentTransform kTransforms[] = {LatentTransform::Normalize,
                                           LatentTransform::Denormalize};

// Runs `call` on the reference backend and on the emulated CUDA kernels.
template <class Call>
void on_both(const Call& call) {
  set_backend("reference");
  call();
  EXPECT_EQ(last_call().backend, "reference");
  set_backend("cuda-emulated");
  call();
  EXPECT_EQ(last_call().backend, "cuda-emulated");
}

using LatentOnEmulatedCuda = test::OnEmulatedCuda;

// A tensor of random bit patterns (any NaN, Inf or subnormal, with its payload).
HostTensor random_bits(DType dtype, const std::vector<std::int64_t>& shape, std::uint64_t seed) {
  test::Rng rng(seed);
  HostTensor t(dtype, shape);
  const std::size_t size = dtype_size(dtype);
  for (std::int64_t e = 0; e < t.elements(); ++e) {
    const std::uint64_t bits = rng.next();
    std::memcpy(static_cast<std::byte*>(t.data()) + static_cast<std::size_t>(e) * size, &bits,
                size);
  }
  return t;
}

// A view whose data is `elements` elements further on.
ConstTensorView moved(ConstTensorView v, std::int64_t elements) {
  v.data = static_cast<const std::byte*>(v.data) +
           elements * static_cast<std::int64_t>(dtype_size(v.dtype));
  return v;
}
TensorView moved(TensorView v, std::int64_t elements) {
  v.data =
      static_cast<std::byte*>(v.data) + elements * static_cast<std::int64_t>(dtype_size(v.dtype));
  return v;
}

std::vector<std::int64_t> tokens_shape(const std::vector<std::int64_t>& latents) {
  return {latents[0], (latents[2] / 2) * (latents[3] / 2), 4 * latents[1]};
}

// Rank 3 and 4: a row of one element; rows of odd lengths; fewer elements than a block
// of 256 threads and several blocks (the last one partial).
const std::vector<std::vector<std::int64_t>> kNormalizeShapes = {
    {1, 1, 1}, {2, 3, 37}, {2, 16, 101}, {2, 4, 5, 19}, {1, 16, 6, 15}};

TEST_F(LatentOnEmulatedCuda, NormalizeEqualsTheReference) {
  for (const auto& shape : kNormalizeShapes) {
    for (const DType dtype : kDTypes) {
      for (const DType constants_dtype : {DType::F32, dtype}) {
        for (const LatentTransform t : kTransforms) {
          SCOPED_TRACE(std::to_string(shape.size()) + "-D " + std::to_string(shape.back()) + " " +
                       dtype_name(dtype) + ", constants " + dtype_name(constants_dtype) + " " +
                       latent_transform_name(t));
          test::Rng rng(31);
          const HostTensor z = test::random_tensor(dtype, shape, rng, 2.0, 4);
          const HostTensor dy = test::random_tensor(dtype, shape, rng);
          HostTensor mean(constants_dtype, {shape[1]}), std_dev(constants_dtype, {shape[1]});
          for (std::int64_t c = 0; c < shape[1]; ++c) {
            mean.set(c, rng.uniform(-1.0, 1.0));
            std_dev.set(c, rng.uniform(1.5, 3.5));
          }
          const DType other = dtype == DType::F32 ? DType::BF16 : DType::F32;
          std::vector<HostTensor> results;
          on_both([&] {
            HostTensor y = poisoned(dtype, shape), dz = poisoned(dtype, shape);
            HostTensor y_other = poisoned(other, shape);
            latent_normalize_forward(z.cview(), mean.cview(), std_dev.cview(), y.view(), {t});
            latent_normalize_backward(dy.cview(), std_dev.cview(), dz.view(), {t});
            latent_normalize_forward(z.cview(), mean.cview(), std_dev.cview(), y_other.view(), {t});
            // In place: y over z, dz over dy.
            HostTensor y_in_place = z, dz_in_place = dy;
            latent_normalize_forward(y_in_place.cview(), mean.cview(), std_dev.cview(),
                                     y_in_place.view(), {t});
            latent_normalize_backward(dz_in_place.cview(), std_dev.cview(), dz_in_place.view(),
                                      {t});
            results.insert(results.end(), {y, dz, y_other, y_in_place, dz_in_place});
          });
          ASSERT_EQ(results.size(), 10u);
          for (std::size_t i = 0; i < 5; ++i) EXPECT_TRUE(results[i] == results[i + 5]) << i;
          EXPECT_TRUE(results[0] == results[3] && results[1] == results[4]);
        }
      }
    }
  }
}

// One token; W/2 odd; Qwen-Image's 16 channels over several blocks of threads.
const std::vector<std::vector<std::int64_t>> kPackShapes = {
    {1, 1, 2, 2}, {2, 3, 4, 6}, {3, 5, 10, 14}, {2, 16, 12, 10}};

TEST_F(LatentOnEmulatedCuda, PackEqualsTheReference) {
  for (const auto& shape : kPackShapes) {
    for (const DType dtype : kDTypes) {
      SCOPED_TRACE(std::to_string(shape[1]) + "x" + std::to_string(shape[2]) + "x" +
                   std::to_string(shape[3]) + " " + dtype_name(dtype));
      const HostTensor x = random_bits(dtype, shape, 32);
      const HostTensor tokens = random_bits(dtype, tokens_shape(shape), 33);
      std::vector<HostTensor> results;
      on_both([&] {
        HostTensor y = poisoned(dtype, tokens_shape(shape)), dx = poisoned(dtype, shape);
        latent_pack_forward(x.cview(), y.view());
        latent_pack_backward(tokens.cview(), dx.view());
        HostTensor back = poisoned(dtype, shape);
        latent_pack_backward(y.cview(), back.view());
        results.insert(results.end(), {y, dx, back});
      });
      ASSERT_EQ(results.size(), 6u);
      for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE(results[i] == results[i + 3]) << i;
      EXPECT_TRUE(results[5] == x);  // the backward undoes the forward, byte for byte
    }
  }
}

// Every other element of wider rows, every other sample of a larger batch, padded rows (views
// 2 or 4 bytes past a buffer's start), strided constants; the tokens of the patchify strided
// too.
TEST_F(LatentOnEmulatedCuda, StridedViewsEqualTheReference) {
  constexpr std::int64_t kB = 2, kC = 3, kH = 6, kW = 10;
  constexpr std::int64_t kS = (kH / 2) * (kW / 2);
  for (const DType dtype : kDTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const HostTensor wide = random_bits(dtype, {2 * kB, kC, kH, 2 * kW}, 34);
    HostTensor wide_constants(dtype, {2 * kC + 1});
    for (std::int64_t c = 0; c < 2 * kC + 1; ++c) wide_constants.set(c, 1.5 + 0.25 * double(c));
    // Latents: every other element of every other sample's rows, one element past the start.
    const auto latents = [&](auto view) {
      return test::strided(moved(view, 1), {kB, kC, kH, kW},
                           {2 * kC * kH * 2 * kW, kH * 2 * kW, 2 * kW, 2});
    };
    const auto constants = [&](std::int64_t first) {
      return test::strided(moved(wide_constants.cview(), first), {kC}, {2});
    };
    // Tokens: padded rows of features (4C + 3), every other feature.
    const HostTensor wide_tokens = random_bits(dtype, {kB, kS, 2 * (4 * kC + 3)}, 35);
    const auto tokens = [&](auto view) {
      return test::strided(view, {kB, kS, 4 * kC}, {kS * 2 * (4 * kC + 3), 2 * (4 * kC + 3), 2});
    };
    // The normalization's latents: finite values of a range.
    HostTensor finite = wide;
    for (std::int64_t e = 0; e < finite.elements(); ++e) {
      finite.set(e, static_cast<double>(e % 97) * 0.125 - 6.0);
    }
    std::vector<HostTensor> results;
    on_both([&] {
      HostTensor y = poisoned(dtype, wide.shape()), dz = poisoned(dtype, wide.shape());
      const ConstTensorView mean = constants(0), std_dev = constants(1);
      latent_normalize_forward(latents(finite.cview()), mean, std_dev, latents(y.view()),
                               {LatentTransform::Denormalize});
      latent_normalize_backward(latents(finite.cview()), std_dev, latents(dz.view()),
                                {LatentTransform::Normalize});
      HostTensor packed = poisoned(dtype, wide_tokens.shape());
      HostTensor unpacked = poisoned(dtype, wide.shape());
      latent_pack_forward(latents(wide.cview()), tokens(packed.view()));
      latent_pack_backward(tokens(wide_tokens.cview()), latents(unpacked.view()));
      results.insert(results.end(), {y, dz, packed, unpacked});
    });
    ASSERT_EQ(results.size(), 8u);
    for (std::size_t i = 0; i < 4; ++i) EXPECT_TRUE(results[i] == results[i + 4]) << i;
  }
}

// The launches the plans make, as the trace records them: a thread an element, 256 a block.
TEST_F(LatentOnEmulatedCuda, LaunchesOfAThreadAnElement) {
  const std::string path = testing::TempDir() + "latent_emulated_trace.jsonl";
  std::remove(path.c_str());
  const std::vector<std::int64_t> shape = {2, 16, 12, 10};  // 3840 elements: 15 blocks
  const HostTensor x = random_bits(DType::BF16, shape, 36);
  HostTensor mean(DType::F32, {16}), std_dev(DType::F32, {16});
  for (std::int64_t c = 0; c < 16; ++c) std_dev.set(c, 2.0);
  HostTensor y(DType::BF16, shape), tokens(DType::BF16, tokens_shape(shape));
  HostTensor back(DType::BF16, shape);
  set_backend("cuda-emulated");
  set_trace_path(path);
  latent_normalize_forward(x.cview(), mean.cview(), std_dev.cview(), y.view(), {});
  latent_pack_forward(x.cview(), tokens.view());
  latent_pack_backward(tokens.cview(), back.view());
  set_trace_path("");
  std::ifstream in(path);
  for (const char* launch : {R"({"kernel":"latent_normalize","grid":[15,1,1],"block":[256,1,1])",
                             R"({"kernel":"latent_pack","grid":[15,1,1],"block":[256,1,1])",
                             R"({"kernel":"latent_unpack","grid":[15,1,1],"block":[256,1,1])"}) {
    std::string line;
    ASSERT_TRUE(std::getline(in, line));
    EXPECT_NE(line.find(launch), std::string::npos) << launch << " in " << line;
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kernel_align
