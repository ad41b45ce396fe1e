"""kernel_align.linear and the batch-invariant mode: a row's bytes do not depend on its
batch, the gradients are the gradients (exact on integer data), autograd, torch.compile
and opcheck work, the mode routes aten's matmuls to the op and restores torch's own on
exit (also after an exception, and when nested), and patch_linear fuses diffusers'
activations and restores every forward."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import kernel_align
from kernel_align import batch_invariant, linear, patch_linear, set_batch_invariant

OPS = torch.ops.kernel_align
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ACTIVATIONS = ("none", "gelu_tanh", "silu")


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _inputs(m: int, k: int, n: int, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) / math.sqrt(k)).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    return x, w, b


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_rows_do_not_depend_on_their_batch(dtype, activation):
    x, w, b = _inputs(9, 3072, 64, dtype)
    batched = linear(x, w, b, activation=activation)
    for i in range(x.shape[0]):
        assert _same_bytes(linear(x[i:i + 1], w, b, activation=activation), batched[i:i + 1])


def test_within_the_contracts_error_bound_of_the_exact_product():
    # docs/accuracy.md: |S^ - S| <= gamma_m sum |x w|, m = 32 + bit_width(q) + a; K = 3072 is
    # 96 leaves = 32 groups of 3: m = 32 + 2 + 5.
    x, w, b = _inputs(16, 3072, 48)
    got = linear(x, w).double()
    exact = x.double() @ w.double().T
    u = 2.0**-24
    m = 39
    bound = (m * u / (1 - m * u)) * (x.double().abs() @ w.double().abs().T)
    assert torch.all((got - exact).abs() <= bound)


def test_gradients_are_the_exact_gradients_on_integer_data():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-4, 5, (2, 7, 70), generator=g).float().requires_grad_()
    w = torch.randint(-4, 5, (33, 70), generator=g).float().requires_grad_()
    b = torch.randint(-4, 5, (33,), generator=g).float().requires_grad_()
    dy = torch.randint(-4, 5, (2, 7, 33), generator=g).float()
    linear(x, w, b).backward(dy)
    x2, w2, b2 = (t.detach().clone().requires_grad_() for t in (x, w, b))
    F.linear(x2, w2, b2).backward(dy)
    for ours, torchs in ((x, x2), (w, w2), (b, b2)):
        assert torch.equal(ours.grad, torchs.grad)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_input_gradient_rows_do_not_depend_on_their_batch(activation):
    x, w, b = _inputs(6, 300, 40, torch.bfloat16, seed=2)
    dy = torch.randn(6, 40, generator=torch.Generator().manual_seed(3)).bfloat16()
    xb = x.clone().requires_grad_()
    linear(xb, w, b, activation=activation).backward(dy)
    for i in range(x.shape[0]):
        xi = x[i:i + 1].clone().requires_grad_()
        linear(xi, w, b, activation=activation).backward(dy[i:i + 1])
        assert _same_bytes(xi.grad, xb.grad[i:i + 1])


def test_gradients_of_an_expanded_upstream_gradient():
    # sum().backward() hands the op an expanded (stride 0) gradient.
    x, w, b = (t.requires_grad_() for t in _inputs(4, 64, 8))
    linear(x, w, b, activation="silu").sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape and b.grad.shape == b.shape


def test_compiled_equals_eager():
    x, w, b = _inputs(5, 128, 32, torch.bfloat16)

    def f(x, w, b):
        return linear(x, w, b, activation="gelu_tanh") * 2

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert _same_bytes(compiled(x, w, b), f(x, w, b))


def test_opcheck():
    x, w, b = _inputs(3, 64, 16)
    torch.library.opcheck(OPS.linear, (x.requires_grad_(), w, b, "silu"))
    dy = torch.randn(3, 16)
    torch.library.opcheck(OPS.linear_backward, (x.detach(), w, b, dy, "silu", [True, True, True]))


def test_bad_arguments_are_named():
    x, w, b = _inputs(3, 64, 16)
    with pytest.raises(ValueError, match=r"argument 'weight'"):
        linear(x, w[:, :63])
    with pytest.raises(ValueError, match=r"argument 'bias'"):
        linear(x, w, b[:15])
    with pytest.raises(ValueError, match=r"argument 'activation'"):
        linear(x, w, b, activation="relu")
    with pytest.raises(TypeError, match=r"argument 'bias'"):
        linear(x, w, [1.0])


# ---------------------------------------------------------------------------------------
# the batch-invariant mode


def test_mode_routes_matmuls_and_restores_torchs_own_kernels():
    x, w, b = _inputs(8, 3072, 24)
    ours = linear(x, w, b)
    torchs = F.linear(x, w, b)
    assert not kernel_align.is_batch_invariant()
    with batch_invariant():
        assert kernel_align.is_batch_invariant()
        assert _same_bytes(F.linear(x, w, b), ours)
        assert _same_bytes(x @ w.T, linear(x, w))
        assert _same_bytes(torch.mm(x, w.T), linear(x, w))
        batched = torch.stack([x, x.flip(0)])
        assert _same_bytes(torch.bmm(batched, w.T.expand(2, -1, -1))[0], linear(x, w))
    assert not kernel_align.is_batch_invariant()
    assert _same_bytes(F.linear(x, w, b), torchs)


def test_mode_ends_when_the_body_raises_and_nests():
    x, w, _ = _inputs(4, 64, 8)
    with pytest.raises(RuntimeError, match="inside"):
        with batch_invariant():
            raise RuntimeError("inside")
    assert not kernel_align.is_batch_invariant()
    with batch_invariant():
        with batch_invariant():
            pass
        assert kernel_align.is_batch_invariant()
    assert not kernel_align.is_batch_invariant()
    set_batch_invariant(True)
    try:
        with batch_invariant():
            pass
        assert kernel_align.is_batch_invariant()
        assert _same_bytes(x @ w.T, linear(x, w))
    finally:
        set_batch_invariant(False)
    assert not kernel_align.is_batch_invariant()


def test_a_model_in_the_mode_is_batch_invariant_forward_and_backward():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(approximate="tanh"),
                                torch.nn.Linear(512, 256)).bfloat16()
    x = torch.randn(5, 3, 256).bfloat16()
    with batch_invariant():
        xb = x.clone().requires_grad_()
        yb = model(xb)
        yb.sum().backward()
        for i in range(x.shape[0]):
            xi = x[i:i + 1].clone().requires_grad_()
            yi = model(xi)
            assert _same_bytes(yi, yb[i:i + 1])
            yi.sum().backward()
            assert _same_bytes(xi.grad, xb.grad[i:i + 1])


# ---------------------------------------------------------------------------------------
# patch_linear


class _GELU(torch.nn.Module):
    """diffusers.models.activations.GELU as FeedForward(activation_fn="gelu-approximate")
    builds it."""

    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.proj = torch.nn.Linear(dim_in, dim_out)
        self.approximate = "tanh"

    def forward(self, x):
        return F.gelu(self.proj(x), approximate=self.approximate)


_GELU.__name__ = "GELU"


def test_patch_linear_fuses_gelu_and_restores():
    torch.manual_seed(1)
    model = torch.nn.Sequential(_GELU(64, 128), torch.nn.Linear(128, 64))
    x = torch.randn(3, 64)
    before = model(x)
    gelu, out = model[0], model[1]
    want = linear(linear(x, gelu.proj.weight, gelu.proj.bias, activation="gelu_tanh"), out.weight,
                  out.bias)
    with patch_linear(model) as patch:
        assert set(map(id, patch.modules)) == {id(gelu), id(gelu.proj), id(out)}
        assert _same_bytes(model(x), want)
    assert "forward" not in gelu.__dict__ and "forward" not in out.__dict__
    assert _same_bytes(model(x), before)


def test_patch_linear_fuses_a_diffusers_timestep_embedding():
    embeddings = pytest.importorskip("diffusers.models.embeddings")
    torch.manual_seed(2)
    module = embeddings.TimestepEmbedding(in_channels=256, time_embed_dim=64)
    t = torch.randn(4, 256)
    want = linear(linear(t, module.linear_1.weight, module.linear_1.bias, activation="silu"),
                  module.linear_2.weight, module.linear_2.bias)
    patch = patch_linear(module)
    try:
        assert _same_bytes(module(t), want)
    finally:
        patch.restore()
    assert "forward" not in module.__dict__
