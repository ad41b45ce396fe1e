"""kernel_align.true_cfg: true classifier-free guidance with Qwen-Image's norm rescale
under the contract (docs/contract.md section 17). The forward and both gradients bitwise
equal to the contract's fp32 arithmetic written in torch (the row tree of formulas.py),
for every dtype of cond and of uncond; within the contract's bounds of the pipeline's
formula and its autograd gradients in fp64; a token's bytes the same alone and inside the
sampler's batch of 2B; strided inputs read in place; a zero row as the pipeline's; opcheck
and torch.compile giving the eager bytes; the CPU's bytes on a CUDA device (skipped
without one); bad arguments errors naming them."""

from __future__ import annotations

import math

import pytest
import torch

import kernel_align as ka
from formulas import assert_bitwise, sqrt_rn, tree_sum

OPS = torch.ops.kernel_align
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SCALES = (4.0, 1.0, 0.0, -2.5, 7.3)  # 7.3: rounded to fp32 as the front ends' option rule
# The contract's bounds against fp64 (section 17), relative to the row's largest |value|.
FORWARD_BOUND = 2.0 ** -18
GRADIENT_BOUND = 2.0 ** -16


def _t(shape, dtype=torch.float32, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype).requires_grad_(grad)


def _scale_like(t: torch.Tensor, scale: float) -> torch.Tensor:
    # The scale as a tensor (the double rounded to nearest fp32): torch may treat a Python
    # scalar operand differently.
    return torch.full_like(t, scale)


def _contract_forward(cond, uncond, scale):
    """fp32 (v, m, C, M, r) of the contract's forward, each operation rounded once."""
    c, u = cond.float(), uncond.float()
    m = u + _scale_like(u, scale) * (c - u)
    squares_cond, squares_combined = tree_sum(c * c), tree_sum(m * m)
    r = (sqrt_rn(squares_cond) / sqrt_rn(squares_combined)).unsqueeze(-1)
    return m * r, m, squares_cond.unsqueeze(-1), squares_combined.unsqueeze(-1), r


def _contract_backward(cond, uncond, dv, scale):
    """fp32 (dcond, duncond) of the contract's backward, each operation rounded once."""
    _, m, squares_cond, squares_combined, r = _contract_forward(cond, uncond, scale)
    c, g = cond.float(), dv.float()
    a = tree_sum(g * m).unsqueeze(-1)
    k = (r * a) / squares_combined
    q = a / (sqrt_rn(squares_combined) * sqrt_rn(squares_cond))
    q = torch.where(squares_cond == 0, torch.zeros_like(q), q)
    dm = r * g - k * m
    s = _scale_like(dm, scale)
    return s * dm + q * c, dm - s * dm


def _pipeline(cond, uncond, scale):
    """The Qwen-Image pipeline's expression (noise_pred = cond, neg_noise_pred = uncond)."""
    comb_pred = uncond + scale * (cond - uncond)
    cond_norm = torch.norm(cond, dim=-1, keepdim=True)
    noise_norm = torch.norm(comb_pred, dim=-1, keepdim=True)
    return comb_pred * (cond_norm / noise_norm)


def _assert_within_row_bound(got, want, bound):
    """|got - want| <= bound * (the row's largest |want|), per row (the last dim)."""
    error = (got.double() - want).abs()
    allowed = bound * want.abs().amax(dim=-1, keepdim=True)
    worst = (error / allowed).nan_to_num(0.0).max().item()
    assert (error <= allowed).all(), f"error up to {worst:.3g} times the bound {bound:.3g}"


# ---------------------------------------------------------------------------------------
# The contract's arithmetic, bit for bit


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("d", [64, 17, 130])
def test_forward_is_the_contracts_fp32_arithmetic(scale, d):
    cond, uncond = _t((3, 10, d), seed=1), _t((3, 10, d), seed=2)
    v = ka.true_cfg(cond, uncond, scale)
    assert v.dtype == torch.float32 and v.shape == cond.shape
    assert_bitwise(v, _contract_forward(cond, uncond, scale)[0])


@pytest.mark.parametrize("cond_dtype", DTYPES)
@pytest.mark.parametrize("uncond_dtype", DTYPES)
def test_any_dtypes_round_once(cond_dtype, uncond_dtype):
    """fp32 arithmetic on the widened values, one rounding to cond's dtype (v) and to each
    input's own (the gradients)."""
    cond = _t((2, 12, 64), cond_dtype, seed=3, grad=True)
    uncond = _t((2, 12, 64), uncond_dtype, seed=4, grad=True)
    v = ka.true_cfg(cond, uncond)
    assert v.dtype == cond_dtype
    assert_bitwise(v, _contract_forward(cond.detach(), uncond.detach(), 4.0)[0].to(cond_dtype))
    dv = _t(v.shape, torch.bfloat16, seed=5)
    dcond, duncond = torch.autograd.grad(v, (cond, uncond), dv)
    want_dcond, want_duncond = _contract_backward(cond.detach(), uncond.detach(), dv, 4.0)
    assert dcond.dtype == cond_dtype and duncond.dtype == uncond_dtype
    assert_bitwise(dcond, want_dcond.to(cond_dtype))
    assert_bitwise(duncond, want_duncond.to(uncond_dtype))


@pytest.mark.parametrize("scale", SCALES)
def test_gradients_are_the_contracts_fp32_arithmetic(scale):
    cond, uncond = _t((4, 9, 64), seed=6, grad=True), _t((4, 9, 64), seed=7, grad=True)
    v = ka.true_cfg(cond, uncond, scale)
    dv = _t(v.shape, seed=8)
    dcond, duncond = torch.autograd.grad(v, (cond, uncond), dv)
    want_dcond, want_duncond = _contract_backward(cond.detach(), uncond.detach(), dv, scale)
    assert_bitwise(dcond, want_dcond)
    assert_bitwise(duncond, want_duncond)
    # The operator itself, each gradient alone: the same bytes.
    c, u = cond.detach(), uncond.detach()
    only_cond = OPS.true_cfg_backward(c, u, dv, scale, [True, False])
    only_uncond = OPS.true_cfg_backward(c, u, dv, scale, [False, True])
    assert_bitwise(only_cond[0], dcond)
    assert only_cond[1].numel() == 0 and only_uncond[0].numel() == 0
    assert_bitwise(only_uncond[1], duncond)


def test_a_gradient_only_where_asked():
    cond, uncond = _t((2, 5, 64), seed=9, grad=True), _t((2, 5, 64), seed=10)
    v = ka.true_cfg(cond, uncond)
    dv = _t(v.shape, seed=11)
    v.backward(dv)
    assert uncond.grad is None
    assert_bitwise(cond.grad, _contract_backward(cond.detach(), uncond, dv, 4.0)[0])
    cond, uncond = cond.detach(), uncond.requires_grad_()
    (duncond,) = torch.autograd.grad(ka.true_cfg(cond, uncond), uncond, dv)
    assert_bitwise(duncond, _contract_backward(cond, uncond.detach(), dv, 4.0)[1])


# ---------------------------------------------------------------------------------------
# Against the pipeline's formula in fp64


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("d", [64, 17])
def test_forward_is_the_pipelines_formula_within_the_bound(scale, d):
    cond, uncond = _t((4, 50, d), seed=12), _t((4, 50, d), seed=13)
    # Rows of other magnitudes (the bound is relative) and a cond near uncond. A cond row
    # far smaller than its uncond row is outside the bound at scale 1: uncond + (cond -
    # uncond) cancels, in fp32 as in the pipeline's own fp32 expression.
    cond[0, 0] *= 1e-3
    uncond[0, 0] *= 1e-3
    cond[0, 1] *= 1e4
    uncond[0, 1] *= 1e4
    uncond[1, 1] = cond[1, 1] * (1 - 1e-3)
    v = ka.true_cfg(cond, uncond, scale)
    want = _pipeline(cond.double(), uncond.double(), float(torch.tensor(scale)))
    _assert_within_row_bound(v, want, FORWARD_BOUND)


# Not 0: there dcond is q * cond alone, q proportional to sum(dv_i * m_i), whose fp32 sum
# cancels (random rows: up to about 25 times the bound at scale 0, 1.6 at 1e-3, within it
# from about 0.01); the contract's bound is for the pipelines' scales.
@pytest.mark.parametrize("scale", [4.0, 1.0, -2.5, 7.3])
def test_gradients_are_the_pipelines_autograd_within_the_bound(scale):
    cond, uncond = _t((4, 50, 64), seed=14, grad=True), _t((4, 50, 64), seed=15, grad=True)
    dv = _t((4, 50, 64), seed=16)
    dcond, duncond = torch.autograd.grad(ka.true_cfg(cond, uncond, scale), (cond, uncond), dv)
    c64 = cond.detach().double().requires_grad_()
    u64 = uncond.detach().double().requires_grad_()
    want = torch.autograd.grad(_pipeline(c64, u64, float(torch.tensor(scale))), (c64, u64),
                               dv.double())
    _assert_within_row_bound(dcond, want[0], GRADIENT_BOUND)
    _assert_within_row_bound(duncond, want[1], GRADIENT_BOUND)


def test_zero_rows_are_the_pipelines():
    """cond and uncond zero: 0 * (0 / 0), NaN, as the pipeline's expression; cond zero
    alone: v = 0 and zero gradients (torch's gradient of a norm at 0)."""
    cond, uncond = _t((3, 64), seed=17), _t((3, 64), seed=18)
    cond[0], uncond[0] = 0.0, 0.0
    cond[1] = 0.0
    cond.requires_grad_(), uncond.requires_grad_()
    v = ka.true_cfg(cond, uncond)
    want = _pipeline(cond.detach().double(), uncond.detach().double(), 4.0)
    assert v[0].isnan().all() and want[0].isnan().all()
    assert (v[1] == 0).all() and (want[1] == 0).all()
    _assert_within_row_bound(v[2], want[2], FORWARD_BOUND)
    dcond, duncond = torch.autograd.grad(v[1:], (cond, uncond), _t((2, 64), seed=19))
    assert (dcond[1] == 0).all() and (duncond[1] == 0).all()
    assert dcond[2].isfinite().all() and duncond[2].isfinite().all()


# ---------------------------------------------------------------------------------------
# Batch invariance and strides


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_tokens_bytes_are_the_same_alone_and_in_the_samplers_batch(dtype):
    """The sampler runs both passes of B samples as one batch of 2B (cond its first half,
    uncond its second); the trainer runs each sample's passes apart, and a token alone."""
    b = 3
    both = _t((2 * b, 20, 64), dtype, seed=20)
    dv = _t((b, 20, 64), dtype, seed=21)
    v = ka.true_cfg(both[:b], both[b:])
    dcond, duncond = OPS.true_cfg_backward(both[:b], both[b:], dv, 4.0, [True, True])
    for i in range(b):
        cond, uncond = both[i:i + 1].clone(), both[b + i:b + i + 1].clone()
        assert_bitwise(ka.true_cfg(cond, uncond), v[i:i + 1])
        alone = OPS.true_cfg_backward(cond, uncond, dv[i:i + 1].clone(), 4.0, [True, True])
        assert_bitwise(alone[0], dcond[i:i + 1])
        assert_bitwise(alone[1], duncond[i:i + 1])
        token = ka.true_cfg(both[i, 7].clone(), both[b + i, 7].clone())  # rank 1: one row
        assert_bitwise(token, v[i, 7])


def test_strided_inputs_are_read_in_place():
    base = _t((2, 64, 30), torch.bfloat16, seed=22)
    cond = base.transpose(1, 2)[:, 3:]  # [2, 27, 64], the channels of stride 30
    uncond = _t((2, 27, 128), seed=23)[..., ::2]  # fp32, the channels of stride 2
    assert not cond.is_contiguous() and uncond.stride(-1) == 2
    v = ka.true_cfg(cond, uncond, 5.0)
    assert v.stride() == torch.empty_like(cond).stride()
    assert_bitwise(v, ka.true_cfg(cond.contiguous(), uncond.contiguous(), 5.0))
    dv = _t((2, 64, 27), seed=24).transpose(1, 2)
    got = OPS.true_cfg_backward(cond, uncond, dv, 5.0, [True, True])
    want = OPS.true_cfg_backward(cond.contiguous(), uncond.contiguous(), dv.contiguous(), 5.0,
                                 [True, True])
    for g, w in zip(got, want):
        assert_bitwise(g, w)
    # An expanded gradient (stride 0), as v.sum()'s backward passes one.
    c, u = cond.detach().requires_grad_(), uncond.detach().requires_grad_()
    grads = torch.autograd.grad(ka.true_cfg(c, u, 5.0).sum(), (c, u))
    ones = OPS.true_cfg_backward(cond, uncond, torch.ones(cond.shape), 5.0, [True, True])
    for g, w in zip(grads, ones):
        assert_bitwise(g, w)


# ---------------------------------------------------------------------------------------
# torch.library and torch.compile


def test_opcheck():
    cond, uncond = _t((2, 6, 64), seed=25, grad=True), _t((2, 6, 64), seed=26, grad=True)
    torch.library.opcheck(OPS.true_cfg, (cond, uncond, 4.0))
    torch.library.opcheck(OPS.true_cfg, (cond[0, 0], uncond[0, 0].bfloat16(), -1.5))
    c, u, dv = cond.detach(), uncond.detach(), _t((2, 6, 64), seed=27)
    for mask in ([True, True], [True, False], [False, True]):
        torch.library.opcheck(OPS.true_cfg_backward, (c, u, dv, 4.0, mask))


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_gives_the_eager_bytes(dynamic):
    def guided(cond, uncond):
        return ka.true_cfg(cond * 2, uncond, 4.0) + 1

    torch._dynamo.reset()
    compiled = torch.compile(guided, fullgraph=True, dynamic=dynamic)
    for seed, shape in enumerate(((2, 8, 64), (1, 5, 64))):
        cond = _t(shape, torch.bfloat16, seed=28 + seed, grad=True)
        uncond = _t(shape, seed=30 + seed, grad=True)
        eager = guided(cond, uncond)
        eager_grads = torch.autograd.grad(eager, (cond, uncond), torch.ones_like(eager))
        out = compiled(cond, uncond)
        assert_bitwise(out, eager)
        for got, want in zip(torch.autograd.grad(out, (cond, uncond), torch.ones_like(out)),
                             eager_grads):
            assert_bitwise(got, want)


def test_double_backward_raises():
    cond, uncond = _t((2, 64), grad=True), _t((2, 64), seed=1, grad=True)
    (g,) = torch.autograd.grad(ka.true_cfg(cond, uncond).sum(), cond, create_graph=True)
    with pytest.raises(NotImplementedError, match="true_cfg: double backward"):
        torch.autograd.grad(g.sum(), uncond)


@pytest.mark.skipif(not (ka.HAS_CUDA and torch.cuda.is_available()),
                    reason="the extension has no CUDA kernels or no CUDA device is visible")
def test_cuda_gives_the_cpu_bytes():
    """The forward and the backward on CUDA tensors (strided ones, mixed dtypes), and a
    gradient through autograd."""
    host = dict(cond=_t((3, 40, 64), torch.bfloat16, seed=32), uncond=_t((3, 40, 64), seed=33),
                dv=_t((3, 40, 64), torch.float16, seed=34))
    calls = [
        lambda t: OPS.true_cfg(t["cond"], t["uncond"], 4.0),
        lambda t: OPS.true_cfg(t["cond"].transpose(0, 1), t["uncond"].transpose(0, 1), -3.0),
        lambda t: OPS.true_cfg_backward(t["cond"], t["uncond"], t["dv"], 4.0, [True, True]),
        lambda t: OPS.true_cfg_backward(t["cond"], t["uncond"], t["dv"], 2.0, [False, True]),
    ]
    device = {name: t.cuda() for name, t in host.items()}
    for call in calls:
        got, want = call(device), call(host)
        for g, w in zip(got if isinstance(got, tuple) else (got,),
                        want if isinstance(want, tuple) else (want,)):
            assert g.is_cuda
            assert_bitwise(g.cpu(), w)
    cond = device["cond"].clone().requires_grad_()
    (dcond,) = torch.autograd.grad(ka.true_cfg(cond, device["uncond"]), cond, device["dv"])
    want = OPS.true_cfg_backward(host["cond"], host["uncond"], host["dv"], 4.0, [True, False])
    assert_bitwise(dcond.cpu(), want[0])


# ---------------------------------------------------------------------------------------
# Errors


def test_bad_arguments_name_them():
    cond = _t((2, 8, 64))
    with pytest.raises(ValueError, match=r"argument 'uncond'.*shape"):
        ka.true_cfg(cond, _t((2, 8, 63)))
    with pytest.raises(ValueError, match=r"argument 'uncond'"):
        ka.true_cfg(cond, _t((2, 64)))
    for scale in (math.inf, -math.inf, math.nan, 1e300):
        with pytest.raises(ValueError, match=r"argument 'scale'"):
            ka.true_cfg(cond, cond, scale)
    with pytest.raises(TypeError, match=r"argument 'scale'"):
        ka.true_cfg(cond, cond, "4.0")
    with pytest.raises(ValueError, match=r"argument 'cond'.*rank"):
        ka.true_cfg(_t((1, 1, 1, 2, 64)), _t((1, 1, 1, 2, 64)))
    with pytest.raises(TypeError, match=r"argument 'cond'.*torch.float64"):
        ka.true_cfg(cond.double(), cond)
    with pytest.raises(TypeError, match=r"argument 'uncond'.*torch.Tensor"):
        ka.true_cfg(cond, cond.tolist())
    with pytest.raises(ValueError, match=r"argument 'dv'"):
        OPS.true_cfg_backward(cond, cond, _t((2, 8, 32)), 4.0, [True, True])
    with pytest.raises(ValueError, match=r"argument 'dcond'.*neither"):
        OPS.true_cfg_backward(cond, cond, cond, 4.0, [False, False])
    with pytest.raises(ValueError, match=r"argument 'scale'"):
        OPS.true_cfg_backward(cond, cond, cond, math.nan, [True, False])
