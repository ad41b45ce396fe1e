"""Bad inputs: ValueError or TypeError naming the op, the argument, what was expected and
what was found; nothing is written when a call is refused."""

from __future__ import annotations

import re

import pytest
import torch

import kernel_align as ka

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
    with pytest.raises(TypeError, match=r"qk_rmsnorm: argument 'x': expected dtype float32, "
                                        r"bfloat16 or float16, found Double"):
        ka.qk_rmsnorm(x.double())
    with pytest.raises(TypeError, match=r"argument 'out_dtype': expected dtype float32"):
        ka.qk_rmsnorm(x, out_dtype=torch.int32)
    with pytest.raises(ValueError, match=r"argument 'cos': expected fp32 \[6, 64\] .*found "
                                         r"bf16 \[6, 64\]"):
        ka.multi_axis_rope(x, cos.bfloat16(), sin)
    with pytest.raises(TypeError, match=r"rope_tables: argument 'positions': expected dtype "
                                        r"int32"):
        ka.rope_tables(torch.zeros(4, 3))


def test_non_cpu_tensors_name_the_device_and_backends(rope_inputs):
    """Another device is refused naming it and the backends, by the Python API and by
    the operators' fake kernels (which torch.compile and the meta device run)."""
    x, cos, sin = rope_inputs
    backends = ", ".join(ka.backends())
    expected = (r"qk_norm_rope: argument 'k': expected a CPU tensor, found one on meta "
                rf"\(kernel-align's backends {re.escape(backends)} run on the CPU\)")
    with pytest.raises(ValueError, match=expected):
        ka.qk_norm_rope(x, x.to("meta"), cos, sin)
    with pytest.raises(ValueError, match=r"multi_axis_rope: argument 'x': .* found one on meta"):
        OPS.multi_axis_rope(x.to("meta"), cos.to("meta"), sin.to("meta"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensor_is_refused(rope_inputs):
    """Through the Python API and straight through the operator (whose CUDA dispatch key
    runs the refusing view check)."""
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
    with pytest.raises(ValueError, match=r"argument 'q_out': expected memory apart from 'k'"):
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
    with pytest.raises(ValueError, match=r"set_num_threads: argument 'n'"):
        ka.set_num_threads(0)


def test_positions_errors():
    with pytest.raises(ValueError, match=r"img_shapes.*same images"):
        ka.qwen_image_rope_positions([[(1, 4, 4)], [(1, 4, 6)]], 3)
    with pytest.raises(ValueError, match=r"\(frame, height, width\)"):
        ka.qwen_image_rope_positions([(4, 4)], 3)
    with pytest.raises(ValueError, match=r"positions: argument"):
        ka.qwen_image_positions(-1, 4, 4)
