"""Autograd and torch.compile through the operators.

gradcheck: fp64 is not a dtype of the library, so torch.autograd.gradcheck runs on the
fp32 operators themselves, with finite differences of eps = 1e-2 (truncation error
~eps^2, fp32 rounding ~1e-7/eps) and atol = rtol = 2e-3 on small inputs. The tight checks
are elsewhere: gradients against torch autograd of the fp32 formulas within the
contract's tolerance classes (here), and bitwise against the explicit VJP (test_ops.py).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import kernel_align as ka
from kernel_align._ops import _OPERATORS
from formulas import assert_bitwise, assert_close, rope, rstd_torch_mean

OPS = torch.ops.kernel_align


def tables(seq, generator):
    angles = torch.rand(seq, 8, generator=generator) * 10
    return torch.cos(angles), torch.sin(angles)


def gradcheck(fn, inputs):
    with warnings.catch_warnings():
        # gradcheck warns about inputs that are not fp64: fp32 is deliberate here.
        warnings.simplefilter("ignore", UserWarning)
        assert torch.autograd.gradcheck(fn, inputs, eps=1e-2, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("mode", ["single", "diffusers"])
def test_gradcheck_qk_rmsnorm(mode, generator):
    x = torch.randn(3, 2, 16, generator=generator).requires_grad_()
    w = torch.randn(16, generator=generator).requires_grad_()
    gradcheck(lambda a, b: ka.qk_rmsnorm(a, b, mode=mode), (x, w))
    gradcheck(lambda a: ka.qk_rmsnorm(a), (x,))


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_gradcheck_multi_axis_rope(pairing, layout, generator):
    cos, sin = tables(5, generator)
    x = torch.randn(2, 5, 3, 16, generator=generator)
    if layout == "bhsd":
        x = x.transpose(1, 2).contiguous()
    gradcheck(lambda a: ka.multi_axis_rope(a, cos, sin, pairing=pairing, layout=layout),
              (x.requires_grad_(),))


def test_gradcheck_qk_norm_rope(generator):
    cos, sin = tables(6, generator)
    q = torch.randn(1, 6, 2, 16, generator=generator).requires_grad_()
    k = torch.randn(1, 6, 1, 16, generator=generator).requires_grad_()
    w = [torch.randn(16, generator=generator).requires_grad_() for _ in range(4)]

    def fn(q_, k_, tq, tk, iq, ik):
        return ka.qk_norm_rope(q_, k_, cos, sin, text_len=2, text_q_weight=tq,
                               text_k_weight=tk, image_q_weight=iq, image_k_weight=ik)

    gradcheck(fn, (q, k, *w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gradients_vs_torch_formulas(dtype, generator):
    """Gradients of q, k and the four weights of the fused op, and of the unfused ops,
    against torch autograd of the seed/diffusers formulas computed in fp32 (reduction
    gradient class of the inputs' dtype)."""
    s, text_len = 12, 4
    angles = torch.rand(s, 64, generator=generator) * 50
    cos, sin = torch.cos(angles), torch.sin(angles)
    q = torch.randn(2, s, 3, 128, generator=generator).to(dtype).requires_grad_()
    k = torch.randn(2, s, 2, 128, generator=generator).to(dtype).requires_grad_()
    w = [(1 + 0.1 * torch.randn(128, generator=generator)).requires_grad_() for _ in range(4)]
    dq = torch.randn(2, s, 3, 128, generator=generator).to(dtype)
    dk = torch.randn(2, s, 2, 128, generator=generator).to(dtype)

    q_out, k_out = ka.qk_norm_rope(q, k, cos, sin, text_len=text_len, text_q_weight=w[0],
                                   text_k_weight=w[1], image_q_weight=w[2], image_k_weight=w[3])
    ours = torch.autograd.grad((q_out, k_out), (q, k, *w), (dq, dk))

    def formula(x, text_w, image_w):
        xf = x.float()
        normed = torch.cat([xf[:, :text_len] * rstd_torch_mean(xf[:, :text_len]) * text_w,
                            xf[:, text_len:] * rstd_torch_mean(xf[:, text_len:]) * image_w], 1)
        return rope(normed, cos, sin)  # fp32 throughout: no rounding to the input dtype

    expected = torch.autograd.grad((formula(q, w[0], w[2]), formula(k, w[1], w[3])),
                                   (q, k, *w), (dq.float(), dk.float()))
    assert_close(ours[0], expected[0], "reduction_gradient", dtype)
    assert_close(ours[1], expected[1], "reduction_gradient", dtype)
    for dw, expected_dw in zip(ours[2:], expected[2:]):
        # A sum over every row of the stream: relative to the sum of magnitudes.
        assert_close(dw / dw.abs().max(), expected_dw / dw.abs().max(), "reduction_gradient",
                     dtype)

    x = q.detach().requires_grad_()
    (dx,) = torch.autograd.grad(ka.multi_axis_rope(x, cos, sin), x, dq)
    assert_bitwise(dx, rope(dq, cos, sin, transpose=True))


def test_gradients_of_the_given_weights(generator):
    """The autograd kernels (csrc/autograd.cpp) map each gradient to its input when only
    some weights are given and only some inputs are asked for: each gradient equals the
    backward operator's, called with just that weight gradient requested."""
    cos, sin = tables(6, generator)
    q = torch.randn(1, 6, 2, 16, generator=generator, requires_grad=True)
    k = torch.randn(1, 6, 1, 16, generator=generator, requires_grad=True)
    text_k = torch.randn(16, generator=generator, requires_grad=True)
    image_q = torch.randn(16, generator=generator)  # given, but constant
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    options = (cos, sin, 2, 1e-6, "diffusers", "interleaved", "bshd")
    expected = OPS.qk_norm_rope_backward(q.detach(), k.detach(), dq, dk, None, text_k.detach(),
                                         image_q, None, *options, [False, True, False, False])

    def grads(*inputs):
        outs = ka.qk_norm_rope(q, k, cos, sin, text_len=2, text_k_weight=text_k,
                               image_q_weight=image_q)
        return torch.autograd.grad(outs, inputs, (dq, dk))

    dq_expected, dk_expected, _, dw_text_k, _, _ = expected
    for got, want in zip(grads(q, k, text_k), (dq_expected, dk_expected, dw_text_k)):
        assert_bitwise(got, want)
    assert_bitwise(grads(text_k)[0], dw_text_k)

    x = torch.randn(3, 16, generator=generator)
    w = torch.randn(16, generator=generator, requires_grad=True)
    dy = torch.randn_like(x)
    (dw,) = torch.autograd.grad(ka.qk_rmsnorm(x, w), w, dy)
    assert_bitwise(dw, OPS.qk_rmsnorm_backward(x, dy, w.detach(), 1e-6, "single", True)[1])


def test_inplace_rope_autograd(generator):
    """multi_axis_rope_ under autograd: recorded as an in-place op (version bump), its
    gradient the transpose rotation, the same as the out-of-place op's."""
    cos, sin = tables(7, generator)
    leaf = torch.randn(2, 7, 3, 16, generator=generator, requires_grad=True)
    x = leaf * 1.0
    version = x._version
    y = ka.multi_axis_rope_(x, cos, sin)
    assert y is x and x._version > version
    dy = torch.randn_like(y)
    (grad_inplace,) = torch.autograd.grad(y, leaf, dy)
    (grad,) = torch.autograd.grad(ka.multi_axis_rope(leaf, cos, sin), leaf, dy)
    assert_bitwise(grad_inplace, grad)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        ka.multi_axis_rope_(leaf, cos, sin)


def test_double_backward_of_rope_is_exact(generator):
    """multi_axis_rope is linear: a gradient taken with create_graph=True carries a graph,
    and differentiating it again gives the exact second-order term. With L = <y, u> and
    g = dL/dx = R^T u, the penalty P = <g, g> has dP/du = 2 R g = 2 R R^T u = 2u (a
    rotation), computed here through the ops."""
    cos, sin = tables(5, generator)
    x = torch.randn(2, 5, 3, 16, generator=generator, requires_grad=True)
    u = torch.randn(2, 5, 3, 16, generator=generator, requires_grad=True)
    y = ka.multi_axis_rope(x, cos, sin)
    (g,) = torch.autograd.grad(y, x, u, create_graph=True)
    assert g.grad_fn is not None
    (du,) = torch.autograd.grad((g * g).sum(), u)
    assert_bitwise(du, 2 * OPS.multi_axis_rope(g.detach(), cos, sin, "interleaved", "bshd"))
    assert_close(du, 2 * u.detach(), "elementwise")
    # The in-place op's gradient too (its backward calls the same backward operator).
    (g_inplace,) = torch.autograd.grad(ka.multi_axis_rope_(x * 1.0, cos, sin), x, u,
                                       create_graph=True)
    assert g_inplace.grad_fn is not None


@pytest.mark.parametrize("op", ["qk_rmsnorm", "qk_norm_rope"])
def test_double_backward_of_the_norms_raises(op, generator):
    """The gradient of a gradient of the RMSNorm ops is not implemented: asking for it (a
    gradient penalty) raises a clear error, where the gradient once came back without a
    graph and the penalty silently lost its term. First-order gradients under
    create_graph=True are unchanged."""
    cos, sin = tables(6, generator)
    q = torch.randn(1, 6, 2, 16, generator=generator, requires_grad=True)
    w = torch.randn(16, generator=generator, requires_grad=True)
    if op == "qk_rmsnorm":
        outs = (ka.qk_rmsnorm(q, w),)
    else:
        outs = ka.qk_norm_rope(q, q[:, :, :1].detach(), cos, sin, text_len=2, image_q_weight=w)
    upstream = tuple(torch.randn_like(o) for o in outs)
    g_q, g_w = torch.autograd.grad(outs, (q, w), upstream, create_graph=True)
    plain = torch.autograd.grad(
        ka.qk_rmsnorm(q, w) if op == "qk_rmsnorm" else ka.qk_norm_rope(
            q, q[:, :, :1].detach(), cos, sin, text_len=2, image_q_weight=w),
        (q, w), upstream)
    assert_bitwise(g_q, plain[0])
    assert_bitwise(g_w, plain[1])
    assert g_q.requires_grad, "a gradient with create_graph=True must not be a constant"
    with pytest.raises(NotImplementedError, match=f"kernel_align.{op}: double backward"):
        torch.autograd.grad((g_q * g_q).sum() + g_w.sum(), q)


def _opcheck_cases(generator):
    cos, sin = tables(6, generator)
    x = torch.randn(2, 6, 3, 16, generator=generator)
    w = torch.randn(16, generator=generator)
    wb = w.bfloat16()
    grad = dict(requires_grad=True)
    yield OPS.qk_rmsnorm, (x.clone().requires_grad_(), w.clone().requires_grad_(), 1e-6,
                           "diffusers", None)
    yield OPS.qk_rmsnorm, (x.bfloat16(), wb, 1e-6, "single", torch.float32)
    yield OPS.qk_rmsnorm_backward, (x, torch.randn_like(x), w, 1e-6, "single", True)
    yield OPS.multi_axis_rope, (torch.randn(2, 6, 3, 16, **grad), cos, sin, "half", "bshd")
    yield OPS.multi_axis_rope, (x.transpose(1, 2), cos, sin, "interleaved", "bhsd")
    yield OPS.multi_axis_rope_, (x.clone(), cos, sin, "interleaved", "bshd")
    yield OPS.multi_axis_rope_backward, (x, cos, sin, "interleaved", "bshd")
    weights = [w.clone().requires_grad_() for _ in range(4)]
    yield OPS.qk_norm_rope, (x.clone().requires_grad_(), x[:, :, :1].clone().requires_grad_(),
                             *weights, cos, sin, 2, 1e-6, "diffusers", "interleaved", "bshd",
                             None)
    yield OPS.qk_norm_rope, (x, x, None, w, None, None, cos, sin, 0, 1e-6, "single", "half",
                             "bshd", torch.bfloat16)
    yield OPS.qk_norm_rope_, (x.clone(), x.clone(), w, w, w, w, cos, sin, 3, 1e-6, "diffusers",
                              "interleaved", "bshd")
    yield OPS.qk_norm_rope_backward, (x, x, x, x, w, w, None, w, cos, sin, 3, 1e-6, "diffusers",
                                      "interleaved", "bshd", [True, False, False, True])
    # The out= variants (test_out.py): the outputs given, written.
    yield OPS.qk_rmsnorm_out, (x.bfloat16(), wb, 1e-6, "single", torch.empty_like(x))
    yield OPS.qk_rmsnorm_backward_out, (x, torch.randn_like(x), w, 1e-6, "single",
                                        torch.empty_like(x), torch.empty_like(w))
    yield OPS.qk_rmsnorm_backward_out, (x, torch.randn_like(x), w, 1e-6, "single",
                                        torch.empty_like(x), None)
    yield OPS.multi_axis_rope_out, (x, cos, sin, "half", "bshd", torch.empty_like(x))
    yield OPS.multi_axis_rope_backward_out, (x, cos, sin, "interleaved", "bshd",
                                             torch.empty_like(x))
    yield OPS.qk_norm_rope_out, (x, x, w, w, w, w, cos, sin, 3, 1e-6, "diffusers", "interleaved",
                                 "bshd", torch.empty_like(x), torch.empty_like(x).bfloat16())
    yield OPS.qk_norm_rope_backward_out, (x, x, x, x, w, w, None, w, cos, sin, 3, 1e-6,
                                          "diffusers", "interleaved", "bshd", torch.empty_like(x),
                                          torch.empty_like(x), torch.empty_like(w), None, None,
                                          torch.empty_like(w))


def test_opcheck(generator):
    """torch.library.opcheck of every operator: schema (mutation annotations), fake
    kernels against the real ones, autograd registration, AOT dispatch."""
    for op, args in _opcheck_cases(generator):
        torch.library.opcheck(op, args)


def test_operator_table_defines_every_kernel():
    """The library ops' operators come from one table (_ops.py's _OPERATORS): each row is
    defined as written, tagged pt2_compliant, and has CPU, Autograd and fake (Meta) kernels;
    and every operator with a C++ CPU kernel is a row, so a kernel registered without its
    row (an operator nobody defined) is caught here."""
    rows = {}
    for row in _OPERATORS:
        schema = torch._C.parse_schema(f"kernel_align::{row.schema}")
        rows[schema.name] = schema
    assert len(rows) == len(_OPERATORS), "an operator is defined twice"
    for name, schema in rows.items():
        packet = getattr(OPS, name.split("::")[1])
        assert str(packet.default._schema) == str(schema)
        assert torch.Tag.pt2_compliant_tag in packet.default.tags, name
        for key in ("CPU", "Autograd", "Meta"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(name, key), (name, key)
        # Functionalisation calls a mutating op with a `mode` of its own.
        if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            assert "mode" not in [a.name for a in schema.arguments], name
    with_cpu_kernels = {name for name in torch._C._dispatch_get_all_op_names()
                        if name.startswith("kernel_align::")
                        and torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU")}
    assert with_cpu_kernels == set(rows)


def test_compile_fullgraph_forward_backward(generator):
    """One compiled function (inductor, fullgraph: no graph break) through the fused op,
    the norm and RoPE, forward and backward: bitwise equal to eager."""
    s, text_len = 10, 3
    pos = ka.qwen_image_rope_positions([(1, 1, s - text_len)], text_len)
    cos, sin = ka.rope_tables(pos)
    w = [torch.randn(128, generator=generator).bfloat16().requires_grad_() for _ in range(4)]
    q = torch.randn(1, s, 2, 128, generator=generator).bfloat16().requires_grad_()
    k = torch.randn(1, s, 2, 128, generator=generator).bfloat16().requires_grad_()

    def step(q_, k_, tq, tk, iq, ik):
        q_out, k_out = ka.qk_norm_rope(q_, k_, cos, sin, text_len=text_len, text_q_weight=tq,
                                       text_k_weight=tk, image_q_weight=iq, image_k_weight=ik)
        extra = ka.multi_axis_rope(ka.qk_rmsnorm(q_ * 2, tq, mode="diffusers"), cos, sin)
        return (q_out.float() * k_out.float().sum(2, keepdim=True) + extra.float()).sum()

    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    inputs = (q, k, *w)
    eager_loss = step(*inputs)
    eager_grads = torch.autograd.grad(eager_loss, inputs)
    compiled_loss = compiled(*inputs)
    compiled_grads = torch.autograd.grad(compiled_loss, inputs)
    # The ops' bytes are fixed; the surrounding torch reductions may be reordered by
    # inductor, so the loss is compared by value and the op gradients within fp32 class.
    assert_close(compiled_loss, eager_loss, "reduction_forward")
    for c, e in zip(compiled_grads, eager_grads):
        assert_close(c, e, "reduction_gradient")


def test_compile_inplace_ops(generator):
    """The mutating ops inside a compiled graph (functionalised through their
    ``Tensor(a!)`` annotations): the caller's tensors are updated as in eager."""
    cos, sin = tables(6, generator)
    w = torch.randn(16, generator=generator)
    q = torch.randn(2, 6, 3, 16, generator=generator)
    k = torch.randn(2, 6, 1, 16, generator=generator)

    def step(q_, k_):
        ka.qk_norm_rope_(q_, k_, cos, sin, text_len=2, image_q_weight=w, image_k_weight=w)
        ka.multi_axis_rope_(k_, cos, sin, pairing="half")
        return q_.sum()

    expected_q, expected_k = q.clone(), k.clone()
    with torch.no_grad():
        step(expected_q, expected_k)
        compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
        compiled(q, k)
    assert_bitwise(q, expected_q)
    assert_bitwise(k, expected_k)
