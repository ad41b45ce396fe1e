// One op of kernel-align on a [1, S, 24, 128] bf16 tensor, as a consumer of the library
// writes it: qk_rmsnorm forward, then the same row alone, which must give the same bytes
// (the library's batch-invariance promise). Exits 0 and prints the version on success.
#include <kernel_align/error.hpp>
#include <kernel_align/ops.hpp>
#include <kernel_align/tensor.hpp>
#include <kernel_align/version.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace ka = kernel_align;

int main() {
  constexpr std::int64_t seq = 64, heads = 24, dim = 128;
  const std::int64_t count = seq * heads * dim;
  std::vector<std::uint16_t> x(count), y(count), y_row(dim), weight(dim);
  std::uint32_t state = 12345;  // a small LCG: bf16 values in [-2, 2)
  for (std::uint16_t& v : x) {
    state = state * 1664525u + 1013904223u;
    const float f = static_cast<float>(state >> 8) / 4194304.0f - 2.0f;
    std::uint32_t bits = 0;
    std::memcpy(&bits, &f, sizeof bits);
    v = static_cast<std::uint16_t>(bits >> 16);
  }
  for (std::uint16_t& w : weight) w = 0x3f80;  // 1.0

  try {
    const ka::RmsNormOptions options{1e-6f, ka::NormMode::Diffusers};
    const auto w = ka::ConstTensorView::contiguous(weight.data(), ka::DType::BF16, {dim});
    ka::qk_rmsnorm_forward(
        ka::ConstTensorView::contiguous(x.data(), ka::DType::BF16, {1, seq, heads, dim}), w,
        ka::TensorView::contiguous(y.data(), ka::DType::BF16, {1, seq, heads, dim}), options);
    // The last row alone.
    ka::qk_rmsnorm_forward(
        ka::ConstTensorView::contiguous(x.data() + count - dim, ka::DType::BF16, {dim}), w,
        ka::TensorView::contiguous(y_row.data(), ka::DType::BF16, {dim}), options);
  } catch (const ka::Error& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
  // With a weight of ones every output row has a mean square of 1 (up to bf16 rounding).
  double mean_square = 0.0;
  for (std::int64_t i = 0; i < dim; ++i) {
    const std::uint32_t bits = std::uint32_t{y[i]} << 16;
    float f = 0.0f;
    std::memcpy(&f, &bits, sizeof f);
    mean_square += static_cast<double>(f) * f / dim;
  }
  if (mean_square < 0.98 || mean_square > 1.02) {
    std::fprintf(stderr, "consumer: row 0 has a mean square of %g, not 1\n", mean_square);
    return 1;
  }
  if (std::memcmp(y.data() + count - dim, y_row.data(), dim * sizeof(std::uint16_t)) != 0) {
    std::fprintf(stderr, "consumer: the row alone gave different bytes\n");
    return 1;
  }
  std::printf(
      "consumer: kernel-align %s (headers %s, %s): qk_rmsnorm of [1, %lld, %lld, %lld] bf16 ok\n",
      ka::version(), KERNEL_ALIGN_VERSION_STRING, ka::contract_version(),
      static_cast<long long>(seq), static_cast<long long>(heads), static_cast<long long>(dim));
  return 0;
}
