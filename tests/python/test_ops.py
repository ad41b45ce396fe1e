"""The seed's CPU tests, ported: bitwise equality with independently written fp32
formulas (formulas.py), per-head independence, the RoPE round trip, batch invariance,
the explicit fp32 VJP, the issue's shapes end to end, and the backend switch.

RMSNorm is compared bitwise with a torch formula that sums squares in the contract's
16-lane order (formulas.rstd_tree); against torch's own ``mean`` (the seed's formula,
whose order depends on the shape and ISA) rstd is within two ulps (the sums differ by up
to 3 ulps) and about 80% of rows are bitwise equal, see test_rmsnorm_vs_torch_mean; in
bf16/fp16 the outputs are within one ulp per rounding of that formula's, see
test_rmsnorm_vs_torch_mean_in_model_dtypes. RoPE is compared bitwise with tables from our
builder.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import kernel_align as ka
from formulas import (assert_bitwise, assert_close, norm_rope, rmsnorm, rmsnorm_backward, rope,
                      rstd_of_mean, rstd_torch_mean, rstd_tree, ulp_distance)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
LAYOUTS = ["bshd", "bhsd"]
PAIRINGS = ["interleaved", "half"]
MODES = ["single", "diffusers"]


def randn(*shape, dtype=torch.float32, generator=None):
    return torch.randn(*shape, generator=generator).to(dtype)


def tables(seq, text_len=0):
    """Tables of diffusers' positions: text_len text tokens and a one-row image grid."""
    return ka.rope_tables(ka.qwen_image_rope_positions([(1, 1, seq - text_len)], text_len))


def make_qk(layout, b, s, h, d, dtype, generator):
    shape = (b, s, h, d) if layout == "bshd" else (b, h, s, d)
    return randn(*shape, dtype=dtype, generator=generator)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("weight_dtype", [None, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [128, 40])
def test_rmsnorm_bitwise_vs_formula(dtype, mode, weight_dtype, d, generator):
    x = randn(3, 5, 4, d, dtype=dtype, generator=generator) * 3
    w = None if weight_dtype is None else randn(d, dtype=weight_dtype, generator=generator)
    assert_bitwise(ka.qk_rmsnorm(x, w, mode=mode), rmsnorm(x, w, mode))
    assert_bitwise(ka.qk_rmsnorm(x, w, mode=mode, out_dtype=torch.float32),
                   rmsnorm(x, w, mode, out_dtype=torch.float32))


def test_rmsnorm_vs_torch_mean(generator):
    """torch's ``mean`` sums the squares in another order (its sum differs from the
    contract's by up to a few ulps): the rstd it leads to is within two ulps of ours, and
    the rows where the two agree (most of them) are bitwise equal. The same holds for the
    seed's whole formula (``rsqrt`` of that mean); its outputs are within the reduction
    forward class."""
    x = randn(64, 24, 128, generator=generator)
    ours = rstd_tree(x)
    theirs = rstd_of_mean(x.pow(2).mean(-1, keepdim=True))
    assert ulp_distance(ours, theirs).max().item() <= 2
    agree = (ours == theirs).squeeze(-1)
    assert agree.float().mean().item() > 0.5
    y = ka.qk_rmsnorm(x)
    assert_bitwise(y[agree], (x * theirs)[agree])
    seed = rstd_torch_mean(x)
    assert ulp_distance(ours, seed).max().item() <= 2
    assert_close(y, x * seed, "reduction_forward")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("weight", ["none", "fp32", "activation dtype"])
def test_rmsnorm_vs_torch_mean_in_model_dtypes(dtype, mode, weight, generator):
    """In bf16 and fp16, with the weight in fp32 or the activations' dtype, the one-ulp
    claim against torch's own ``mean`` holds per rounding: the seed's formula with
    torch's mean and rsqrt (an rstd a few fp32 ulps from ours) lands within one ulp of
    our output where the op rounds once, and within two where diffusers mode rounds
    twice (through the weight's dtype, then the output's)."""
    x = randn(64, 24, 128, dtype=dtype, generator=generator) * 3
    weight_dtype = {"none": None, "fp32": torch.float32, "activation dtype": dtype}[weight]
    w = None if weight_dtype is None else randn(128, dtype=weight_dtype, generator=generator)
    ours = ka.qk_rmsnorm(x, w, mode=mode)
    theirs = rmsnorm(x, w, mode, rstd=rstd_torch_mean(x))
    roundings = 2 if mode == "diffusers" and weight_dtype == dtype else 1
    assert ulp_distance(ours, theirs).max().item() <= roundings


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pairing", PAIRINGS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_rope_bitwise_vs_formula(dtype, pairing, layout, generator):
    cos, sin = tables(37, text_len=5)
    x = make_qk(layout, 2, 37, 3, 128, dtype, generator) * 4
    assert_bitwise(ka.multi_axis_rope(x, cos, sin, pairing=pairing, layout=layout),
                   rope(x, cos, sin, pairing, layout))
    dx = torch.ops.kernel_align.multi_axis_rope_backward(x, cos, sin, pairing, layout)
    assert_bitwise(dx, rope(x, cos, sin, pairing, layout, transpose=True))


@pytest.mark.parametrize("dtype,out_dtype", [(torch.bfloat16, None), (torch.float16, None),
                                             (torch.float32, None),
                                             (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("pairing,layout", list(itertools.product(PAIRINGS, LAYOUTS)))
def test_fused_equals_unfused(dtype, out_dtype, mode, pairing, layout, generator):
    text_len, s = 6, 30
    cos, sin = tables(s, text_len)
    q = make_qk(layout, 2, s, 4, 128, dtype, generator)
    k = make_qk(layout, 2, s, 2, 128, dtype, generator)
    w = [randn(128, dtype=torch.bfloat16, generator=generator) for _ in range(4)]
    q_out, k_out = ka.qk_norm_rope(q, k, cos, sin, text_len=text_len, text_q_weight=w[0],
                                   text_k_weight=w[1], image_q_weight=w[2], image_k_weight=w[3],
                                   mode=mode, pairing=pairing, layout=layout, out_dtype=out_dtype)
    assert_bitwise(q_out, norm_rope(q, w[0], w[2], cos, sin, text_len, mode, pairing, layout,
                                    out_dtype))
    assert_bitwise(k_out, norm_rope(k, w[1], w[3], cos, sin, text_len, mode, pairing, layout,
                                    out_dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("leading", [(5, 7), (3, 200)])  # one dw block; 600 rows: 256, 256, 88
def test_rmsnorm_backward_bitwise_vs_formula(dtype, mode, leading, generator):
    x = randn(*leading, 128, dtype=dtype, generator=generator)
    dy = randn(*leading, 128, dtype=dtype, generator=generator)
    w = randn(128, dtype=torch.bfloat16, generator=generator)
    dx, dw = torch.ops.kernel_align.qk_rmsnorm_backward(x, dy, w, 1e-6, mode, True)
    expected_dx, expected_dw = rmsnorm_backward(x, dy, w, mode)
    assert_bitwise(dx, expected_dx)
    assert_bitwise(dw, expected_dw)


def test_per_head_independence(generator):
    """A head's output depends on that head's input only (norm per head, rotation per
    pair), for every op and in both layouts."""
    cos, sin = tables(20, 4)
    w = randn(128, generator=generator)
    for layout in LAYOUTS:
        head_dim = 2 if layout == "bshd" else 1
        q = make_qk(layout, 2, 20, 4, 128, torch.bfloat16, generator)
        changed = q.clone()
        changed.select(head_dim, 0).copy_(torch.randn_like(changed.select(head_dim, 0).float()))
        for fn in (lambda t: ka.qk_rmsnorm(t, w),
                   lambda t: ka.multi_axis_rope(t, cos, sin, layout=layout),
                   lambda t: ka.qk_norm_rope(t, t, cos, sin, text_len=4, image_q_weight=w,
                                             layout=layout)[0]):
            a, b = fn(q), fn(changed)
            assert_bitwise(a.narrow(head_dim, 1, 3), b.narrow(head_dim, 1, 3))
            assert not torch.equal(a.select(head_dim, 0), b.select(head_dim, 0))


@pytest.mark.parametrize("pairing", PAIRINGS)
def test_rope_round_trip(pairing, generator):
    """The backward is the transpose rotation: backward(forward(x)) is x up to fp32
    rounding (elementwise class), and forward(backward(x)) likewise."""
    cos, sin = tables(50, 10)
    x = randn(2, 50, 3, 128, generator=generator)
    y = ka.multi_axis_rope(x, cos, sin, pairing=pairing)
    back = torch.ops.kernel_align.multi_axis_rope_backward(y, cos, sin, pairing, "bshd")
    assert_close(back, x, "elementwise")
    assert not torch.equal(y, x)


def _batch_invariance_ops(cos, sin, w):
    return {
        "qk_rmsnorm": lambda t: ka.qk_rmsnorm(t, w, mode="diffusers"),
        "multi_axis_rope": lambda t: ka.multi_axis_rope(t, cos, sin),
        "qk_norm_rope": lambda t: ka.qk_norm_rope(t, t, cos, sin, text_len=8,
                                                  image_q_weight=w, text_k_weight=w)[1],
        "qk_rmsnorm_backward_dx": lambda t: torch.ops.kernel_align.qk_rmsnorm_backward(
            t, t * 0.5, w, 1e-6, "diffusers", False)[0],
        "multi_axis_rope_backward": lambda t: torch.ops.kernel_align.multi_axis_rope_backward(
            t, cos, sin, "interleaved", "bshd"),
    }


@pytest.mark.parametrize("threads", [1, 2])
def test_batch_invariance(threads, generator):
    """A sample's bytes are the same alone and at any index of a batch of 4 whose other
    samples differ, whatever the thread count."""
    ka.set_num_threads(threads)
    cos, sin = tables(40, 8)
    w = randn(128, dtype=torch.bfloat16, generator=generator)
    sample = randn(1, 40, 6, 128, dtype=torch.bfloat16, generator=generator)
    for name, fn in _batch_invariance_ops(cos, sin, w).items():
        alone = fn(sample)
        for index in range(4):
            batch = randn(4, 40, 6, 128, dtype=torch.bfloat16, generator=generator)
            batch[index] = sample[0]
            assert_bitwise(fn(batch)[index:index + 1], alone), name


@pytest.mark.parametrize("weighted", [False, True])
def test_explicit_vjp_vs_autograd(weighted, generator):
    """The seed's explicit fp32 VJP ``dx = rstd*g - x*rstd^3*sum(g*x)/D`` (g = dy*w) and
    ``dw = sum_rows dy*x*rstd`` agree with torch autograd of the fp32 forward formula
    (reduction gradient class), and our backward op equals the explicit VJP bitwise."""
    x = randn(6, 9, 128, generator=generator).requires_grad_()
    dy = randn(6, 9, 128, generator=generator)
    w = randn(128, generator=generator).requires_grad_() if weighted else None
    y = x * rstd_torch_mean(x)
    if weighted:
        y = y * w
    grads = torch.autograd.grad(y, [x] + ([w] if weighted else []), dy)
    expected_dx, expected_dw = rmsnorm_backward(x.detach(), dy,
                                                w.detach() if weighted else None)
    assert_close(expected_dx, grads[0], "reduction_gradient")
    if weighted:
        assert_close(expected_dw, grads[1], "reduction_gradient")
    dx, dw = torch.ops.kernel_align.qk_rmsnorm_backward(
        x.detach(), dy, None if w is None else w.detach(), 1e-6, "single", weighted)
    assert_bitwise(dx, expected_dx)
    if weighted:
        assert_bitwise(dw, expected_dw)


# (width, height) in pixels -> token grid (height, width): 16 pixels per token side.
ISSUE_IMAGES = {"1024x1024": (64, 64), "1328x1328": (83, 83), "1664x928": (58, 104)}


@pytest.mark.parametrize("image", ISSUE_IMAGES)
def test_issue_shapes_end_to_end(image, generator):
    """B=1, H=24, D=128, 256 text tokens and the image's tokens: diffusers positions,
    tables, fused norm+RoPE in bf16 with four weights, bitwise equal to the unfused fp32
    formulas; and the same bytes alone and in a batch of 2."""
    width_px, height_px = (int(v) for v in image.split("x"))
    grid_h, grid_w = ISSUE_IMAGES[image]
    assert (grid_h, grid_w) == (height_px // 16, width_px // 16)
    text_len = 256
    pos = ka.qwen_image_rope_positions([[(1, grid_h, grid_w)]], text_len)
    s = text_len + grid_h * grid_w
    assert pos.shape == (s, 3)
    cos, sin = ka.rope_tables(pos)
    q = randn(1, s, 24, 128, dtype=torch.bfloat16, generator=generator)
    k = randn(1, s, 24, 128, dtype=torch.bfloat16, generator=generator)
    w = [randn(128, dtype=torch.bfloat16, generator=generator) for _ in range(4)]
    kwargs = dict(text_len=text_len, text_q_weight=w[0], text_k_weight=w[1],
                  image_q_weight=w[2], image_k_weight=w[3])
    q_out, k_out = ka.qk_norm_rope(q, k, cos, sin, **kwargs)
    assert_bitwise(q_out, norm_rope(q, w[0], w[2], cos, sin, text_len))
    assert_bitwise(k_out, norm_rope(k, w[1], w[3], cos, sin, text_len))
    q_batch = torch.cat([torch.randn_like(q), q])
    assert_bitwise(ka.qk_norm_rope(q_batch, torch.cat([k, k]), cos, sin, **kwargs)[0][1:], q_out)


def test_backends_give_identical_bytes(generator):
    """set_backend("reference") (the scalar reference) and "simd" (SIMD paths, threads)
    produce the same bytes for every op, forward and backward, and each call reports the
    backend that ran it."""
    cos, sin = tables(33, 7)
    q = randn(2, 33, 4, 128, dtype=torch.bfloat16, generator=generator)
    k = randn(2, 33, 2, 128, dtype=torch.bfloat16, generator=generator)
    w = [randn(128, dtype=torch.bfloat16, generator=generator) for _ in range(4)]
    dq = torch.randn_like(q)
    dk = torch.randn_like(k)

    def run_all():
        rope_ops = torch.ops.kernel_align
        return [
            ka.qk_rmsnorm(q, w[0], mode="diffusers"),
            *rope_ops.qk_rmsnorm_backward(q, dq, w[0], 1e-6, "diffusers", True),
            ka.multi_axis_rope(q, cos, sin, pairing="half"),
            rope_ops.multi_axis_rope_backward(dq, cos, sin, "interleaved", "bshd"),
            *ka.qk_norm_rope(q, k, cos, sin, text_len=7, text_q_weight=w[0], text_k_weight=w[1],
                             image_q_weight=w[2], image_k_weight=w[3]),
            *rope_ops.qk_norm_rope_backward(q, k, dq, dk, *w, cos, sin, 7, 1e-6, "diffusers",
                                            "interleaved", "bshd", [True] * 4),
        ]

    assert set(ka.backends()) >= {"simd", "reference"}
    ka.set_backend("reference")
    assert ka.get_backend() == "reference"
    reference = run_all()
    assert ka.last_call().backend == "reference"
    ka.set_backend("simd")
    simd = run_all()
    assert ka.last_call().backend == "simd"
    ka.set_backend(None)
    assert ka.get_backend() is None
    for ours, theirs in zip(simd, reference, strict=True):
        assert_bitwise(ours, theirs)


def test_strided_views_are_read_in_place(generator):
    """Permuted, sliced and expanded views give the bytes of their contiguous copies;
    the in-place ops write into the caller's storage."""
    cos, sin = tables(24, 4)
    base = randn(2, 4, 30, 128, dtype=torch.bfloat16, generator=generator)
    view = base.transpose(1, 2)[:, 3:27]  # bshd view of a bhsd buffer, sliced in S
    assert not view.is_contiguous()
    w = randn(128, generator=generator)
    assert_bitwise(ka.multi_axis_rope(view, cos, sin), ka.multi_axis_rope(view.contiguous(), cos,
                                                                          sin))
    assert_bitwise(ka.qk_rmsnorm(view, w), ka.qk_rmsnorm(view.contiguous(), w))
    expanded = randn(1, 24, 1, 128, generator=generator).expand(3, 24, 5, 128)
    assert_bitwise(ka.multi_axis_rope(expanded, cos, sin),
                   ka.multi_axis_rope(expanded.contiguous(), cos, sin))

    expected = ka.multi_axis_rope(view, cos, sin)
    pointer = view.data_ptr()
    assert ka.multi_axis_rope_(view, cos, sin) is view
    assert view.data_ptr() == pointer
    assert_bitwise(view, expected)

    q, k = view.clone(), view.clone()
    expected_q, expected_k = ka.qk_norm_rope(q, k, cos, sin, text_len=4, image_q_weight=w)
    ka.qk_norm_rope_(q, k, cos, sin, text_len=4, image_q_weight=w)
    assert_bitwise(q, expected_q)
    assert_bitwise(k, expected_k)
