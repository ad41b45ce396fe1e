"""Bad inputs: ValueError or TypeError naming the op, the argument, what was expected and
what was found; nothing is written when a call is refused."""

from __future__ import annotations

import re

import pytest
import torch

import kernel_align as ka
from kernel_align import alignment

OPS = torch.ops.kernel_align


@pytest.fixture
def rope_inputs():
    cos, sin = torch.ones(6, 64), torch.zeros(6, 64)
    return torch.randn(2, 6, 3, 128), cos, sin


def test_wrong_head_dim():
    with pytest.raises(ValueError, match=r"qk_rmsnorm: argument 'x': expected an even last dim "
                                         r"D from 2 to 4096, found D = 7"):
        ka.qk_rmsnorm(torch.randn(2, 7))


def test_weight_length():
    with pytest.raises(ValueError,
                       match=r"argument 'weight': expected length 128 .*found length 64"):
        ka.qk_rmsnorm(torch.randn(2, 128), torch.ones(64))


def test_wrong_layout_rank(rope_inputs):
    x, cos, sin = rope_inputs
    with pytest.raises(ValueError, match=r"multi_axis_rope: argument 'x': expected rank 4 "
                                         r"\(layout bshd: \[B, S, H, D\]\), found rank 3"):
        ka.multi_axis_rope(x[0], cos, sin)


def test_layout_decides_the_sequence_dim(rope_inputs):
    """A bshd tensor passed as bhsd has S = 3 (its dim 2): the 6-row tables no longer match,
    where the seed would silently have used the wrong rows."""
    x, cos, sin = rope_inputs
    with pytest.raises(ValueError, match=r"argument 'cos': expected fp32 \[3, 64\] \(S of the "
                                         r"input in layout bhsd, D/2\), found fp32 \[6, 64\]"):
        ka.multi_axis_rope(x, cos, sin, layout="bhsd")


def test_unknown_option_values(rope_inputs):
    x, cos, sin = rope_inputs
    with pytest.raises(ValueError, match=r"argument 'layout': expected one of bshd, bhsd, "
                                         r"found 'sbhd'"):
        ka.multi_axis_rope(x, cos, sin, layout="sbhd")
    with pytest.raises(ValueError, match=r"argument 'pairing': expected one of half, "
                                         r"interleaved, found 'neox'"):
        ka.multi_axis_rope(x, cos, sin, pairing="neox")
    with pytest.raises(ValueError, match=r"argument 'mode': expected one of single, diffusers"):
        ka.qk_rmsnorm(x, mode="fused")


def test_mismatched_sequence_length(rope_inputs):
    x, cos, sin = rope_inputs
    k = torch.randn(2, 5, 3, 128)
    with pytest.raises(ValueError, match=r"qk_norm_rope: argument 'k': expected B = 2, S = 6, "
                                         r"D = 128 \(those of q\), found B = 2, S = 5, D = 128"):
        ka.qk_norm_rope(x, k, cos, sin)
    with pytest.raises(ValueError, match=r"argument 'text_len': expected 0 to S = 6, found 7"):
        ka.qk_norm_rope(x, x, cos, sin, text_len=7)


def test_dtype_errors(rope_inputs):
    x, cos, sin = rope_inputs
    with pytest.raises(TypeError, match=r"qk_rmsnorm: argument 'x': expected dtype "
                                        r"torch.float32, torch.bfloat16 or torch.float16, found "
                                        r"torch.float64"):
        ka.qk_rmsnorm(x.double())
    with pytest.raises(TypeError, match=r"argument 'out_dtype': expected dtype torch.float32.*"
                                        r"found torch.int32"):
        ka.qk_rmsnorm(x, out_dtype=torch.int32)
    with pytest.raises(ValueError, match=r"argument 'cos': expected fp32 \[6, 64\] .*found "
                                         r"bf16 \[6, 64\]"):
        ka.multi_axis_rope(x, cos.bfloat16(), sin)
    with pytest.raises(TypeError, match=r"rope_tables: argument 'positions': expected dtype "
                                        r"torch.int32, found torch.float32"):
        ka.rope_tables(torch.zeros(4, 3))


def test_non_tensors_are_type_errors(rope_inputs):
    """Lists, numpy arrays, None, sparse and nested tensors: TypeError naming the argument
    (the dispatcher raised AttributeError, RuntimeError or NotImplementedError)."""
    import numpy as np

    x, cos, sin = rope_inputs
    cases = [
        ("x", "builtins.list", lambda: ka.qk_rmsnorm(x.tolist())),
        ("x", "numpy.ndarray", lambda: ka.qk_rmsnorm(x.numpy())),
        ("cos", "builtins.NoneType", lambda: ka.multi_axis_rope(x, None, sin)),
        ("weight", "layout torch.sparse_coo", lambda: ka.qk_rmsnorm(x, torch.ones(128).to_sparse())),
        ("k", "a nested tensor",
         lambda: ka.qk_norm_rope(x, torch.nested.nested_tensor([x[0], x[1]], layout=torch.jagged), cos, sin)),
        ("sin", "numpy.ndarray", lambda: ka.multi_axis_rope_(x, cos, sin.numpy())),
    ]
    for argument, found, call in cases:
        with pytest.raises(TypeError, match=rf"argument '{argument}': expected a .*found {found}"):
            call()


def test_fp32_options_follow_the_library_rule(rope_inputs):
    """eps = 1e-50 is 0 in fp32 (a zero row would be NaN): refused, as on the command line."""
    x, cos, sin = rope_inputs
    with pytest.raises(ValueError, match=r"argument 'eps': .*underflows fp32 to 0"):
        ka.qk_rmsnorm(x, eps=1e-50)
    with pytest.raises(ValueError, match=r"argument 'eps': .*overflows fp32 to infinity"):
        ka.qk_norm_rope(x, x, cos, sin, eps=3.5e38)
    with pytest.raises(ValueError, match=r"argument 'theta': .*underflows fp32 to 0"):
        ka.rope_tables(torch.zeros(2, 3, dtype=torch.int32), theta=1e-300)


def test_modules_refuse_bad_options_when_built():
    with pytest.raises(ValueError, match=r"argument 'dim': expected an even head dim from 2 to "
                                         r"4096, found 0"):
        ka.QkRmsNorm(0)
    with pytest.raises(ValueError, match=r"argument 'mode': expected one of single, diffusers"):
        ka.QkRmsNorm(128, mode="fast")
    with pytest.raises(ValueError, match=r"argument 'eps': .*underflows"):
        ka.QkRmsNorm(128, eps=1e-50)
    with pytest.raises(ValueError, match=r"argument 'axes_dim': expected 3 dims"):
        ka.MultiAxisRope(axes_dim=(16, 56))
    with pytest.raises(ValueError, match=r"axes_dim\[1\]': expected even"):
        ka.MultiAxisRope(axes_dim=(16, 55, 57))
    with pytest.raises(ValueError, match=r"argument 'pairing'"):
        ka.MultiAxisRope(pairing="neox")
    ka.QkRmsNorm(128, mode="diffusers")
    ka.MultiAxisRope(layout="bhsd")


def test_non_cpu_tensors_name_the_device_and_backends(rope_inputs):
    """Another device is refused naming it and the backends, by the Python API and by
    the operators' fake kernels (which torch.compile and the meta device run)."""
    x, cos, sin = rope_inputs
    backends = ", ".join(ka.backends())
    expected = (r"qk_norm_rope: argument 'k': expected a tensor on the CPU( or a CUDA device)?, "
                rf"found one on meta \(kernel-align's backends: {re.escape(backends)}\)")
    with pytest.raises(ValueError, match=expected):
        ka.qk_norm_rope(x, x.to("meta"), cos, sin)
    with pytest.raises(ValueError, match=r"multi_axis_rope: argument 'x': .* found one on meta"):
        OPS.multi_axis_rope(x.to("meta"), cos.to("meta"), sin.to("meta"))


@pytest.mark.skipif(not torch.cuda.is_available() or ka.HAS_CUDA,
                    reason="needs a CUDA device and an extension without CUDA kernels "
                           "(test_cuda.py tests one with them)")
def test_cuda_tensor_is_refused(rope_inputs):
    """Without the CUDA kernels: through the Python API and straight through the operator
    (whose CUDA dispatch key runs the refusing view check)."""
    x, cos, sin = rope_inputs
    with pytest.raises(ValueError, match=r"found one on cuda:0"):
        ka.multi_axis_rope(x.cuda(), cos, sin)
    with pytest.raises(ValueError, match=r"multi_axis_rope: argument 'cos': .*found one on cuda:0"):
        OPS.multi_axis_rope(x, cos.cuda(), sin)


def test_refused_calls_write_nothing(rope_inputs):
    x, cos, sin = rope_inputs
    before = x.clone()
    with pytest.raises(ValueError):
        ka.multi_axis_rope_(x, cos[:5], sin[:5])
    with pytest.raises(ValueError):
        ka.qk_norm_rope_(x, x[:, :, :1], cos, sin, text_len=9)
    assert torch.equal(x, before)


def test_aliasing_outputs_are_refused(rope_inputs):
    x, cos, sin = rope_inputs
    with pytest.raises(ValueError, match=r"argument 'q': expected memory apart from 'k'"):
        ka.qk_norm_rope_(x, x[:, :, 1:], cos, sin)


def test_autograd_misuse(rope_inputs):
    x, cos, sin = rope_inputs
    x.requires_grad_()
    trainable = cos.clone().requires_grad_()
    for op, call in (("multi_axis_rope", lambda: ka.multi_axis_rope(x, trainable, sin)),
                     ("multi_axis_rope_", lambda: ka.multi_axis_rope_(x.clone(), cos, trainable)),
                     ("qk_norm_rope", lambda: ka.qk_norm_rope(x, x, trainable, sin, text_len=2))):
        with pytest.raises(ValueError, match=rf"{op}: arguments 'cos', 'sin': expected constant "
                                             "tables"):
            call()
    with torch.no_grad():  # nothing is recorded, so there is nothing to refuse
        ka.multi_axis_rope(x, trainable, sin)
    with pytest.raises(ValueError, match=r"qk_norm_rope_: expected tensors without autograd"):
        ka.qk_norm_rope_(x, x.detach().clone(), cos.detach(), sin)


def test_runtime_settings():
    with pytest.raises(ValueError, match=r"set_backend: .*'gpu'"):
        ka.set_backend("gpu")
    for name in ka.backends():
        assert name in str(pytest.raises(ValueError, ka.set_backend, "gpu").value)
    with pytest.raises(ValueError, match=r"set_num_threads: argument 'n': expected a "
                                         r"thread count from 1 to 4096, found 0"):
        ka.set_num_threads(0)
    with pytest.raises(ValueError, match=r"thread count from 1 to 4096, found 2147483648"):
        ka.set_num_threads(2**31)
    with pytest.raises(ValueError, match=r"set_backend: argument 'name': .*found ''"):
        ka.set_backend("")


def test_in_place_weight_overlapping_q_is_refused(rope_inputs):
    """A weight that is a slice of q, in the in-place fused op: refused by the C++
    validation (it once wrote 1,024 of 2,048 k values wrong)."""
    x, cos, sin = rope_inputs
    q, k = x.clone(), x.clone()
    before = k.clone()
    with pytest.raises(ValueError, match=r"argument 'q': expected memory apart from "
                                         r"'image_k_weight'"):
        ka.qk_norm_rope_(q, k, cos, sin, text_len=2, image_k_weight=q[0, 0, 0])
    assert torch.equal(k, before)


def test_positions_errors():
    with pytest.raises(ValueError, match=r"img_shapes.*same images"):
        ka.qwen_image_rope_positions([[(1, 4, 4)], [(1, 4, 6)]], 3)
    with pytest.raises(ValueError, match=r"\(frame, height, width\)"):
        ka.qwen_image_rope_positions([(4, 4)], 3)
    with pytest.raises(ValueError, match=r"positions: argument"):
        ka.qwen_image_positions(-1, 4, 4)


# Hardening round 2 (issue 34): defects 8, 11 and 13 as a Python user meets them.


def test_disjoint_views_of_packed_qkv_are_written_in_place():
    """q and k as views of one packed QKV buffer share no element: the in-place fused op
    takes them (it refused them as overlapping) and gives the out-of-place op's bytes,
    leaving v untouched; so do last-dim halves and element-interleaved q/k."""
    cos, sin = ka.rope_tables(ka.qwen_image_positions(2, 1, 2), [16, 56, 56])
    qkv = torch.randn(1, 4, 3, 1, 128)
    want_q, want_k = ka.qk_norm_rope(qkv[:, :, 0], qkv[:, :, 1], cos, sin, text_len=2)
    v = qkv[:, :, 2].clone()
    ka.qk_norm_rope_(qkv[:, :, 0], qkv[:, :, 1], cos, sin, text_len=2)
    assert torch.equal(qkv[:, :, 0], want_q) and torch.equal(qkv[:, :, 1], want_k)
    assert torch.equal(qkv[:, :, 2], v)
    halves = torch.randn(1, 4, 1, 256)
    want_q, want_k = ka.qk_norm_rope(halves[..., :128], halves[..., 128:], cos, sin, text_len=2)
    ka.qk_norm_rope_(halves[..., :128], halves[..., 128:], cos, sin, text_len=2)
    assert torch.equal(halves[..., :128], want_q) and torch.equal(halves[..., 128:], want_k)
    interleaved = torch.randn(1, 4, 1, 256)
    q, k = interleaved[..., 0::2], interleaved[..., 1::2]
    want_q, want_k = ka.qk_norm_rope(q, k, cos, sin, text_len=2)
    ka.qk_norm_rope_(q, k, cos, sin, text_len=2)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
    # True overlap stays refused: k one element further along q's storage.
    flat = torch.randn(4 * 128 + 1)
    with pytest.raises(ValueError, match=r"argument 'q': expected memory apart from 'k'"):
        ka.qk_norm_rope_(flat[:-1].view(1, 4, 1, 128), flat[1:].view(1, 4, 1, 128), cos, sin,
                         text_len=2)


def test_a_call_is_validated_before_its_output_is_allocated():
    """An expanded view stands for more elements than memory holds: the library's refusal
    (odd D, a shape past its limits, outputs larger than memory) comes first, never
    torch's allocator or an overflow error."""
    huge = torch.empty(1, 1).expand(2**40, 127)
    with pytest.raises(ValueError, match=r"qk_rmsnorm: argument 'x': expected an even last "
                                         r"dim D"):
        ka.qk_rmsnorm(huge)
    with pytest.raises(ValueError, match=r"qk_rmsnorm: argument 'x': .*2\^56"):
        ka.qk_rmsnorm(torch.empty(1, 1).expand(2**50, 128))
    with pytest.raises(ValueError, match=r"qk_rmsnorm: argument 'x': expected a tensor whose "
                                         r"outputs fit in the memory of cpu"):
        ka.qk_rmsnorm(torch.empty(1, 1).expand(2**36, 128))
    cos, sin = torch.ones(1, 64), torch.zeros(1, 64)
    with pytest.raises(ValueError, match=r"multi_axis_rope: argument 'x': expected a tensor "
                                         r"whose outputs fit in the memory of cpu"):
        ka.multi_axis_rope(torch.empty(1, 1, 1, 1).expand(2**30, 1, 64, 128), cos, sin)
    with pytest.raises(ValueError, match=r"digests: argument 'tensor': expected a tensor whose "
                                         r"elements fit in the memory of cpu"):
        alignment.digests(torch.empty(1, 1).expand(2**40, 2**20))


@pytest.mark.parametrize("call, argument, found", [
    (lambda x, c, s: ka.qk_norm_rope(x, x, c, s, text_len=1.5), "text_len", "builtins.float"),
    (lambda x, c, s: ka.qk_norm_rope(x, x, c, s, text_len=2, eps="1e-6"), "eps", "builtins.str"),
    (lambda x, c, s: ka.qk_rmsnorm(x, mode=1), "mode", "builtins.int"),
    (lambda x, c, s: ka.qk_rmsnorm(x, out_dtype="float32"), "out_dtype", "builtins.str"),
    (lambda x, c, s: ka.multi_axis_rope_(x, c, s, pairing=None), "pairing", "builtins.NoneType"),
    (lambda x, c, s: ka.set_num_threads(2.0), "n", "builtins.float"),
    (lambda x, c, s: ka.set_backend(3), "name", "builtins.int"),
    (lambda x, c, s: ka.rope_tables(ka.qwen_image_positions(1, 1, 1), [16, 56, 56], "1e4"),
     "theta", "builtins.str"),
    (lambda x, c, s: ka.qwen_image_positions(1, 2.0, 2), "h", "builtins.float"),
    (lambda x, c, s: ka.QkRmsNorm(128.0), "dim", "builtins.float"),
])
def test_wrong_scalar_types_are_type_errors(rope_inputs, call, argument, found):
    """A scalar of the wrong type is the documented TypeError naming the Python argument,
    not torch's schema RuntimeError."""
    x, cos, sin = rope_inputs
    with pytest.raises(TypeError, match=rf"argument '{argument}': expected an? .*found {found}"):
        call(x, cos, sin)


def test_out_of_range_integers_and_python_argument_names(rope_inputs):
    """An int beyond int64 is a ValueError saying what was given; messages name the Python
    function's arguments ('x' of multi_axis_rope_, 'n', 'name', 'theta', 'axes_dim[1]'),
    never the library's ('y', 'threads', 'backend', 'spec.theta')."""
    x, cos, sin = rope_inputs
    with pytest.raises(ValueError, match=rf"argument 'text_len': expected an integer .*found "
                                         rf"{2**63}"):
        ka.qk_norm_rope(x, x, cos, sin, text_len=2**63)
    with pytest.raises(ValueError, match=r"multi_axis_rope_: argument 'x': expected memory "
                                         r"apart from 'cos'"):
        table_in_x = torch.ones(1, 6, 1, 64)
        ka.multi_axis_rope_(table_in_x, table_in_x.view(6, 64)[:, :32], torch.zeros(6, 32))
    with pytest.raises(ValueError, match=r"set_num_threads: argument 'n': .*found 99999"):
        ka.set_num_threads(99999)
    with pytest.raises(ValueError, match=r"set_backend: argument 'name': "):
        ka.set_backend("gpu")
    positions = ka.qwen_image_positions(1, 1, 1)
    with pytest.raises(ValueError, match=r"rope_tables: argument 'theta': "):
        ka.rope_tables(positions, [16, 56, 56], -1.0)
    with pytest.raises(ValueError, match=r"rope_tables: argument 'axes_dim\[1\]': expected even"):
        ka.rope_tables(positions, [16, 55, 57], 10000.0)
    with pytest.raises(ValueError, match=r"argument 'h': expected between 1 and "):
        ka.qwen_image_positions(1, 0, 2)
