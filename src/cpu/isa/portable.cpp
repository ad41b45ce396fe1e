// The portable path: plain C++ on 16-float arrays, compiled without instruction-set
// flags, so it runs on any CPU and architecture. Every lane operation is the
// contract's scalar function, which makes this path the vector policy written out.
#include <cstdint>
#include <cstring>

#include "cpu/isa/row_kernels.hpp"

namespace kernel_align::cpu {
namespace {

struct PortableOps {
  struct F {
    float lane[kLanes];
  };
  struct H {
    std::uint16_t lane[kLanes];
  };

  template <class Op>
  static F each(const Op& op) {
    F r;
    for (int j = 0; j < kLanes; ++j) r.lane[j] = op(j);
    return r;
  }

  static F zero() { return broadcast(0.0f); }
  static F broadcast(float v) {
    return each([&](int) { return v; });
  }
  static F add(F a, F b) {
    return each([&](int j) { return contract::add(a.lane[j], b.lane[j]); });
  }
  static F sub(F a, F b) {
    return each([&](int j) { return contract::sub(a.lane[j], b.lane[j]); });
  }
  static F mul(F a, F b) {
    return each([&](int j) { return contract::mul(a.lane[j], b.lane[j]); });
  }
  static F negate(F v) {
    return each([&](int j) { return -v.lane[j]; });
  }
  static F negate_even(F v) {
    return each([&](int j) { return j % 2 == 0 ? -v.lane[j] : v.lane[j]; });
  }
  static F swap_pairs(F v) {
    return each([&](int j) { return v.lane[j ^ 1]; });
  }
  static F dup_pairs(const float* p) {
    return each([&](int j) { return p[j / 2]; });
  }
  static F keep_first(F v, int count) {
    return each([&](int j) { return j < count ? v.lane[j] : 0.0f; });
  }

  static float tree_reduce(F v) {
    for (int offset = kLanes / 2; offset >= 1; offset /= 2) {
      for (int j = 0; j < offset; ++j) v.lane[j] = contract::add(v.lane[j], v.lane[j + offset]);
    }
    return v.lane[0];
  }

  static F load_f32(const float* p) {
    F r;
    std::memcpy(r.lane, p, sizeof r.lane);
    return r;
  }
  static F load_bf16(const std::uint16_t* p) {
    return each([&](int j) { return contract::bf16_to_f32(p[j]); });
  }
  static F load_f16(const std::uint16_t* p) {
    return each([&](int j) { return contract::f16_to_f32(p[j]); });
  }

  static F canonical_nan(F v) {
    const float nan = contract::float_of(contract::canonical_nan_bits(DType::F32));
    return each([&](int j) { return contract::is_nan(v.lane[j]) ? nan : v.lane[j]; });
  }
  static F round_bf16(F v) {
    return each([&](int j) { return contract::round_through(DType::BF16, v.lane[j]); });
  }
  static F round_f16(F v) {
    return each([&](int j) { return contract::round_through(DType::F16, v.lane[j]); });
  }
  static H to_bf16(F v) {
    H h;
    for (int j = 0; j < kLanes; ++j) h.lane[j] = contract::f32_to_bf16(v.lane[j]);
    return h;
  }
  static H to_f16(F v) {
    H h;
    for (int j = 0; j < kLanes; ++j) h.lane[j] = contract::f32_to_f16(v.lane[j]);
    return h;
  }

  static void store(float* p, F v) { std::memcpy(p, v.lane, sizeof v.lane); }
  static void store(std::uint16_t* p, H h) { std::memcpy(p, h.lane, sizeof h.lane); }
  static constexpr bool kNarrowsPairs = false;
  // Plain C++ has no non-temporal store.
  static constexpr bool kStreams = false;
};

}  // namespace

constinit const RowKernels portable_row_kernels = row_kernels_of<PortableOps>();

}  // namespace kernel_align::cpu
