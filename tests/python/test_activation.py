"""kernel_align.activation: the contract's silu and tanh-GELU elementwise (the functions of
linear's fused activations), close to torch's, an element's bytes independent of the batch,
autograd, torch.compile and opcheck, F.silu routed to it in the batch-invariant mode, bad
arguments errors naming them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernel_align as ka
from formulas import assert_bitwise, assert_close

OPS = torch.ops.kernel_align
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TORCH = {"silu": F.silu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
         "none": lambda x: x}


def _x(shape, dtype=torch.float32, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    return (4 * torch.randn(shape, generator=g)).to(dtype).requires_grad_(grad)


@pytest.mark.parametrize("kind", sorted(TORCH))
@pytest.mark.parametrize("dtype", DTYPES)
def test_close_to_torch_forward_and_backward(kind, dtype):
    x = _x((3, 5, 64), dtype, grad=True)
    ours = ka.activation(x, kind)
    assert ours.dtype == dtype and ours.shape == x.shape
    theirs = TORCH[kind](x.float())
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(ours.float(), theirs, rtol=tolerance, atol=tolerance)
    if kind == "none":
        assert_bitwise(ours, x)
        return
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    (dx,) = torch.autograd.grad(ours, x, dy)
    (want,) = torch.autograd.grad(theirs, x, dy.float())
    torch.testing.assert_close(dx.float(), want.float(), rtol=tolerance, atol=tolerance)
    assert_bitwise(dx, OPS.activation_backward(x.detach(), dy, kind))


def test_an_elements_bytes_do_not_depend_on_the_batch():
    x = _x((7, 3072), torch.bfloat16)
    batch = ka.activation(x)
    for i in range(7):
        assert_bitwise(batch[i:i + 1], ka.activation(x[i:i + 1].clone()))


def test_batch_invariant_mode_routes_silu():
    x = _x((4, 96), grad=True)
    with ka.batch_invariant():
        y = F.silu(x)
        (dx,) = torch.autograd.grad(y.sum(), x)
    assert_bitwise(y, ka.activation(x.detach()))
    assert_bitwise(dx, OPS.activation_backward(x.detach(), torch.ones_like(x), "silu"))
    # Outside the mode F.silu is torch's own again.
    assert_bitwise(F.silu(x.detach()), torch.ops.aten.silu(x.detach()))


def test_compile_and_opcheck():
    x = _x((2, 10, 16), grad=True)
    eager = ka.activation(x, "gelu_tanh")
    (eager_grad,) = torch.autograd.grad(eager.sum(), x)
    compiled = torch.compile(lambda t: ka.activation(t, "gelu_tanh"), fullgraph=True)
    out = compiled(x)
    assert_bitwise(out, eager)
    assert_bitwise(torch.autograd.grad(out.sum(), x)[0], eager_grad)
    torch.library.opcheck(OPS.activation, (x, "silu"))
    torch.library.opcheck(OPS.activation_backward, (x.detach(), torch.ones_like(eager), "silu"))


def test_double_backward_raises():
    x = _x((1, 8), grad=True)
    (g,) = torch.autograd.grad(ka.activation(x).sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        torch.autograd.grad(g.sum(), x)


def test_bad_arguments_name_them():
    with pytest.raises(ValueError, match="argument 'activation'"):
        ka.activation(_x((2, 4)), "relu")
    with pytest.raises(TypeError, match="argument 'kind'"):
        ka.activation(_x((2, 4)), 1)
    with pytest.raises(TypeError, match="argument 'x'"):
        ka.activation([1.0, 2.0])
    with pytest.raises(ValueError, match="argument 'x'"):
        ka.activation(torch.zeros(1, 1, 1, 1, 2))
