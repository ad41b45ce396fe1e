"""out= variants (issue 36): the result written into a given tensor, byte for byte the
allocating call's, validated like any output (shape, dtype, device, overlap), never
recorded by autograd (torch's rule for out= functions), the out tensor's version bumped."""

from __future__ import annotations

import pytest
import torch

import kernel_align as ka

OPS = torch.ops.kernel_align
B, S, H, D, TEXT = 2, 6, 3, 128, 2


@pytest.fixture
def generator():
    return torch.Generator().manual_seed(36)


@pytest.fixture
def tables():
    return ka.rope_tables(ka.qwen_image_positions(TEXT, 2, 2), [16, 56, 56])


def rand(*shape, generator, dtype=torch.float32):
    return torch.randn(*shape, generator=generator).to(dtype)


def weights(generator):
    return {name: 1 + 0.1 * rand(D, generator=generator)
            for name in ("text_q_weight", "text_k_weight", "image_q_weight", "image_k_weight")}


@pytest.mark.parametrize("dtype, out_dtype", [(torch.float32, torch.float32),
                                              (torch.bfloat16, torch.bfloat16),
                                              (torch.float32, torch.bfloat16),
                                              (torch.float16, torch.float32)])
def test_qk_rmsnorm_out_gives_the_allocating_bytes(generator, dtype, out_dtype):
    x = rand(B, S, H, D, generator=generator, dtype=dtype)
    w = 1 + 0.1 * rand(D, generator=generator)
    want = ka.qk_rmsnorm(x, w, out_dtype=out_dtype)
    # A strided out: a permuted view of a larger buffer.
    buffer = torch.full((S, B, H, D + 2), float("nan"), dtype=out_dtype)
    out = buffer[..., :D].permute(1, 0, 2, 3)
    version = out._version
    assert ka.qk_rmsnorm(x, w, out=out) is out
    assert torch.equal(out, want)
    assert out._version == version + 1
    assert buffer[..., D:].isnan().all()  # nothing written outside the view
    # out_dtype may be given when it is out's.
    ka.qk_rmsnorm(x, w, out_dtype=out_dtype, out=out.zero_())
    assert torch.equal(out, want)


def test_multi_axis_rope_out_gives_the_allocating_bytes(generator, tables):
    cos, sin = tables
    for layout, x in (("bshd", rand(B, S, H, D, generator=generator, dtype=torch.bfloat16)),
                      ("bhsd", rand(B, H, S, D, generator=generator))):
        for pairing in ("interleaved", "half"):
            want = ka.multi_axis_rope(x, cos, sin, pairing=pairing, layout=layout)
            out = torch.empty_like(x)
            assert ka.multi_axis_rope(x, cos, sin, pairing=pairing, layout=layout, out=out) is out
            assert torch.equal(out, want)


def test_qk_norm_rope_out_gives_the_allocating_bytes(generator, tables):
    cos, sin = tables
    q = rand(B, S, H, D, generator=generator, dtype=torch.bfloat16)
    k = rand(B, S, 1, D, generator=generator)
    w = weights(generator)
    for out_dtype in (None, torch.float32):
        want = ka.qk_norm_rope(q, k, cos, sin, text_len=TEXT, **w, out_dtype=out_dtype)
        out = (torch.empty_like(want[0]), torch.empty_like(want[1]))
        got = ka.qk_norm_rope(q, k, cos, sin, text_len=TEXT, **w, out_dtype=out_dtype, out=out)
        assert got[0] is out[0] and got[1] is out[1]
        assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])


def test_backward_out_ops_give_the_allocating_bytes(generator, tables):
    cos, sin = tables
    x = rand(B, S, H, D, generator=generator)
    dy = rand(B, S, H, D, generator=generator)
    w = 1 + 0.1 * rand(D, generator=generator)
    for compute_dw in (True, False):
        dx_want, dw_want = OPS.qk_rmsnorm_backward(x, dy, w, 1e-6, "single", compute_dw)
        dx, dw = torch.empty_like(x), torch.empty_like(w) if compute_dw else None
        OPS.qk_rmsnorm_backward_out(x, dy, w, 1e-6, "single", dx, dw)
        assert torch.equal(dx, dx_want)
        assert dw is None or torch.equal(dw, dw_want)

    dx = torch.empty_like(dy)
    OPS.multi_axis_rope_backward_out(dy, cos, sin, "interleaved", "bshd", dx)
    assert torch.equal(dx, OPS.multi_axis_rope_backward(dy, cos, sin, "interleaved", "bshd"))

    q, k = rand(B, S, H, D, generator=generator), rand(B, S, H, D, generator=generator)
    dq_out, dk_out = rand(B, S, H, D, generator=generator), rand(B, S, H, D, generator=generator)
    ws = list(weights(generator).values())
    compute_dw = [True, False, True, True]
    want = OPS.qk_norm_rope_backward(q, k, dq_out, dk_out, *ws, cos, sin, TEXT, 1e-6,
                                     "diffusers", "interleaved", "bshd", compute_dw)
    dws = [torch.empty_like(w) if c else None for w, c in zip(ws, compute_dw)]
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    OPS.qk_norm_rope_backward_out(q, k, dq_out, dk_out, *ws, cos, sin, TEXT, 1e-6, "diffusers",
                                  "interleaved", "bshd", dq, dk, *dws)
    assert torch.equal(dq, want[0]) and torch.equal(dk, want[1])
    for got, expected in zip(dws, want[2:]):
        assert got is None or torch.equal(got, expected)


def test_bad_out_tensors_are_refused_and_left_untouched(generator, tables):
    cos, sin = tables
    x = rand(B, S, H, D, generator=generator)
    wrong_shape = torch.zeros(B, S, H + 1, D)
    with pytest.raises(ValueError, match=r"qk_rmsnorm: argument 'out': .*shape"):
        ka.qk_rmsnorm(x, out=wrong_shape)
    assert not wrong_shape.any()
    with pytest.raises(TypeError, match=r"qk_rmsnorm: argument 'out': expected dtype "):
        ka.qk_rmsnorm(x, out=torch.zeros(B, S, H, D, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"qk_rmsnorm: argument 'out_dtype': expected None or "
                                         r"out's dtype torch.float32, found torch.bfloat16"):
        ka.qk_rmsnorm(x, out_dtype=torch.bfloat16, out=torch.zeros(B, S, H, D))
    with pytest.raises(ValueError, match=r"multi_axis_rope: argument 'out': expected a tensor "
                                         r"on the CPU"):
        ka.multi_axis_rope(x, cos, sin, out=torch.empty(B, S, H, D, device="meta"))
    with pytest.raises(TypeError, match=r"argument 'out': expected a torch.Tensor"):
        ka.multi_axis_rope(x, cos, sin, out=[1.0])
    # Overlapping an input (but not exactly it) or another output.
    buffer = torch.zeros(B * S * H * D + 1)
    src = buffer[1:].view(B, S, H, D).copy_(x)
    with pytest.raises(ValueError, match=r"multi_axis_rope: argument 'out': expected memory "
                                         r"apart from 'x'"):
        ka.multi_axis_rope(src, cos, sin, out=buffer[:-1].view(B, S, H, D))
    assert torch.equal(src, x)
    q, k = x, x.clone()
    shared = torch.zeros(B, S, H, D)
    with pytest.raises(ValueError, match=r"qk_norm_rope: argument 'out\[1\]': expected memory "
                                         r"apart from 'out\[0\]'"):
        ka.qk_norm_rope(q, k, cos, sin, text_len=TEXT, out=(shared, shared))
    assert not shared.any()
    with pytest.raises(TypeError, match=r"qk_norm_rope: argument 'out': expected a \(q_out, "
                                        r"k_out\) pair"):
        ka.qk_norm_rope(q, k, cos, sin, text_len=TEXT, out=shared)


def test_out_is_refused_under_autograd(generator, tables):
    """As torch's out= functions: no gradient is recorded, so an argument that requires
    grad is refused while grad mode is on (nothing written), accepted under no_grad."""
    cos, sin = tables
    x = rand(B, S, H, D, generator=generator).requires_grad_()
    out = torch.zeros(B, S, H, D)
    with pytest.raises(RuntimeError, match=r"kernel_align.multi_axis_rope_out: argument 'x': "
                                           r"functions with out=... arguments don't support "
                                           r"automatic differentiation"):
        ka.multi_axis_rope(x, cos, sin, out=out)
    assert not out.any()
    with pytest.raises(RuntimeError, match=r"argument 'out': functions with out="):
        ka.qk_rmsnorm(x.detach(), out=torch.zeros(B, S, H, D, requires_grad=True))
    with torch.no_grad():
        ka.multi_axis_rope(x, cos, sin, out=out)
    assert torch.equal(out, ka.multi_axis_rope(x.detach(), cos, sin))


def test_out_of_a_saved_tensor_breaks_its_backward(generator):
    """out= writes a tensor another op saved: its version bumps, so that backward raises
    instead of reading the new values as the old."""
    x = rand(B, S, H, D, generator=generator)
    w = torch.ones(D, requires_grad=True)
    loss = (x * w).sum()
    with torch.no_grad():
        ka.qk_rmsnorm(rand(B, S, H, D, generator=generator), out=x)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_compiled_out_gives_the_eager_bytes(generator, tables):
    cos, sin = tables
    q = rand(B, S, H, D, generator=generator)
    k = rand(B, S, H, D, generator=generator)

    def step(q, k, q_out, k_out, y):
        ka.qk_norm_rope(q, k, cos, sin, text_len=TEXT, out=(q_out, k_out))
        ka.qk_rmsnorm(q_out, out=y)
        return y

    eager = [torch.empty_like(q) for _ in range(3)]
    compiled = [torch.empty_like(q) for _ in range(3)]
    step(q, k, *eager)
    torch.compile(step, fullgraph=True)(q, k, *compiled)
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled))
