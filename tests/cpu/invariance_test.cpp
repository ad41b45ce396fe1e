// Bitwise invariances of the CPU backend. Batch: a sample's output bytes are the
// same computed alone and at position 2 of a batch of 4 random samples (the batch
// is large enough to be split over threads, the sample alone is not). Threads:
// every output, dw included, is the same at 1, 2, 3 and 7 threads on every path,
// with shapes large enough that the pool really splits the rows, and equals the
// reference.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "kernel_align/ops.hpp"
#include "kernel_align/runtime.hpp"
#include "support/op_cases.hpp"
#include "support/runtime_guard.hpp"

namespace kernel_align {
namespace {

using test::CaseSpec;
using test::HostTensor;
using test::OpKind;
using test::Rng;

constexpr std::int64_t kBatch = 4;
constexpr std::int64_t kPosition = 2;

// [4, ...] random samples of `alone`'s dtype with sample kPosition a copy of
// `alone` ([1, ...]).
HostTensor batch_around(const HostTensor& alone, Rng& rng, bool varied) {
  std::vector<std::int64_t> shape = alone.shape();
  shape[0] = kBatch;
  HostTensor batch = varied ? test::varied_rows(alone.dtype(), shape, rng)
                            : test::spread_tensor(alone.dtype(), shape, rng);
  const auto size = static_cast<std::size_t>(alone.elements()) * dtype_size(alone.dtype());
  std::memcpy(static_cast<std::byte*>(batch.data()) + kPosition * size, alone.data(), size);
  return batch;
}

// The bytes of sample kPosition of a [4, ...] output.
std::vector<std::byte> sample_bytes(const HostTensor& batch) {
  const auto size = static_cast<std::size_t>(batch.elements() / kBatch) * dtype_size(batch.dtype());
  const auto* p = static_cast<const std::byte*>(batch.data()) + kPosition * size;
  return {p, p + size};
}
std::vector<std::byte> all_bytes(const HostTensor& t) {
  const auto* p = static_cast<const std::byte*>(t.data());
  return {p, p + static_cast<std::size_t>(t.elements()) * dtype_size(t.dtype())};
}

struct Sample {
  HostTensor alone;
  HostTensor batch;
};
Sample sample(DType dtype, const std::vector<std::int64_t>& shape, Rng& rng, bool varied) {
  HostTensor alone =
      varied ? test::varied_rows(dtype, shape, rng) : test::spread_tensor(dtype, shape, rng);
  HostTensor batch = batch_around(alone, rng, varied);
  return {std::move(alone), std::move(batch)};
}

struct BatchParam {
  DType dtype;
  Layout layout;
};

void PrintTo(const BatchParam& p, std::ostream* os) {
  *os << dtype_name(p.dtype) << " " << layout_name(p.layout);
}

class BatchInvariance : public ::testing::TestWithParam<BatchParam> {
 protected:
  static constexpr std::int64_t kSeq = 40;
  static constexpr std::int64_t kTextLen = 7;
  static constexpr std::int64_t kHeads = 6;
  static constexpr std::int64_t kKHeads = 5;
  static constexpr std::int64_t kD = 128;

  std::vector<std::int64_t> shape(std::int64_t b, std::int64_t h) const {
    return test::layout_shape(GetParam().layout, b, kSeq, h, kD);
  }

  // Calls `compute(batch_size)` ([1, ...] alone, [4, ...] batch; it returns the
  // outputs as (alone-or-batch HostTensors)) on every path and at 1, 3 and 7
  // threads; each output's sample bytes must match.
  template <class Compute>
  void expect_invariant(const Compute& compute) {
    const test::RuntimeGuard guard;
    for (Isa isa : test::available_isas()) {
      for (int threads : {1, 3, 7}) {
        test::RunConfig::cpu(isa, threads).apply();
        SCOPED_TRACE(test::RunConfig::cpu(isa, threads).name());
        const std::vector<HostTensor> alone = compute(false);
        const std::vector<HostTensor> batch = compute(true);
        ASSERT_EQ(alone.size(), batch.size());
        for (std::size_t o = 0; o < alone.size(); ++o) {
          EXPECT_TRUE(all_bytes(alone[o]) == sample_bytes(batch[o])) << "output " << o;
        }
      }
    }
  }
};

TEST_P(BatchInvariance, QkRmsNorm) {
  const DType dt = GetParam().dtype;
  Rng rng(41);
  const Sample x = sample(dt, shape(1, kHeads), rng, true);
  const Sample dy = sample(dt, shape(1, kHeads), rng, false);
  const HostTensor w = test::random_weight(DType::BF16, kD, rng);
  const RmsNormOptions options{1e-6f, NormMode::Diffusers};
  expect_invariant([&](bool batched) {
    const HostTensor& xs = batched ? x.batch : x.alone;
    const HostTensor& dys = batched ? dy.batch : dy.alone;
    std::vector<HostTensor> out;
    out.emplace_back(dt, xs.shape());
    out.emplace_back(DType::F32, xs.shape());
    HostTensor dw(DType::F32, {kD});
    qk_rmsnorm_forward(xs.cview(), w.cview(), out[0].view(), options);
    qk_rmsnorm_backward(xs.cview(), dys.cview(), w.cview(), out[1].view(), dw.view(), options);
    return out;
  });
}

TEST_P(BatchInvariance, MultiAxisRope) {
  const DType dt = GetParam().dtype;
  Rng rng(42);
  const Sample x = sample(dt, shape(1, kHeads), rng, false);
  const test::TablePair t = test::random_tables(kSeq, kD, rng);
  for (Pairing pairing : {Pairing::Half, Pairing::Interleaved}) {
    const RopeOptions options{pairing, GetParam().layout};
    expect_invariant([&](bool batched) {
      const HostTensor& xs = batched ? x.batch : x.alone;
      std::vector<HostTensor> out;
      out.emplace_back(dt, xs.shape());
      out.emplace_back(DType::F32, xs.shape());
      multi_axis_rope_forward(xs.cview(), t.cos.cview(), t.sin.cview(), out[0].view(), options);
      multi_axis_rope_backward(xs.cview(), t.cos.cview(), t.sin.cview(), out[1].view(), options);
      return out;
    });
  }
}

TEST_P(BatchInvariance, QkNormRope) {
  const DType dt = GetParam().dtype;
  Rng rng(43);
  const Sample q = sample(dt, shape(1, kHeads), rng, true);
  const Sample k = sample(dt, shape(1, kKHeads), rng, true);
  const Sample dq_out = sample(dt, shape(1, kHeads), rng, false);
  const Sample dk_out = sample(dt, shape(1, kKHeads), rng, false);
  std::vector<HostTensor> w;
  for (int i = 0; i < 4; ++i) w.push_back(test::random_weight(DType::BF16, kD, rng));
  const QkNormWeights weights{w[0].cview(), w[1].cview(), w[2].cview(), w[3].cview()};
  const test::TablePair t = test::random_tables(kSeq, kD, rng);
  const QkNormRopeOptions options{1e-6f, NormMode::Diffusers, Pairing::Interleaved,
                                  GetParam().layout, kTextLen};
  expect_invariant([&](bool batched) {
    const HostTensor& qs = batched ? q.batch : q.alone;
    const HostTensor& ks = batched ? k.batch : k.alone;
    std::vector<HostTensor> out;
    out.emplace_back(dt, qs.shape());
    out.emplace_back(dt, ks.shape());
    out.emplace_back(DType::F32, qs.shape());
    out.emplace_back(DType::F32, ks.shape());
    qk_norm_rope_forward(qs.cview(), ks.cview(), weights, t.cos.cview(), t.sin.cview(),
                         out[0].view(), out[1].view(), options);
    std::vector<HostTensor> dw;
    for (int i = 0; i < 4; ++i) dw.emplace_back(DType::F32, std::vector<std::int64_t>{kD});
    qk_norm_rope_backward(qs.cview(), ks.cview(), (batched ? dq_out.batch : dq_out.alone).cview(),
                          (batched ? dk_out.batch : dk_out.alone).cview(), weights, t.cos.cview(),
                          t.sin.cview(), out[2].view(), out[3].view(),
                          {dw[0].view(), dw[1].view(), dw[2].view(), dw[3].view()}, options);
    return out;
  });
}

INSTANTIATE_TEST_SUITE_P(
    Dtypes, BatchInvariance,
    ::testing::Values(BatchParam{DType::BF16, Layout::BSHD}, BatchParam{DType::BF16, Layout::BHSD},
                      BatchParam{DType::F16, Layout::BSHD}, BatchParam{DType::F32, Layout::BHSD}),
    [](const ::testing::TestParamInfo<BatchParam>& param) {
      return std::string(dtype_name(param.param.dtype)) + "_" + layout_name(param.param.layout);
    });

// Every op at shapes the pool splits over all 7 threads: the outputs (dw
// included) at 1, 2, 3 and 7 threads are identical to each other on every path,
// and equal the reference.
class ThreadCountInvariance : public ::testing::TestWithParam<OpKind> {};

TEST_P(ThreadCountInvariance, OneTwoThreeAndSevenThreadsGiveTheSameBytes) {
  const OpKind op = GetParam();
  const test::RuntimeGuard guard;
  Rng rng(44);
  struct Variant {
    DType in;
    DType out;
    DType weight;
    NormMode mode;
    Pairing pairing;
    Layout layout;
  };
  for (const Variant v :
       {Variant{DType::BF16, DType::BF16, DType::BF16, NormMode::Diffusers, Pairing::Interleaved,
                Layout::BSHD},
        Variant{DType::F32, DType::F32, DType::F32, NormMode::Single, Pairing::Half, Layout::BHSD},
        Variant{DType::F16, DType::BF16, DType::F16, NormMode::Diffusers, Pairing::Half,
                Layout::BSHD}}) {
    CaseSpec c;
    c.in = v.in;
    c.out = v.out;
    c.weight = v.weight;
    c.dw = v.weight;
    c.mode = v.mode;
    c.pairing = v.pairing;
    c.layout = v.layout;
    // q: 2 * 131 * 5 = 1310 rows of 128 (the image stream 1240): over 7 * 16384
    // elements, so every thread count up to 7 gets its own rows.
    c.batch = 2;
    c.seq = 131;
    c.heads = 5;
    c.k_heads = 4;
    c.d = 128;
    c.text_len = 7;
    SCOPED_TRACE(std::string(test::op_name(op)) + " " + c.name());
    test::with_case(op, c, rng, [&](const auto& one) {
      test::RunConfig::reference().apply();
      const test::Outputs reference = one.run();
      for (Isa isa : test::available_isas()) {
        test::RunConfig::cpu(isa, 1).apply();
        const test::Outputs single = one.run();
        EXPECT_TRUE(test::same_bytes(reference, single)) << isa_name(isa) << ", 1 thread";
        for (int threads : {2, 3, 7}) {
          test::RunConfig::cpu(isa, threads).apply();
          EXPECT_TRUE(test::same_bytes(single, one.run()))
              << isa_name(isa) << ": " << threads << " threads vs 1";
        }
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, ThreadCountInvariance, ::testing::ValuesIn(test::kAllOps),
                         [](const ::testing::TestParamInfo<OpKind>& param) {
                           return std::string(test::op_name(param.param));
                         });

// Calls from several application threads at once (each op on its own thread, the
// pool shared) give each call the reference's bytes.
TEST(ConcurrentCallers, EveryCallGetsTheReferenceBytes) {
  const test::RuntimeGuard guard;
  CaseSpec c;
  c.in = DType::BF16;
  c.out = DType::BF16;
  c.weight = DType::BF16;
  c.dw = DType::F32;
  c.mode = NormMode::Diffusers;
  c.batch = 2;
  c.seq = 67;
  c.heads = 5;
  c.k_heads = 4;
  c.d = 128;
  c.text_len = 7;
  Rng rng(45);
  const test::NormBackwardCase norm = test::make_norm_backward(c, rng);
  const test::RopeCase rope = test::make_rope(c, false, rng);
  const test::FusedForwardCase forward = test::make_fused_forward(c, rng);
  const test::FusedBackwardCase backward = test::make_fused_backward(c, rng);
  test::RunConfig::reference().apply();
  const std::vector<test::Outputs> expected = {norm.run(), rope.run(), forward.run(),
                                               backward.run()};
  test::RunConfig::cpu(best_isa(), 3).apply();
  std::vector<std::vector<test::Outputs>> got(4);
  {
    std::vector<std::thread> callers;
    constexpr int kCalls = 8;
    callers.emplace_back([&] {
      for (int i = 0; i < kCalls; ++i) got[0].push_back(norm.run());
    });
    callers.emplace_back([&] {
      for (int i = 0; i < kCalls; ++i) got[1].push_back(rope.run());
    });
    callers.emplace_back([&] {
      for (int i = 0; i < kCalls; ++i) got[2].push_back(forward.run(false));
    });
    callers.emplace_back([&] {
      for (int i = 0; i < kCalls; ++i) got[3].push_back(backward.run(false));
    });
    for (std::thread& t : callers) t.join();
  }
  for (std::size_t op = 0; op < 4; ++op) {
    for (const test::Outputs& one : got[op]) {
      EXPECT_TRUE(test::same_bytes(expected[op], one)) << "caller " << op;
    }
  }
}

}  // namespace
}  // namespace kernel_align
