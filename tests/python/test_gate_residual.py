"""kernel_align.adaln_gate_residual: diffusers' gated residual ``x + gate * y`` byte for
byte in diffusers mode (forward, x's and y's gradients), the gate's gradient a sum over a
sample's own tokens (so a sample's bytes do not depend on its batch, where torch's sum over
the broadcast dim may), autograd, torch.compile and opcheck work, bad arguments are errors
naming them."""

from __future__ import annotations

import pytest
import torch

import kernel_align as ka
from formulas import assert_bitwise, assert_close

OPS = torch.ops.kernel_align
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _inputs(batch, seq, dim, dtype=torch.float32, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq, dim, generator=g).to(dtype)
    gate = torch.randn(batch, dim, generator=g).to(dtype)
    y = torch.randn(batch, seq, dim, generator=g).to(dtype)
    return tuple(t.requires_grad_(grad) for t in (x, gate, y))


def _diffusers(x, gate, y):
    """QwenImageTransformerBlock: ``hidden_states + gate.unsqueeze(1) * attn_output``."""
    return x + gate.unsqueeze(1) * y


@pytest.mark.parametrize("dtype", DTYPES)
def test_diffusers_bytes_forward_and_elementwise_gradients(dtype):
    x, gate, y = _inputs(2, 300, 64, dtype, grad=True)
    out = ka.adaln_gate_residual(x, gate, y)
    theirs = _diffusers(x, gate, y)
    assert out.dtype == dtype and out.shape == x.shape
    assert_bitwise(out, theirs)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    dx, dgate, dy = torch.autograd.grad(out, (x, gate, y), dout)
    tx, tgate, ty = torch.autograd.grad(theirs, (x, gate, y), dout)
    assert_bitwise(dx, tx)
    assert_bitwise(dy, ty)
    # The gate's: a sum over 300 tokens, in the contract's blocks rather than torch's order.
    assert dgate.dtype == dtype and dgate.shape == gate.shape
    wide = (dout.double() * y.detach().double()).sum(1)
    assert_close(dgate, wide.to(dtype), "reduction_gradient")


def test_single_mode_rounds_once():
    x, gate, y = _inputs(2, 40, 32, torch.bfloat16, seed=2)
    single = ka.adaln_gate_residual(x, gate, y, mode="single")
    exact = (x.float() + gate.float().unsqueeze(1) * y.float()).to(torch.bfloat16)
    assert_bitwise(single, exact)
    assert not torch.equal(single, ka.adaln_gate_residual(x, gate, y))


def test_a_sample_alone_has_its_bytes_in_the_batch():
    x, gate, y = _inputs(3, 600, 48, torch.bfloat16, seed=5, grad=True)
    out = ka.adaln_gate_residual(x, gate, y)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    grads = torch.autograd.grad(out, (x, gate, y), dout)
    one = [t[1:2].detach().clone().requires_grad_() for t in (x, gate, y)]
    out1 = ka.adaln_gate_residual(*one)
    assert_bitwise(out1, out[1:2])
    for a, b in zip(torch.autograd.grad(out1, one, dout[1:2]), grads):
        assert_bitwise(a, b[1:2])


def test_gate_views_and_in_place_residual():
    x, gate, y = _inputs(2, 7, 16)
    out = ka.adaln_gate_residual(x, gate, y)
    assert_bitwise(ka.adaln_gate_residual(x, gate.unsqueeze(1), y), out)
    # Strided views of a packed modulation: the gate is a chunk of [B, 6D].
    mod = torch.randn(2, 6 * 16)
    chunk = mod.chunk(6, dim=-1)[5]
    assert_bitwise(ka.adaln_gate_residual(x, chunk, y), _diffusers(x, chunk, y))


def test_compile_and_opcheck():
    x, gate, y = _inputs(2, 10, 16, grad=True)
    eager = ka.adaln_gate_residual(x, gate, y)
    eager_grads = torch.autograd.grad(eager.sum(), (x, gate, y))
    compiled = torch.compile(ka.adaln_gate_residual, fullgraph=True)
    out = compiled(x, gate, y)
    assert_bitwise(out, eager)
    for a, b in zip(torch.autograd.grad(out.sum(), (x, gate, y)), eager_grads):
        assert_bitwise(a, b)
    torch.library.opcheck(OPS.adaln_gate_residual, (x, gate, y, "diffusers"))
    torch.library.opcheck(OPS.adaln_gate_residual_backward,
                          (gate.detach(), y.detach(), torch.ones_like(eager), "single"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_out_gives_the_allocating_bytes(dtype):
    """out= writes the allocating call's bytes into the tensor given (of any strides, or x
    or y itself: in place) and returns it; a wrong shape is named, and an argument that
    requires grad is refused before anything is written."""
    x, gate, y = _inputs(2, 40, 24, dtype)
    want = ka.adaln_gate_residual(x, gate, y)
    out = torch.empty(2, 24, 40, dtype=dtype).transpose(1, 2)
    assert ka.adaln_gate_residual(x, gate, y, out=out) is out
    assert_bitwise(out, want)
    for written in ("x", "y"):
        x2, y2 = x.clone(), y.clone()
        target = x2 if written == "x" else y2
        ka.adaln_gate_residual(x2, gate, y2, out=target)
        assert_bitwise(target, want)
    with pytest.raises(ValueError, match="argument 'out': expected shape"):
        ka.adaln_gate_residual(x, gate, y, out=torch.empty(2, 40, 23, dtype=dtype))
    poisoned = torch.full_like(x, 7.0)
    with pytest.raises(RuntimeError, match="requires grad"):
        ka.adaln_gate_residual(x.clone().requires_grad_(), gate, y, out=poisoned)
    assert bool((poisoned == 7.0).all())
    torch.library.opcheck(OPS.adaln_gate_residual_out,
                          (x, gate, y, "diffusers", torch.empty_like(x)))


def test_double_backward_raises():
    x, gate, y = _inputs(1, 5, 8, grad=True)
    out = ka.adaln_gate_residual(x, gate, y)
    grads = torch.autograd.grad(out.sum(), (x, gate, y), create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        torch.autograd.grad(grads[1].sum(), (x, gate, y))


def test_bad_arguments_name_them():
    x, gate, y = _inputs(2, 6, 8)
    with pytest.raises(ValueError, match=r"argument 'x': expected rank 3 \(\[B, S, D\]\)"):
        ka.adaln_gate_residual(x[0], gate, y)
    with pytest.raises(ValueError, match=r"argument 'gate': expected shape \[2, 8\] or "
                                         r"\[2, 1, 8\] \(B and D of x\), found shape \[2, 9\]"):
        ka.adaln_gate_residual(x, torch.zeros(2, 9), y)
    with pytest.raises(ValueError, match="argument 'y'"):
        ka.adaln_gate_residual(x, gate, y[:, :5])
    with pytest.raises(ValueError, match="argument 'mode'"):
        ka.adaln_gate_residual(x, gate, y, mode="fast")
    with pytest.raises(TypeError, match="argument 'gate': expected a torch.Tensor"):
        ka.adaln_gate_residual(x, [1.0] * 8, y)


def test_padded_tokens_with_zero_gradients_leave_the_sums_as_alone():
    """A text stream padded in a batch: its padded tokens' upstream gradients are zeros (a
    masked token feeds no other token), so their terms in the sums over the sample's tokens
    are zeros and dgate, dscale and dshift equal the unpadded sample's, byte for byte, for
    any padding (contract sections 12 and 13)."""
    valid, padded, dim = 20, 300, 32
    x, gate, y = _inputs(1, padded, dim, torch.bfloat16, seed=8)
    scale, shift = (0.1 * torch.randn(2, 1, dim)).to(torch.bfloat16).unbind(0)
    dout = torch.randn(1, padded, dim, generator=torch.Generator().manual_seed(9))
    dout = dout.to(torch.bfloat16)
    dout[:, valid:] = 0

    def sums(tokens):
        """dgate, dscale and dshift over the first `tokens` tokens."""
        xs, ys = (t[:, :tokens].clone().requires_grad_() for t in (x, y))
        g, sc, sh = (t.clone().requires_grad_() for t in (gate, scale, shift))
        d = dout[:, :tokens]
        dgate, = torch.autograd.grad(ka.adaln_gate_residual(xs, g, ys), (g,), d)
        dscale, dshift = torch.autograd.grad(ka.adaln_modulation(xs, sc, sh), (sc, sh), d)
        return dgate, dscale, dshift

    for a, b in zip(sums(padded), sums(valid)):
        assert_bitwise(a, b)
