"""The in-place operators as autograd, the version counter and inference mode see them:
exactly like torch's own in-place ops (``x.mul_(2)`` is the yardstick in each test), for
the Python functions and the raw ``torch.ops.kernel_align.*_`` operators alike. These
once wrote without a trace: the version counter stayed put, a backward that had saved x
silently used the rotated values, and a table that required grad was silently given none.
"""

from __future__ import annotations

import pytest
import torch

import kernel_align as ka
from formulas import assert_bitwise

OPS = torch.ops.kernel_align
MODIFIED = "modified by an inplace operation"
LEAF = "a leaf Variable that requires grad is being used in an in-place operation"
INFERENCE = "Inplace update to inference tensor outside InferenceMode"


def tables(seq, generator):
    angles = torch.rand(seq, 64, generator=generator) * 10
    return torch.cos(angles), torch.sin(angles)


# Each writes its first tensor (and the fused ops their second) in place: the Python
# functions and the raw operators, called as they would be.
IN_PLACE = {
    "multi_axis_rope_": lambda x, y, cos, sin: ka.multi_axis_rope_(x, cos, sin),
    "raw multi_axis_rope_": lambda x, y, cos, sin: OPS.multi_axis_rope_(
        x, cos, sin, "interleaved", "bshd"),
    "qk_norm_rope_": lambda x, y, cos, sin: ka.qk_norm_rope_(x, y, cos, sin, text_len=1),
    "raw qk_norm_rope_": lambda x, y, cos, sin: OPS.qk_norm_rope_(
        x, y, None, None, None, None, cos, sin, 1, 1e-6, "diffusers", "interleaved", "bshd"),
}
FUSED = {"qk_norm_rope_", "raw qk_norm_rope_"}


def inputs(generator):
    cos, sin = tables(4, generator)
    x = torch.randn(1, 4, 1, 128, generator=generator)
    y = torch.randn(1, 4, 2, 128, generator=generator)
    return x, y, cos, sin


@pytest.mark.parametrize("name", IN_PLACE)
def test_version_counter_bumps(name, generator):
    """One bump of each tensor written, as ``x.mul_(2)`` gives; the tables are only read."""
    x, y, cos, sin = inputs(generator)
    versions = [t._version for t in (x, y, cos, sin)]
    IN_PLACE[name](x, y, cos, sin)
    written = (1, 1 if name in FUSED else 0, 0, 0)
    assert [t._version for t in (x, y, cos, sin)] == [v + w for v, w in zip(versions, written)]


@pytest.mark.parametrize("no_grad", [False, True], ids=["grad", "no_grad"])
@pytest.mark.parametrize("name", IN_PLACE)
def test_backward_through_an_overwritten_tensor_raises(name, no_grad, generator):
    """The issue's case: a loss saved x (``x * w``), then x is written in place. torch's own
    in-place op makes that backward raise rather than use the new values as the old (w.grad
    was the rotated x); ours must too, also when the write happens under no_grad."""
    x, y, cos, sin = inputs(generator)
    w = torch.ones(128, requires_grad=True)
    reference = x.clone()
    loss = (reference * w).sum()
    with torch.no_grad() if no_grad else torch.enable_grad():
        reference.mul_(2)  # the yardstick: torch's own in-place op
    with pytest.raises(RuntimeError, match=MODIFIED):
        loss.backward()
    loss = (x * w).sum() + (y * w).sum()
    with torch.no_grad() if no_grad else torch.enable_grad():
        IN_PLACE[name](x, y, cos, sin)
    with pytest.raises(RuntimeError, match=MODIFIED):
        loss.backward()
    assert w.grad is None


@pytest.mark.parametrize("name", IN_PLACE)
def test_inference_tensor_outside_inference_mode_is_refused(name, generator):
    """An inference tensor has no version counter: torch refuses to write one outside
    inference mode, and so do the in-place ops, before writing anything. Inside inference
    mode they write it, as torch does."""
    with torch.inference_mode():
        x, y, cos, sin = inputs(generator)
        reference = torch.ones(3)
    with pytest.raises(RuntimeError, match=INFERENCE):
        reference.mul_(2)  # the yardstick
    before = x.clone(), y.clone()
    with pytest.raises(RuntimeError, match=INFERENCE):
        IN_PLACE[name](x, y, cos, sin)
    assert torch.equal(x, before[0]) and torch.equal(y, before[1])
    with torch.inference_mode():
        IN_PLACE[name](x, y, cos, sin)
    assert not torch.equal(x, before[0])


@pytest.mark.parametrize("name", IN_PLACE)
def test_trainable_table_is_refused(name, generator):
    """A table that requires grad gets no gradient from the in-place ops either: refused
    with the functional ops' message while grad mode is on (x itself needs no grad), and
    accepted under no_grad, where nothing is recorded, as the functional ops are."""
    x, y, cos, sin = inputs(generator)
    op = name.removeprefix("raw ")
    before = x.clone()
    trainable = cos.clone().requires_grad_()
    with pytest.raises(ValueError, match=rf"kernel_align\.{op}: arguments 'cos', 'sin': "
                                         "expected constant tables"):
        IN_PLACE[name](x, y, trainable, sin)
    assert torch.equal(x, before)
    with pytest.raises(ValueError, match="expected constant tables"):  # the functional rule
        ka.multi_axis_rope(x, trainable, sin)
    with torch.no_grad():
        IN_PLACE[name](x, y, trainable, sin)
    assert not torch.equal(x, before)


@pytest.mark.parametrize("raw", [False, True], ids=["function", "raw"])
def test_rope_inplace_on_a_leaf_is_refused(raw, generator):
    """torch's own message, and x left as it was (the refusal comes before the write)."""
    x, y, cos, sin = inputs(generator)
    x.requires_grad_()
    before = x.detach().clone()
    with pytest.raises(RuntimeError, match=LEAF):
        x.mul_(2)  # the yardstick
    name = "raw multi_axis_rope_" if raw else "multi_axis_rope_"
    with pytest.raises(RuntimeError, match=LEAF):
        IN_PLACE[name](x, y, cos, sin)
    with pytest.raises(RuntimeError, match="a view of a leaf Variable"):
        IN_PLACE[name](x[:, 1:], y, cos[1:], sin[1:])
    assert torch.equal(x.detach(), before) and x._version == 0
    with torch.no_grad():  # as an optimizer step would
        IN_PLACE[name](x, y, cos, sin)
    assert not torch.equal(x.detach(), before)


@pytest.mark.parametrize("raw", [False, True], ids=["function", "raw"])
def test_rope_inplace_gradient(raw, generator):
    """On a tensor that requires grad, the rotation is recorded as an in-place op (the raw
    operator once left the history as it was: the gradient skipped the rotation), on a
    whole tensor and on a view of one (torch's CopySlices): the gradient is the
    out-of-place op's."""
    _, y, cos, sin = inputs(generator)
    leaf = torch.randn(1, 4, 3, 128, generator=generator, requires_grad=True)
    name = "raw multi_axis_rope_" if raw else "multi_axis_rope_"
    dy = torch.randn(1, 4, 3, 128, generator=generator)

    x = leaf * 1.0
    IN_PLACE[name](x, y, cos, sin)
    (grad,) = torch.autograd.grad(x, leaf, dy)
    (expected,) = torch.autograd.grad(ka.multi_axis_rope(leaf, cos, sin), leaf, dy)
    assert_bitwise(grad, expected)

    base = leaf * 1.0
    IN_PLACE[name](base[:, :, 1:2], y, cos, sin)  # one head of three, through a view
    (grad,) = torch.autograd.grad(base, leaf, dy)
    expected = dy.clone()
    expected[:, :, 1:2] = OPS.multi_axis_rope_backward(dy[:, :, 1:2], cos, sin, "interleaved",
                                                       "bshd")
    assert_bitwise(grad, expected)


@pytest.mark.parametrize("raw", [False, True], ids=["function", "raw"])
def test_fused_inplace_refuses_autograd(raw, generator):
    """qk_norm_rope_'s backward would need the q and k it overwrites: under grad mode it
    refuses tensors that require grad, the raw operator as the Python function does."""
    x, y, cos, sin = inputs(generator)
    name = "raw qk_norm_rope_" if raw else "qk_norm_rope_"
    before = x.clone()
    q = x.clone().requires_grad_() * 1.0
    with pytest.raises(ValueError, match=r"qk_norm_rope_: expected tensors without autograd"):
        IN_PLACE[name](q, y, cos, sin)
    assert torch.equal(q.detach(), before)
    with torch.no_grad():
        IN_PLACE[name](q, y, cos, sin)
    assert not torch.equal(q.detach(), before)


def test_compiled_inplace_rope_gradient(generator):
    """The in-place rotation of a tensor that requires grad inside a compiled graph
    (fullgraph: functionalised, with its backward): the eager gradient."""
    _, y, cos, sin = inputs(generator)
    leaf = torch.randn(1, 4, 3, 128, generator=generator, requires_grad=True)
    dy = torch.randn(1, 4, 3, 128, generator=generator)

    def step(t):
        x = t * 2.0
        ka.multi_axis_rope_(x, cos, sin)
        return (x * dy).sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    (grad,) = torch.autograd.grad(compiled(leaf), leaf)
    (expected,) = torch.autograd.grad(step(leaf), leaf)
    assert_bitwise(grad, expected)
