// The contract's activations (kernel_align/contract/activation.hpp) over a vector of
// fp32 lanes: each lane goes through exactly the scalar function's operations, in its
// order, each one rounded once (add, sub, mul, div; no fma), so every lane's bits are the
// scalar result's. The scalar functions' branches become selects: every lane computes
// every branch (with garbage, never trapping, in the lanes a branch does not take) and
// keeps the one the scalar code takes. tests/cpu/gemm_test.cpp compares the lanes with the
// scalar functions over every bf16 value, dense ranges and random bit patterns.
//
// V provides, for its register type F and mask type M: set1(float), add, sub, mul, div,
// lt(a, b), le, ge, gt (ordered comparisons: false for NaN), is_nan(a),
// select(M, if_true, if_false), and_bits(F, uint32), xor_bits(F, uint32), or_bits(F, F),
// and pow2(kf): 2^kf from exponent bits for an integral kf in [-126, 127] (any bits, and
// no trap, elsewhere).
#pragma once

#include <cstdint>

#include "kernel_align/contract/activation.hpp"

namespace kernel_align::cpu {
namespace {

template <class V>
struct SimdActivation {
  using F = typename V::F;

  static F exp(F x) {
    using namespace contract::exp_constants;
    const F shifted = V::add(V::mul(x, V::set1(kLog2e)), V::set1(kRoundMagic));
    const F kf = V::sub(shifted, V::set1(kRoundMagic));
    const F r = V::sub(V::sub(x, V::mul(kf, V::set1(kLn2Hi))), V::mul(kf, V::set1(kLn2Lo)));
    const F r2 = V::mul(r, r);
    F p = V::set1(kC0);
    p = V::add(V::mul(p, r), V::set1(kC1));
    p = V::add(V::mul(p, r), V::set1(kC2));
    p = V::add(V::mul(p, r), V::set1(kC3));
    p = V::add(V::mul(p, r), V::set1(kC4));
    p = V::add(V::mul(p, r), V::set1(kC5));
    const F y = V::add(V::add(V::mul(p, r2), r), V::set1(1.0f));
    const F high =
        V::mul(V::mul(y, V::pow2(V::set1(127.0f))), V::pow2(V::sub(kf, V::set1(127.0f))));
    const F low =
        V::mul(V::mul(y, V::pow2(V::add(kf, V::set1(100.0f)))), V::pow2(V::set1(-100.0f)));
    const F normal = V::mul(y, V::pow2(kf));
    F result = V::select(V::gt(kf, V::set1(127.0f)), high,
                         V::select(V::lt(kf, V::set1(-124.0f)), low, normal));
    result = V::select(V::le(x, V::set1(kUnderflow)), V::set1(0.0f), result);
    result =
        V::select(V::ge(x, V::set1(kOverflow)), V::set1(contract::float_of(0x7F800000u)), result);
    return V::select(V::is_nan(x), x, result);
  }

  static F tanh(F x) {
    using namespace contract::tanh_constants;
    const F a = V::and_bits(x, 0x7FFFFFFFu);
    const F z = V::mul(a, a);
    F p = V::set1(kD0);
    p = V::add(V::mul(p, z), V::set1(kD1));
    p = V::add(V::mul(p, z), V::set1(kD2));
    p = V::add(V::mul(p, z), V::set1(kD3));
    p = V::add(V::mul(p, z), V::set1(kD4));
    const F polynomial = V::add(V::mul(V::mul(p, z), a), a);
    const F one = V::set1(1.0f);
    const F from_exp = V::sub(one, V::div(V::set1(2.0f), V::add(exp(V::add(a, a)), one)));
    const F t = V::select(V::lt(a, V::set1(kPolynomialEnd)), polynomial,
                          V::select(V::lt(a, V::set1(kSaturation)), from_exp, one));
    return V::select(V::is_nan(x), x, V::or_bits(t, V::and_bits(x, 0x80000000u)));
  }

  static F gelu_tanh(F z) {
    const F cube = V::mul(V::mul(z, z), z);
    const F inner = V::mul(V::set1(contract::kGeluBeta),
                           V::add(z, V::mul(V::set1(contract::kGeluKappa), cube)));
    return V::mul(V::mul(V::set1(0.5f), z), V::add(V::set1(1.0f), tanh(inner)));
  }

  static F gelu_tanh_backward(F dy, F z) {
    const F square = V::mul(z, z);
    const F cube = V::mul(square, z);
    const F inner = V::mul(V::set1(contract::kGeluBeta),
                           V::add(z, V::mul(V::set1(contract::kGeluKappa), cube)));
    const F tanh_inner = tanh(inner);
    const F one = V::set1(1.0f);
    const F left = V::mul(V::set1(0.5f), z);
    const F right = V::add(one, tanh_inner);
    const F left_derivative = V::mul(V::set1(0.5f), right);
    const F tanh_derivative = V::sub(one, V::mul(tanh_inner, tanh_inner));
    const F three_kappa = V::mul(V::set1(3.0f), V::set1(contract::kGeluKappa));
    const F inner_derivative =
        V::mul(V::set1(contract::kGeluBeta), V::add(one, V::mul(three_kappa, square)));
    const F right_derivative = V::mul(V::mul(left, tanh_derivative), inner_derivative);
    return V::mul(dy, V::add(left_derivative, right_derivative));
  }

  static F silu(F z) { return V::div(z, V::add(V::set1(1.0f), exp(V::xor_bits(z, 0x80000000u)))); }

  static F silu_backward(F dy, F z) {
    const F one = V::set1(1.0f);
    const F sigmoid = V::div(one, V::add(one, exp(V::xor_bits(z, 0x80000000u))));
    return V::mul(V::mul(dy, sigmoid), V::add(one, V::mul(z, V::sub(one, sigmoid))));
  }

  static F activate(contract::Activation activation, F z) {
    switch (activation) {
      case contract::Activation::GeluTanh:
        return gelu_tanh(z);
      case contract::Activation::Silu:
        return silu(z);
      case contract::Activation::None:
        break;
    }
    return z;
  }

  static F activate_backward(contract::Activation activation, F dy, F z) {
    switch (activation) {
      case contract::Activation::GeluTanh:
        return gelu_tanh_backward(dy, z);
      case contract::Activation::Silu:
        return silu_backward(dy, z);
      case contract::Activation::None:
        break;
    }
    return dy;
  }
};

}  // namespace
}  // namespace kernel_align::cpu
