"""kernel_align.attention: torch's attention within the contract's tolerance classes, a
sample's bytes do not depend on the padding around it (forward and backward), autograd,
torch.compile and opcheck work, bad arguments are errors naming them, and the
batch-invariant mode routes F.scaled_dot_product_attention on the CPU to the op (bytes
equal, forward and backward) and refuses what it cannot compute."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

import kernel_align as ka
from formulas import assert_bitwise, assert_close

OPS = torch.ops.kernel_align
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _qkv(shape, dtype=torch.float32, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=g).to(dtype).requires_grad_(grad)
                 for _ in range(3))


def _sdpa_bshd(q, k, v, mask):
    """torch's attention of [B, S, H, D] tensors, keys masked; masked queries' rows 0."""
    attn_mask = None if mask is None else mask[:, None, None, :]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=attn_mask).transpose(1, 2)
    return out if mask is None else out * mask[:, :, None, None]


@pytest.mark.parametrize("dtype", DTYPES)
def test_close_to_torch_forward_and_backward(dtype):
    q, k, v = _qkv((2, 40, 3, 64), dtype, grad=True)
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, 29:] = False
    mask[0, 3:7] = False
    out = ka.attention(q, k, v, mask)
    assert out.dtype == dtype and out.shape == q.shape
    theirs = _sdpa_bshd(q, k, v, mask)
    assert_close(out, theirs, "reduction_forward")
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    ours = torch.autograd.grad(out, (q, k, v), dout)
    expected = torch.autograd.grad(theirs, (q, k, v), dout)
    for a, b in zip(ours, expected):
        assert_close(a, b, "reduction_gradient")


def test_masked_rows_and_empty_samples_are_zero():
    q, k, v = _qkv((2, 9, 2, 8))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0] = False
    mask[1, 4] = False
    out = ka.attention(q, k, v, mask)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert torch.equal(out[1, 4], torch.zeros_like(out[1, 4]))
    assert not torch.signbit(out[0]).any()
    assert out[1, 5].abs().sum() > 0


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_padding_changes_no_byte_of_a_sample(dtype):
    """Prompts of 25 and 17 text tokens padded to 25 in one batch with the image tokens
    after them (diffusers' joint [text, image] order): sample 1's rows and gradients equal
    those of the sample alone with its own 17 text tokens."""
    text, image, heads, dim = 25, 48, 2, 64
    q, k, v = _qkv((2, text + image, heads, dim), dtype, seed=3)
    mask = torch.ones(2, text + image, dtype=torch.bool)
    mask[1, 17:text] = False
    keep = mask[1]
    alone = [t[1:2, keep].clone().requires_grad_() for t in (q, k, v)]
    batch = [t.clone().requires_grad_() for t in (q, k, v)]
    dout = torch.randn(2, text + image, heads, dim,
                       generator=torch.Generator().manual_seed(4)).to(dtype)
    out_batch = ka.attention(*batch, mask)
    out_alone = ka.attention(*alone)
    assert_bitwise(out_batch[1:2, keep], out_alone)
    grads_batch = torch.autograd.grad(out_batch, batch, dout)
    grads_alone = torch.autograd.grad(out_alone, alone, dout[1:2, keep])
    for g_batch, g_alone in zip(grads_batch, grads_alone):
        assert_bitwise(g_batch[1:2, keep], g_alone)
        assert torch.equal(g_batch[1, ~keep], torch.zeros_like(g_batch[1, ~keep]))


def test_bhsd_layout_is_the_transposed_bshd():
    q, k, v = _qkv((2, 11, 3, 16))
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[0, 8:] = False
    bshd = ka.attention(q, k, v, mask)
    bhsd = ka.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask,
                        layout="bhsd")
    assert_bitwise(bhsd.transpose(1, 2), bshd)


def test_compile_and_opcheck():
    q, k, v = _qkv((2, 10, 2, 16), grad=True)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 6:] = False
    eager = ka.attention(q, k, v, mask)
    eager_grads = torch.autograd.grad(eager.sum(), (q, k, v))
    compiled = torch.compile(lambda a, b, c: ka.attention(a, b, c, mask), fullgraph=True)
    out = compiled(q, k, v)
    assert_bitwise(out, eager)
    for a, b in zip(torch.autograd.grad(out.sum(), (q, k, v)), eager_grads):
        assert_bitwise(a, b)
    torch.library.opcheck(OPS.attention, (q, k, v, mask, "bshd"))
    torch.library.opcheck(OPS.attention_backward,
                          (q.detach(), k.detach(), v.detach(), mask, eager.detach(),
                           torch.ones_like(eager), "bshd"))


def test_double_backward_raises():
    q, k, v = _qkv((1, 5, 1, 8), grad=True)
    out = ka.attention(q, k, v)
    grads = torch.autograd.grad(out.sum(), (q, k, v), create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        torch.autograd.grad(grads[0].sum(), (q, k, v))


def test_bad_arguments_name_them():
    q, k, v = _qkv((2, 6, 2, 8))
    with pytest.raises(TypeError, match="argument 'mask': expected dtype torch.bool"):
        ka.attention(q, k, v, torch.ones(2, 6))
    with pytest.raises(ValueError, match="argument 'mask': expected shape \\[2, 6\\]"):
        ka.attention(q, k, v, torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="argument 'k': expected shape \\[2, 6, 2, 8\\]"):
        ka.attention(q, k[:, :5], v)
    with pytest.raises(ValueError, match="argument 'q': expected rank 4"):
        ka.attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="argument 'layout': expected one of bshd, bhsd"):
        ka.attention(q, k, v, layout="sbhd")
    with pytest.raises(TypeError, match="argument 'v': expected a torch.Tensor"):
        ka.attention(q, k, [1.0])


def test_batch_invariant_routes_sdpa_on_the_cpu():
    q, k, v = _qkv((2, 3, 12, 16), grad=True)  # [B, H, S, D]
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 8:] = False
    for attn_mask in (mask[:, None, None, :],
                      torch.zeros(2, 1, 1, 12).masked_fill(~mask[:, None, None, :],
                                                           float("-inf"))):
        with ka.batch_invariant():
            routed = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
            routed_grads = torch.autograd.grad(routed.sum(), (q, k, v))
        ours = ka.attention(q, k, v, mask, layout="bhsd")
        assert_bitwise(routed, ours)
        for a, b in zip(routed_grads, torch.autograd.grad(ours.sum(), (q, k, v))):
            assert_bitwise(a, b)
    with ka.batch_invariant():
        assert_bitwise(F.scaled_dot_product_attention(q, k, v),
                       ka.attention(q, k, v, layout="bhsd"))


def test_batch_invariant_routes_the_composite_sdpa_as_on_cuda(monkeypatch):
    """The registration CUDA gets (F.scaled_dot_product_attention itself, on its autograd
    and backend keys, before aten picks a kernel), made on the CPU's keys: the routed call
    and its gradients are kernel_align.attention's; leaving the mode undoes it; GQA is
    refused by name."""
    module = importlib.import_module("kernel_align.batch_invariant")
    monkeypatch.setattr(module, "_SDPA_KEYS", ("AutogradCPU", "CPU"))
    monkeypatch.setattr(module, "_CPU_OVERRIDES", {})
    q, k, v = _qkv((2, 3, 12, 16), grad=True)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 8:] = False
    with ka.batch_invariant():
        routed = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        routed_grads = torch.autograd.grad(routed.sum(), (q, k, v))
        with pytest.raises(NotImplementedError, match="argument 'enable_gqa'"):
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    ours = ka.attention(q, k, v, mask, layout="bhsd")
    assert_bitwise(routed, ours)
    for a, b in zip(routed_grads, torch.autograd.grad(ours.sum(), (q, k, v))):
        assert_bitwise(a, b)
    # Outside the mode: torch's own (its masked rows attend to the valid keys).
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
    assert not torch.equal(theirs[1, :, 8:], ours[1, :, 8:])


@pytest.mark.parametrize("kwargs, argument", [
    ({"is_causal": True}, "is_causal"),
    ({"scale": 0.5}, "scale"),
    ({"attn_mask": torch.ones(12, 12, dtype=torch.bool)}, "attn_mask"),
    ({"attn_mask": torch.full((2, 1, 1, 12), 0.5)}, "attn_mask"),
])
def test_batch_invariant_refuses_what_attention_is_not(kwargs, argument):
    q, k, v = _qkv((2, 3, 12, 16))
    with ka.batch_invariant():
        with pytest.raises(NotImplementedError, match=f"argument '{argument}'"):
            F.scaled_dot_product_attention(q, k, v, **kwargs)
