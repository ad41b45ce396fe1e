// latent_normalize and latent_pack through the public API (contract section 16): every
// backend path and thread count gives the reference backend's bytes for both ops and
// directions, every dtype, ranks 3 and 4, rows of odd lengths (vector tails), contiguous,
// strided (a last dim of stride 2, every other sample of a batch, padded rows, pointers off
// alignment) and in place; outputs start as 0xA5 bytes and are compared whole, gaps
// included. The normalization's values are the pipelines' expressions, written here in
// plain fp32; the patchify is the index map written here, and its backward undoes its
// forward byte for byte (NaN payloads included: a copy of bytes). A sample's bytes alone
// equal its bytes in a batch; bad arguments are Errors naming them, nothing written.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "kernel_align/error.hpp"
#include "kernel_align/ops.hpp"
#include "kernel_align/registry.hpp"
#include "kernel_align/runtime.hpp"
#include "support/buffers.hpp"
#include "support/errors.hpp"
#include "support/runtime_guard.hpp"
#include "support/tensors.hpp"

namespace kernel_align {
namespace {

using test::HostTensor;
using test::Outputs;
using test::PlacedBuffer;

constexpr DType kDTypes[] = {DType::F32, DType::BF16, DType::F16};
constexpr LatentTransform kTransforms[] = {LatentTransform::Normalize,
                                           LatentTransform::Denormalize};

// Where a view's elements live.
enum class Storage : unsigned char {
  Contiguous,
  EveryOther,   // every stride doubled: a last dim of stride 2
  SlicedBatch,  // every other sample of a batch twice as large, 2 or 4 bytes off alignment
  PaddedRows,   // 3 unused elements after every row (a crop), 2 or 4 bytes off alignment
};
constexpr Storage kStorages[] = {Storage::Contiguous, Storage::EveryOther, Storage::SlicedBatch,
                                 Storage::PaddedRows};

const char* storage_name(Storage s) {
  static constexpr const char* kNames[] = {"contiguous", "every other element",
                                           "every other sample", "padded rows"};
  return kNames[static_cast<int>(s)];
}

std::vector<std::int64_t> strides_of(Storage s, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> strides = test::padded_strides(shape, s == Storage::PaddedRows ? 3 : 0);
  if (s == Storage::EveryOther) {
    for (std::int64_t& stride : strides) stride *= 2;
  }
  if (s == Storage::SlicedBatch) strides[0] *= 2;
  return strides;
}

std::size_t misalign_of(Storage s, DType dtype) {
  return s == Storage::SlicedBatch || s == Storage::PaddedRows ? test::unaligned_offset(dtype) : 0;
}

PlacedBuffer placed(const HostTensor& t, Storage s) {
  return test::placed_copy(t.cview(), strides_of(s, t.shape()), misalign_of(s, t.dtype()));
}

// A fresh output (every byte 0xA5) of `shape` stored as `s` says.
PlacedBuffer output(DType dtype, const std::vector<std::int64_t>& shape, Storage s) {
  return {dtype, shape, strides_of(s, shape), misalign_of(s, dtype)};
}

// Calls run() on the reference backend, then on the simd backend at every path this
// machine has and 1 and 2 threads: each must return the reference's outputs. Returns them.
template <class Run>
Outputs expect_every_path_gives_the_reference(const Run& run) {
  const test::RuntimeGuard guard;
  set_backend("reference");
  Outputs want = run();
  EXPECT_EQ(last_call().backend, "reference");
  set_backend("simd");
  for (const Isa path : test::available_isas()) {
    set_isa(path);
    for (const int threads : {1, 2}) {
      set_num_threads(threads);
      EXPECT_TRUE(test::same_bytes(want, run())) << isa_name(path) << " " << threads << " threads";
      EXPECT_EQ(last_call().backend, "simd");
    }
  }
  return want;
}

// Calls f() on the reference backend and on the simd backend at every path and 1 and 2
// threads.
template <class F>
void on_every_path(const F& f) {
  const test::RuntimeGuard guard;
  set_backend("reference");
  f();
  set_backend("simd");
  for (const Isa path : test::available_isas()) {
    set_isa(path);
    for (const int threads : {1, 2}) {
      set_num_threads(threads);
      SCOPED_TRACE(std::string(isa_name(path)) + " " + std::to_string(threads) + " threads");
      f();
    }
  }
}

// ---------------------------------------------------------------------------
// latent_normalize.

// The op's forward (z = in) or backward (dy = in; mean unused).
void normalize(const ConstTensorView& in, const ConstTensorView& mean,
               const ConstTensorView& std_dev, const TensorView& out, LatentTransform t,
               bool backward) {
  if (backward) {
    latent_normalize_backward(in, std_dev, out, {t});
  } else {
    latent_normalize_forward(in, mean, std_dev, out, {t});
  }
}

// The pipelines' expressions, plain fp32 operations (the project compiles with
// -ffp-contract=off): (z - mean) / std, z / (1 / std) + mean, and their gradients.
float pipeline_value(LatentTransform t, bool backward, float v, float mean, float std_dev) {
  if (t == LatentTransform::Normalize) return backward ? v / std_dev : (v - mean) / std_dev;
  const float latents_std = 1.0f / std_dev;
  return backward ? v / latents_std : v / latents_std + mean;
}

// Every element of `in` ([B, C, L] or [B, C, H, W], any strides) through pipeline_value
// with its channel's constants, stored to `out_dtype` as an op stores its results.
HostTensor pipeline_values(const ConstTensorView& in, const ConstTensorView& mean,
                           const ConstTensorView& std_dev, LatentTransform t, bool backward,
                           DType out_dtype) {
  const std::vector<double> v = test::logical_values(in), m = test::logical_values(mean),
                            s = test::logical_values(std_dev);
  HostTensor out(out_dtype,
                 std::vector<std::int64_t>(in.shape.begin(), in.shape.begin() + in.rank));
  std::int64_t per_channel = 1;
  for (int d = 2; d < in.rank; ++d) per_channel *= in.shape[d];
  for (std::int64_t e = 0; e < out.elements(); ++e) {
    const auto c = static_cast<std::size_t>((e / per_channel) % in.shape[1]);
    out.set(e, pipeline_value(t, backward, static_cast<float>(v[static_cast<std::size_t>(e)]),
                              static_cast<float>(m[c]), static_cast<float>(s[c])));
  }
  return out;
}

// Latents with a dynamic range, and a few special values up front: signed zeros, infinities,
// a NaN, an fp32 subnormal, the largest fp32.
HostTensor latents(DType dtype, const std::vector<std::int64_t>& shape, std::uint64_t seed) {
  test::Rng rng(seed);
  HostTensor t = test::random_tensor(dtype, shape, rng, 2.0, 4);
  const double specials[] = {0.0,
                             -0.0,
                             std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity(),
                             std::numeric_limits<double>::quiet_NaN(),
                             0x1p-140,
                             std::numeric_limits<float>::max()};
  if (t.elements() > 3 * static_cast<std::int64_t>(std::size(specials))) {
    for (std::size_t i = 0; i < std::size(specials); ++i)
      t.set(static_cast<std::int64_t>(3 * i), specials[i]);
  }
  return t;
}

// Per-channel constants as Qwen-Image's VAE has them: means about 0, stds 1.5 to 3.5.
struct Constants {
  HostTensor mean, std_dev;
};

Constants constants(DType dtype, std::int64_t channels, std::uint64_t seed) {
  test::Rng rng(seed);
  Constants k{HostTensor(dtype, {channels}), HostTensor(dtype, {channels})};
  for (std::int64_t c = 0; c < channels; ++c) {
    k.mean.set(c, rng.uniform(-1.0, 1.0));
    k.std_dev.set(c, rng.uniform(1.5, 3.5));
  }
  return k;
}

// Rank 3 ([B, C, L]) and rank 4 ([B, C, H, W]); rows (the last dim) of 1 element, of one
// AVX2 vector (8), one lane either side of an AVX-512 vector (15, 17) and of 19, 33, 37 and
// 1031 (vectors and a tail); Qwen-Image's 16 channels; two shapes of more than 32768
// elements, which the pool splits over 2 threads.
const std::vector<std::vector<std::int64_t>> kNormalizeShapes = {
    {2, 3, 37},    {1, 16, 1},     {3, 2, 17},    {2, 3, 4, 8},
    {2, 4, 5, 19}, {1, 16, 6, 15}, {2, 16, 1031}, {2, 16, 32, 33}};

TEST(LatentNormalizeOp, EveryBackendPathAndThreadCountGivesTheReferencesBytes) {
  for (const auto& shape : kNormalizeShapes) {
    for (const DType dtype : kDTypes) {
      for (const Storage storage : kStorages) {
        const HostTensor z = latents(dtype, shape, 1);
        const PlacedBuffer in = placed(z, storage);
        // The constants of strided calls strided too (every other element) and unaligned.
        const Constants k = constants(dtype, shape[1], 2);
        const PlacedBuffer mean = placed(k.mean, storage), std_dev = placed(k.std_dev, storage);
        for (const LatentTransform t : kTransforms) {
          for (const bool backward : {false, true}) {
            SCOPED_TRACE(std::to_string(shape.size()) + "-D " + std::to_string(shape.back()) + " " +
                         dtype_name(dtype) + " " + storage_name(storage) + " " +
                         latent_transform_name(t) + (backward ? " backward" : " forward"));
            const HostTensor want =
                pipeline_values(in.cview(), mean.cview(), std_dev.cview(), t, backward, dtype);
            const char* name = backward ? "dz" : "y";
            const Outputs apart = expect_every_path_gives_the_reference([&] {
              PlacedBuffer out = output(dtype, shape, storage);
              normalize(in.cview(), mean.cview(), std_dev.cview(), out.view(), t, backward);
              EXPECT_EQ(test::logical_bits(out.cview()), test::logical_bits(want.cview()));
              return Outputs{test::named_bytes(name, out)};
            });
            // In place (y = z, dz = dy): the same bytes, gaps included.
            const Outputs in_place = expect_every_path_gives_the_reference([&] {
              PlacedBuffer out = placed(z, storage);
              normalize(out.cview(), mean.cview(), std_dev.cview(), out.view(), t, backward);
              return Outputs{test::named_bytes(name, out)};
            });
            EXPECT_TRUE(test::same_bytes(apart, in_place));
          }
        }
      }
    }
  }
}

// Outputs of another dtype than the input, and constants of another dtype than either.
TEST(LatentNormalizeOp, MixedDTypesGiveTheReferencesBytes) {
  const std::vector<std::int64_t> shape = {2, 16, 5, 23};
  for (const DType in_dtype : kDTypes) {
    for (const DType out_dtype : kDTypes) {
      for (const DType constants_dtype : kDTypes) {
        const HostTensor z = latents(in_dtype, shape, 3);
        const Constants k = constants(constants_dtype, shape[1], 4);
        for (const LatentTransform t : kTransforms) {
          for (const bool backward : {false, true}) {
            SCOPED_TRACE(std::string(dtype_name(in_dtype)) + " -> " + dtype_name(out_dtype) +
                         ", constants " + dtype_name(constants_dtype) + " " +
                         latent_transform_name(t) + (backward ? " backward" : " forward"));
            const HostTensor want = pipeline_values(z.cview(), k.mean.cview(), k.std_dev.cview(), t,
                                                    backward, out_dtype);
            expect_every_path_gives_the_reference([&] {
              HostTensor out(out_dtype, shape);
              out.fill_bytes(std::byte{0xA5});
              normalize(z.cview(), k.mean.cview(), k.std_dev.cview(), out.view(), t, backward);
              EXPECT_TRUE(out == want);
              return Outputs{test::named_bytes("y", out)};
            });
          }
        }
      }
    }
  }
}

// The pipelines' expressions in plain fp32 with constants at the edges of fp32: a zero,
// negative and subnormal std (whose 1 / std overflows), an infinite and a NaN one, an
// infinite mean; each channel a row of 21 elements (a vector and a tail) of special and
// ordinary latents.
TEST(LatentNormalizeOp, ValuesAreThePipelinesExpressionsInFp32) {
  const float inf = std::numeric_limits<float>::infinity();
  const float stds[] = {2.5f, 0.0f,          -0.0f, -1.75f, 1e-40f, 0x1p-126f,
                        inf,  std::nanf(""), 3e38f, 1.0f,   0.3f,   7.0f};
  const float means[] = {0.5f, -1.0f, 0.0f,   2.0f, -0.0f, 1e-3f,
                         inf,  0.25f, -3e38f, -inf, 1.5f,  -0.75f};
  constexpr auto kC = static_cast<std::int64_t>(std::size(stds));
  for (const DType dtype : kDTypes) {
    for (const DType constants_dtype : {DType::F32, dtype}) {
      HostTensor mean(constants_dtype, {kC}), std_dev(constants_dtype, {kC});
      for (std::int64_t c = 0; c < kC; ++c) {
        mean.set(c, means[c]);
        std_dev.set(c, stds[c]);
      }
      for (const std::vector<std::int64_t>& shape :
           {std::vector<std::int64_t>{2, kC, 21}, std::vector<std::int64_t>{1, kC, 3, 21}}) {
        const HostTensor z = latents(dtype, shape, 5);
        for (const LatentTransform t : kTransforms) {
          for (const bool backward : {false, true}) {
            SCOPED_TRACE(std::string(dtype_name(dtype)) + ", constants " +
                         dtype_name(constants_dtype) + " " + std::to_string(shape.size()) + "-D " +
                         latent_transform_name(t) + (backward ? " backward" : " forward"));
            // Written out here once more, element by element, without pipeline_values.
            HostTensor want(dtype, shape);
            const std::int64_t per_channel = z.elements() / (shape[0] * kC);
            for (std::int64_t e = 0; e < z.elements(); ++e) {
              const std::int64_t c = (e / per_channel) % kC;
              const auto v = static_cast<float>(z.get(e));
              const auto m = static_cast<float>(mean.get(c));
              const auto s = static_cast<float>(std_dev.get(c));
              float r = 0.0f;
              if (t == LatentTransform::Normalize) {
                r = backward ? v / s : (v - m) / s;
              } else {
                r = backward ? v / (1.0f / s) : v / (1.0f / s) + m;
              }
              want.set(e, r);
            }
            on_every_path([&] {
              HostTensor out(dtype, shape);
              out.fill_bytes(std::byte{0xA5});
              normalize(z.cview(), mean.cview(), std_dev.cview(), out.view(), t, backward);
              EXPECT_TRUE(out == want);
            });
          }
        }
      }
    }
  }
}

// Batch element `b` of a contiguous [B, ...] tensor, as a [1, ...] tensor of its bytes.
HostTensor sample(const HostTensor& t, std::int64_t b) {
  std::vector<std::int64_t> shape = t.shape();
  shape[0] = 1;
  HostTensor one(t.dtype(), shape);
  const std::size_t bytes = static_cast<std::size_t>(one.elements()) * dtype_size(t.dtype());
  std::memcpy(one.data(),
              static_cast<const std::byte*>(t.data()) + static_cast<std::size_t>(b) * bytes, bytes);
  return one;
}

// Sample 1 of a batch of 3, alone, has the bytes it has in the batch (the batch's 36864
// elements split over 2 threads, the sample's not).
TEST(LatentNormalizeOp, ASamplesBytesDoNotDependOnItsBatch) {
  const std::vector<std::int64_t> shape = {3, 16, 32, 24};
  for (const DType dtype : kDTypes) {
    const HostTensor z = latents(dtype, shape, 6);
    const HostTensor alone = sample(z, 1);
    const Constants k = constants(dtype, shape[1], 7);
    for (const LatentTransform t : kTransforms) {
      for (const bool backward : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + latent_transform_name(t) +
                     (backward ? " backward" : " forward"));
        on_every_path([&] {
          HostTensor batch_out(dtype, shape), alone_out(dtype, alone.shape());
          normalize(z.cview(), k.mean.cview(), k.std_dev.cview(), batch_out.view(), t, backward);
          normalize(alone.cview(), k.mean.cview(), k.std_dev.cview(), alone_out.view(), t,
                    backward);
          EXPECT_TRUE(sample(batch_out, 1) == alone_out);
        });
      }
    }
  }
}

// ---------------------------------------------------------------------------
// latent_pack.

// A tensor of random bit patterns (any NaN, Inf, subnormal), with NaNs of several payloads
// and signs, signalling ones included, up front.
HostTensor random_bits(DType dtype, const std::vector<std::int64_t>& shape, std::uint64_t seed) {
  test::Rng rng(seed);
  HostTensor t(dtype, shape);
  const std::vector<std::uint32_t> nans =
      dtype == DType::F32
          ? std::vector<std::uint32_t>{0x7F800001u, 0xFFBADBADu, 0x7FC00001u, 0xFF800002u}
      : dtype == DType::BF16 ? std::vector<std::uint32_t>{0x7F81u, 0xFFA5u, 0x7FC1u, 0xFF82u}
                             : std::vector<std::uint32_t>{0x7C01u, 0xFE55u, 0x7E01u, 0xFC02u};
  const std::size_t size = dtype_size(dtype);
  for (std::int64_t e = 0; e < t.elements(); ++e) {
    std::uint32_t bits = static_cast<std::uint32_t>(rng.next());
    if (static_cast<std::size_t>(e) < nans.size()) bits = nans[static_cast<std::size_t>(e)];
    auto* p = static_cast<std::byte*>(t.data()) + static_cast<std::size_t>(e) * size;
    if (size == 4) {
      std::memcpy(p, &bits, 4);
    } else {
      const auto half = static_cast<std::uint16_t>(bits);
      std::memcpy(p, &half, 2);
    }
  }
  return t;
}

std::vector<std::int64_t> tokens_shape(const std::vector<std::int64_t>& latents_shape) {
  const std::int64_t b = latents_shape[0], c = latents_shape[1];
  return {b, (latents_shape[2] / 2) * (latents_shape[3] / 2), 4 * c};
}

// The pipelines' _pack_latents (to_tokens) or _unpack_latents, written as the contract
// states it: y[b, i * W/2 + j, 4c + 2di + dj] = x[b, c, 2i + di, 2j + dj], element bytes
// copied. `from`: latents [B, C, H, W] (to_tokens) or tokens; contiguous.
HostTensor by_index_formula(const HostTensor& from, const std::vector<std::int64_t>& latents_shape,
                            bool to_tokens) {
  const std::int64_t batch = latents_shape[0], channels = latents_shape[1];
  const std::int64_t height = latents_shape[2], width = latents_shape[3];
  HostTensor to(from.dtype(), to_tokens ? tokens_shape(latents_shape) : latents_shape);
  const std::size_t size = dtype_size(from.dtype());
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t i = 0; i < height / 2; ++i) {
      for (std::int64_t j = 0; j < width / 2; ++j) {
        for (std::int64_t c = 0; c < channels; ++c) {
          for (std::int64_t di = 0; di < 2; ++di) {
            for (std::int64_t dj = 0; dj < 2; ++dj) {
              const std::int64_t token =
                  (b * (height / 2) * (width / 2) + i * (width / 2) + j) * 4 * channels + 4 * c +
                  2 * di + dj;
              const std::int64_t latent =
                  ((b * channels + c) * height + 2 * i + di) * width + 2 * j + dj;
              const std::int64_t src = to_tokens ? latent : token;
              const std::int64_t dst = to_tokens ? token : latent;
              std::memcpy(
                  static_cast<std::byte*>(to.data()) + dst * static_cast<std::int64_t>(size),
                  static_cast<const std::byte*>(from.data()) +
                      src * static_cast<std::int64_t>(size),
                  size);
            }
          }
        }
      }
    }
  }
  return to;
}

// One latent, one token; Qwen-Image's 16 channels; an odd number of tokens a row (W/2 = 7);
// C = 1 (a token of 4 features); and a batch of more than 32768 elements, which the pool
// splits over 2 threads.
const std::vector<std::vector<std::int64_t>> kPackShapes = {
    {1, 1, 2, 2}, {2, 3, 4, 6}, {2, 16, 6, 10}, {3, 5, 10, 14}, {2, 1, 8, 4}, {2, 16, 34, 32}};

// Both directions, every pair of storages of the latents and the tokens (the CPU's word
// copies where both are unit-stride, its element copies otherwise).
TEST(LatentPackOp, EveryBackendPathAndThreadCountGivesTheReferencesBytes) {
  for (const auto& shape : kPackShapes) {
    for (const DType dtype : kDTypes) {
      const HostTensor x = random_bits(dtype, shape, 8);
      const HostTensor tokens = random_bits(dtype, tokens_shape(shape), 9);
      const HostTensor packed = by_index_formula(x, shape, true);
      const HostTensor unpacked = by_index_formula(tokens, shape, false);
      for (const Storage latent_storage : kStorages) {
        for (const Storage token_storage : kStorages) {
          SCOPED_TRACE(std::to_string(shape[1]) + "x" + std::to_string(shape[2]) + "x" +
                       std::to_string(shape[3]) + " " + dtype_name(dtype) + ", latents " +
                       storage_name(latent_storage) + ", tokens " + storage_name(token_storage));
          const PlacedBuffer x_in = placed(x, latent_storage);
          const PlacedBuffer dy_in = placed(tokens, token_storage);
          expect_every_path_gives_the_reference([&] {
            PlacedBuffer y = output(dtype, tokens_shape(shape), token_storage);
            latent_pack_forward(x_in.cview(), y.view());
            EXPECT_EQ(test::logical_bits(y.cview()), test::logical_bits(packed.cview()));
            return Outputs{test::named_bytes("y", y)};
          });
          expect_every_path_gives_the_reference([&] {
            PlacedBuffer dx = output(dtype, shape, latent_storage);
            latent_pack_backward(dy_in.cview(), dx.view());
            EXPECT_EQ(test::logical_bits(dx.cview()), test::logical_bits(unpacked.cview()));
            return Outputs{test::named_bytes("dx", dx)};
          });
        }
      }
    }
  }
}

// The forward then the backward gives the latents' bytes back, and the backward then the
// forward the tokens': a permutation, whose copies keep every NaN's payload and sign.
TEST(LatentPackOp, BackwardUndoesForwardByteForByte) {
  for (const auto& shape : kPackShapes) {
    for (const DType dtype : kDTypes) {
      SCOPED_TRACE(std::to_string(shape[1]) + "x" + std::to_string(shape[2]) + "x" +
                   std::to_string(shape[3]) + " " + dtype_name(dtype));
      const HostTensor x = random_bits(dtype, shape, 10);
      const HostTensor tokens = random_bits(dtype, tokens_shape(shape), 11);
      on_every_path([&] {
        HostTensor y(dtype, tokens_shape(shape)), back(dtype, shape);
        latent_pack_forward(x.cview(), y.view());
        latent_pack_backward(y.cview(), back.view());
        EXPECT_TRUE(back == x);
        HostTensor dx(dtype, shape), again(dtype, tokens_shape(shape));
        latent_pack_backward(tokens.cview(), dx.view());
        latent_pack_forward(dx.cview(), again.view());
        EXPECT_TRUE(again == tokens);
      });
    }
  }
}

// Sample 1 of a batch of 3, alone, has the bytes it has in the batch, both ways.
TEST(LatentPackOp, ASamplesBytesDoNotDependOnItsBatch) {
  const std::vector<std::int64_t> shape = {3, 16, 32, 24};
  for (const DType dtype : kDTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const HostTensor x = random_bits(dtype, shape, 12);
    const HostTensor tokens = random_bits(dtype, tokens_shape(shape), 13);
    const HostTensor x_alone = sample(x, 1), tokens_alone = sample(tokens, 1);
    on_every_path([&] {
      HostTensor y(dtype, tokens_shape(shape)), y_alone(dtype, tokens_alone.shape());
      latent_pack_forward(x.cview(), y.view());
      latent_pack_forward(x_alone.cview(), y_alone.view());
      EXPECT_TRUE(sample(y, 1) == y_alone);
      HostTensor dx(dtype, shape), dx_alone(dtype, x_alone.shape());
      latent_pack_backward(tokens.cview(), dx.view());
      latent_pack_backward(tokens_alone.cview(), dx_alone.view());
      EXPECT_TRUE(sample(dx, 1) == dx_alone);
    });
  }
}

// ---------------------------------------------------------------------------
// Bad arguments.

// The argument `call` is refused for, after checking that the Error's message names it and
// that `written` (the buffer the call's outputs are views of) kept every byte.
template <class Call>
std::string refused(const Call& call, const HostTensor& written) {
  // The bytes now (the call may reach them through views that are not const).
  const std::vector<std::byte> before = test::named_bytes("written", written).bytes;
  std::string message;
  std::string argument = test::rejected_argument([&] {
    try {
      call();
    } catch (const Error& e) {
      message = e.what();
      throw;
    }
  });
  EXPECT_NE(message.find("'" + argument + "'"), std::string::npos) << message;
  EXPECT_TRUE(test::named_bytes("written", written).bytes == before)
      << argument << ": the refused call wrote";
  return argument;
}

HostTensor poisoned(DType dtype, const std::vector<std::int64_t>& shape) {
  HostTensor t(dtype, shape);
  t.fill_bytes(std::byte{0xA5});
  return t;
}

TEST(LatentNormalizeOp, BadArgumentsAreErrorsNamingThem) {
  const test::RuntimeGuard guard;
  for (const char* backend : {"reference", "simd"}) {
    SCOPED_TRACE(backend);
    set_backend(backend);
    test::Rng rng(14);
    const HostTensor z = test::random_tensor(DType::F32, {2, 4, 3, 6}, rng);
    const HostTensor mean(DType::F32, {4}), std_dev = test::random_tensor(DType::F32, {4}, rng);
    const HostTensor five(DType::F32, {5}), three(DType::F32, {3}), flat(DType::F32, {8, 18});
    const HostTensor bool_std(DType::Bool, {4});
    HostTensor y = poisoned(DType::F32, {2, 4, 3, 6});
    const auto forward = [&](const ConstTensorView& in, const ConstTensorView& m,
                             const ConstTensorView& s, const TensorView& out) {
      return [in, m, s, out] { latent_normalize_forward(in, m, s, out, {}); };
    };
    EXPECT_EQ(refused(forward(flat.cview(), mean.cview(), std_dev.cview(), y.view()), y), "z");
    EXPECT_EQ(refused(forward(z.cview(), five.cview(), std_dev.cview(), y.view()), y), "mean");
    EXPECT_EQ(refused(forward(z.cview(), mean.cview(), three.cview(), y.view()), y), "std");
    EXPECT_EQ(refused(forward(z.cview(), mean.cview(), bool_std.cview(), y.view()), y), "std");
    HostTensor other = poisoned(DType::F32, {2, 4, 3, 5});
    EXPECT_EQ(refused(forward(z.cview(), mean.cview(), std_dev.cview(), other.view()), other), "y");
    HostTensor flat_out = poisoned(DType::F32, {8, 18});
    EXPECT_EQ(refused(forward(z.cview(), mean.cview(), std_dev.cview(), flat_out.view()), flat_out),
              "y");
    // y one element on from z in one buffer: overlapping, not in place.
    HostTensor shared = poisoned(DType::F32, {2 * 4 * 3 * 6 + 1});
    ConstTensorView z_in = test::strided(shared.cview(), {2, 4, 3, 6}, {72, 18, 6, 1});
    TensorView shifted = test::strided(shared.view(), {2, 4, 3, 6}, {72, 18, 6, 1});
    shifted.data = static_cast<float*>(shifted.data) + 1;
    EXPECT_EQ(refused(forward(z_in, mean.cview(), std_dev.cview(), shifted), shared), "y");
    // The backward: dy of rank 2, std of another length, dz of another shape.
    HostTensor dz = poisoned(DType::F32, {2, 4, 3, 6});
    EXPECT_EQ(
        refused([&] { latent_normalize_backward(flat.cview(), std_dev.cview(), dz.view(), {}); },
                dz),
        "dy");
    EXPECT_EQ(
        refused([&] { latent_normalize_backward(z.cview(), five.cview(), dz.view(), {}); }, dz),
        "std");
    EXPECT_EQ(
        refused([&] { latent_normalize_backward(z.cview(), std_dev.cview(), other.view(), {}); },
                other),
        "dz");
  }
}

TEST(LatentPackOp, BadArgumentsAreErrorsNamingThem) {
  const test::RuntimeGuard guard;
  for (const char* backend : {"reference", "simd"}) {
    SCOPED_TRACE(backend);
    set_backend(backend);
    const HostTensor x = random_bits(DType::BF16, {2, 3, 4, 6}, 15);
    const HostTensor odd_h = random_bits(DType::BF16, {2, 3, 5, 6}, 16);
    const HostTensor odd_w = random_bits(DType::BF16, {2, 3, 4, 7}, 17);
    const HostTensor rank3 = random_bits(DType::BF16, {2, 3, 24}, 18);
    HostTensor y = poisoned(DType::BF16, {2, 6, 12});
    const auto forward = [](const ConstTensorView& in, const TensorView& out) {
      return [in, out] { latent_pack_forward(in, out); };
    };
    const auto backward = [](const ConstTensorView& in, const TensorView& out) {
      return [in, out] { latent_pack_backward(in, out); };
    };
    // Odd H or W, or not [B, C, H, W].
    EXPECT_EQ(refused(forward(odd_h.cview(), y.view()), y), "x");
    EXPECT_EQ(refused(forward(odd_w.cview(), y.view()), y), "x");
    EXPECT_EQ(refused(forward(rank3.cview(), y.view()), y), "x");
    // Tokens of another shape or dtype.
    for (const std::vector<std::int64_t>& shape :
         {std::vector<std::int64_t>{2, 7, 12}, std::vector<std::int64_t>{2, 6, 6},
          std::vector<std::int64_t>{1, 6, 12}, std::vector<std::int64_t>{2, 72}}) {
      HostTensor wrong = poisoned(DType::BF16, shape);
      EXPECT_EQ(refused(forward(x.cview(), wrong.view()), wrong), "y");
    }
    HostTensor fp32_y = poisoned(DType::F32, {2, 6, 12});
    EXPECT_EQ(refused(forward(x.cview(), fp32_y.view()), fp32_y), "y");
    // Tokens over the latents' memory: the same bytes as another shape, or a part of them.
    HostTensor shared = random_bits(DType::BF16, {2 * 3 * 4 * 6 + 2}, 19);
    const ConstTensorView x_in = test::strided(shared.cview(), {2, 3, 4, 6}, {72, 24, 6, 1});
    EXPECT_EQ(refused(forward(x_in, test::strided(shared.view(), {2, 6, 12}, {72, 12, 1})), shared),
              "y");
    TensorView shifted = test::strided(shared.view(), {2, 6, 12}, {72, 12, 1});
    shifted.data = static_cast<std::uint16_t*>(shifted.data) + 2;
    EXPECT_EQ(refused(forward(x_in, shifted), shared), "y");
    // The backward: odd H or W of dx, dy of another shape or dtype, dx over dy's memory.
    const HostTensor dy = random_bits(DType::BF16, {2, 6, 12}, 20);
    HostTensor dx_odd_h = poisoned(DType::BF16, {2, 3, 5, 6});
    EXPECT_EQ(refused(backward(dy.cview(), dx_odd_h.view()), dx_odd_h), "dx");
    HostTensor dx_odd_w = poisoned(DType::BF16, {2, 3, 4, 7});
    EXPECT_EQ(refused(backward(dy.cview(), dx_odd_w.view()), dx_odd_w), "dx");
    HostTensor dx = poisoned(DType::BF16, {2, 3, 4, 6});
    const HostTensor dy_long = random_bits(DType::BF16, {2, 7, 12}, 21);
    EXPECT_EQ(refused(backward(dy_long.cview(), dx.view()), dx), "dy");
    const HostTensor dy_narrow = random_bits(DType::BF16, {2, 6, 8}, 22);
    EXPECT_EQ(refused(backward(dy_narrow.cview(), dx.view()), dx), "dy");
    const HostTensor dy_f16 = random_bits(DType::F16, {2, 6, 12}, 23);
    EXPECT_EQ(refused(backward(dy_f16.cview(), dx.view()), dx), "dy");
    const HostTensor dy_rank4 = random_bits(DType::BF16, {2, 6, 12, 1}, 24);
    EXPECT_EQ(refused(backward(dy_rank4.cview(), dx.view()), dx), "dy");
    const ConstTensorView dy_in = test::strided(shared.cview(), {2, 6, 12}, {72, 12, 1});
    EXPECT_EQ(refused(backward(dy_in, test::strided(shared.view(), {2, 3, 4, 6}, {72, 24, 6, 1})),
                      shared),
              "dx");
  }
}

}  // namespace
}  // namespace kernel_align
