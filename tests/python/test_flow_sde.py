"""kernel_align.flow_sde_step_logp: Flow-GRPO's SDE step and log-probability under the
contract. The step equals its fp32 expression in torch bit for bit; the log-probability
equals the grpo demonstration's fp32 computation (linear's tree, a row at a time) bit for
bit and Flow-GRPO's own expressions in fp64 closely; a sample's bytes do not depend on its
batch; gradients flow to v and x (prev and noise are constants); autograd, torch.compile
and opcheck; bad arguments are errors naming them."""

from __future__ import annotations

import math

import pytest
import torch

import kernel_align as ka
from formulas import assert_bitwise

OPS = torch.ops.kernel_align
STEP = dict(sigma=0.8, sigma_prev=0.6, sigma_max=0.9, noise_level=0.7)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _t(shape, dtype=torch.float32, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype).requires_grad_(grad)


def _constants():
    names = ("x", "v", "noise", "inverse_two_var", "log_norm")
    values = OPS.flow_sde_coefficients(STEP["sigma"], STEP["sigma_prev"], STEP["noise_level"],
                                       STEP["sigma_max"])
    return {n: torch.tensor(value, dtype=torch.float32) for n, value in zip(names, values)}


def _sample(x, v, noise):
    return ka.flow_sde_step_logp(x, v, STEP["sigma"], STEP["sigma_prev"],
                                 sigma_max=STEP["sigma_max"], noise=noise)


def _replay(x, v, prev):
    return ka.flow_sde_step_logp(x, v, STEP["sigma"], STEP["sigma_prev"],
                                 sigma_max=STEP["sigma_max"], prev=prev)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_step_is_its_fp32_expression(dtype):
    x, v, noise = (_t((3, 40, 64), dtype, seed) for seed in (1, 2, 3))
    prev, _ = _sample(x, v, noise)
    c = _constants()
    want = (x.float() * c["x"] + v.float() * c["v"]) + c["noise"] * noise.float()
    assert prev.dtype == dtype
    assert_bitwise(prev, want.to(dtype))


def test_logp_is_the_demonstrations_fp32_computation():
    x, v, prev = (_t((3, 40, 64), torch.float32, seed) for seed in (4, 5, 6))
    _, logp = _replay(x, v, prev)
    c = _constants()
    mean = x * c["x"] + v * c["v"]
    distance = (prev - mean).reshape(3, -1)
    squares = torch.cat([ka.linear(r[None], r[None]) for r in distance]).reshape(3)
    want = -(squares * c["inverse_two_var"]) / distance.shape[1] + c["log_norm"]
    assert logp.dtype == torch.float32 and logp.shape == (3,)
    assert_bitwise(logp, want)


def test_logp_is_flow_grpos_in_fp64():
    x, v, noise = (_t((2, 100, 64), torch.float64, seed) for seed in (7, 8, 9))
    sigma, sigma_prev, level = STEP["sigma"], STEP["sigma_prev"], STEP["noise_level"]
    std = math.sqrt(sigma / (1 - sigma)) * level
    dt = sigma_prev - sigma
    mean = x * (1 + std ** 2 / (2 * sigma) * dt) + v * (1 + std ** 2 * (1 - sigma) / (2 * sigma)) * dt
    prev = mean + std * math.sqrt(-dt) * noise
    scale = std * math.sqrt(-dt)
    want = (-((prev - mean) ** 2) / (2 * scale ** 2) - math.log(scale)
            - math.log(math.sqrt(2 * math.pi))).mean(dim=(1, 2))
    _, logp = _replay(x.float(), v.float(), prev.float())
    torch.testing.assert_close(logp.double(), want, rtol=1e-5, atol=1e-5)


def test_a_samples_bytes_do_not_depend_on_its_batch():
    x, v, noise = (_t((5, 33, 64), torch.bfloat16, seed) for seed in (10, 11, 12))
    prev, logp = _sample(x, v, noise)
    for i in range(5):
        alone_prev, alone_logp = _sample(x[i:i + 1].clone(), v[i:i + 1].clone(),
                                         noise[i:i + 1].clone())
        assert_bitwise(alone_prev, prev[i:i + 1])
        assert_bitwise(alone_logp, logp[i:i + 1])


def test_gradients_flow_to_v_and_x_not_to_prev():
    x, v = _t((2, 16, 64), seed=13, grad=True), _t((2, 16, 64), seed=14, grad=True)
    prev = _t((2, 16, 64), seed=15, grad=True)
    _, logp = _replay(x, v, prev)
    dlogp = torch.tensor([0.5, -2.0])
    dx, dv = torch.autograd.grad(logp, (x, v), dlogp)
    assert prev.grad is None
    # d logp_b / d v_i = 2 k (prev_i - mean_i) / N * v_scale, in fp64.
    c = _constants()
    k, n = float(c["inverse_two_var"]), 16 * 64
    d = prev.double() - (x.double() * float(c["x"]) + v.double() * float(c["v"]))
    want = (dlogp.double()[:, None, None] * 2 * k * d / n)
    torch.testing.assert_close(dv.double(), want * float(c["v"]), rtol=1e-4, atol=1e-9)
    torch.testing.assert_close(dx.double(), want * float(c["x"]), rtol=1e-4, atol=1e-9)
    # The step's own gradient: dprev * scale, in x's and v's dtypes.
    xb, vb = _t((2, 8), torch.bfloat16, 16, True), _t((2, 8), torch.float32, 17, True)
    step, _ = _sample(xb, vb, _t((2, 8), torch.bfloat16, 18))
    dxb, dvb = torch.autograd.grad(step, (xb, vb), torch.ones_like(step))
    assert dxb.dtype == torch.bfloat16 and dvb.dtype == torch.float32
    assert_bitwise(dvb, torch.full((2, 8), float(c["v"])))


def test_compile_and_opcheck():
    x, v, prev = _t((2, 8, 64), seed=19, grad=True), _t((2, 8, 64), seed=20, grad=True), _t(
        (2, 8, 64), seed=21)
    step = (STEP["sigma"], STEP["sigma_prev"], STEP["noise_level"], STEP["sigma_max"])

    def run(x, v, prev):
        return ka.flow_sde_step_logp(x, v, step[0], step[1], sigma_max=step[3], prev=prev)[1]

    eager = run(x, v, prev)
    eager_grads = torch.autograd.grad(eager.sum(), (x, v))
    compiled = torch.compile(run, fullgraph=True)
    out = compiled(x, v, prev)
    assert_bitwise(out, eager)
    for got, want in zip(torch.autograd.grad(out.sum(), (x, v)), eager_grads):
        assert_bitwise(got, want)
    xd, vd = x.detach(), v.detach()
    torch.library.opcheck(OPS.flow_sde_step, (x, v, prev, *step))
    torch.library.opcheck(OPS.flow_sde_logp, (x, v, prev, *step))
    torch.library.opcheck(OPS.flow_sde_logp_backward,
                          (xd, vd, prev, torch.ones(2), *step, [True, False]))
    torch.library.opcheck(OPS.flow_sde_step_backward,
                          (xd, torch.bfloat16, torch.float32, *step, [True, True]))


def test_double_backward_raises():
    x, v = _t((1, 8), grad=True), _t((1, 8), seed=1, grad=True)
    _, logp = _replay(x, v, _t((1, 8), seed=2))
    (g,) = torch.autograd.grad(logp.sum(), v, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        torch.autograd.grad(g.sum(), v)


def test_bad_arguments_name_them():
    x = _t((2, 8))
    with pytest.raises(ValueError, match="'noise' and 'prev'.*both"):
        ka.flow_sde_step_logp(x, x, 0.8, 0.6, sigma_max=0.9, noise=x, prev=x)
    with pytest.raises(ValueError, match="'noise' and 'prev'.*neither"):
        ka.flow_sde_step_logp(x, x, 0.8, 0.6, sigma_max=0.9)
    with pytest.raises(ValueError, match="argument 'sigma'"):
        ka.flow_sde_step_logp(x, x, 1.5, 0.6, sigma_max=0.9, noise=x)
    with pytest.raises(ValueError, match="argument 'sigma_prev'"):
        ka.flow_sde_step_logp(x, x, 0.6, 0.8, sigma_max=0.9, noise=x)  # dt of the wrong sign
    with pytest.raises(ValueError, match="argument 'noise_level'"):
        ka.flow_sde_step_logp(x, x, 0.8, 0.6, sigma_max=0.9, noise=x, noise_level=math.inf)
    with pytest.raises(ValueError, match="argument 'noise'"):
        ka.flow_sde_step_logp(x, x, 0.8, 0.6, sigma_max=0.9, noise=_t((2, 9)))
    with pytest.raises(ValueError, match="argument 'x'"):
        ka.flow_sde_step_logp(_t((8,)), _t((8,)), 0.8, 0.6, sigma_max=0.9, noise=_t((8,)))
    with pytest.raises(TypeError, match="argument 'sigma'"):
        ka.flow_sde_step_logp(x, x, "0.8", 0.6, sigma_max=0.9, noise=x)
