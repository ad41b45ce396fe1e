"""bench/compare_peers.py on a tiny problem (24 tokens, 8 of them text): its ONNX graphs run
on ONNX Runtime and OpenVINO give the formulas' outputs within the check's tolerance, the
check refuses wrong outputs, and the ops and dtypes a runtime cannot run are the ones
docs/performance.md names. The peers are optional (bench/requirements-peers.txt); without
them these tests skip, saying which is missing."""

import math
import sys
from pathlib import Path

import pytest
import torch

for _peer in ("onnx", "onnxruntime", "openvino"):
    pytest.importorskip(_peer, reason=f"{_peer} is not installed (optional peer of "
                                      "bench/compare_peers.py: bench/requirements-peers.txt)")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import compare_peers as cp  # noqa: E402
import compare_torch as ct  # noqa: E402

import kernel_align  # noqa: E402

TEXT_LEN = 8
HEADS, HEAD_DIM = 24, 128
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PEER_IMPLS = [f"{peer}_{variant}" for peer in cp.PEERS for variant in cp.VARIANTS] + ["ort_alloc"]
# What the pinned runtimes cannot run (docs/performance.md, "Peers"): ONNX Runtime has no
# bf16 CPU kernel of com.microsoft RotaryEmbedding.
NOT_AVAILABLE = {(impl, op, "bf16") for impl in ("ort_contrib", "ort_alloc")
                 for op in ("multi_axis_rope_fwd", "qk_norm_rope_fwd")}


def tiny(dtype, generator):
    """compare_torch.Tensors of one 4x4-token image after 8 text tokens (S = 24, H = 24,
    D = 128), with kernel_align's diffusers positions and tables."""
    cos, sin = kernel_align.rope_tables(kernel_align.qwen_image_rope_positions([(1, 4, 4)], TEXT_LEN))
    shape = (1, cos.shape[0], HEADS, HEAD_DIM)
    q, k = ((torch.rand(shape, generator=generator) * 4 - 2).to(dtype) for _ in range(2))
    weights = [(torch.rand(HEAD_DIM, generator=generator) + 0.5).to(dtype) for _ in range(4)]
    return ct.Tensors(q, k, None, None, weights, None, None, cos, sin, text_len=TEXT_LEN)


def cases(op, dtype, impls, generator, tmp_path):
    t = tiny(DTYPES[dtype], generator)
    expected = cp.reference(op, t, TEXT_LEN)
    ours = cp.ours(op, t, TEXT_LEN, in_place=False)()
    return cp.build_cases(op, t, 1, TEXT_LEN, impls, str(tmp_path), expected, ours), expected


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", cp.OPS)
def test_peers_match_the_formulas_or_say_why_not(op, dtype, generator, tmp_path):
    (built, checks), _ = cases(op, dtype, ["ka", "ka_new"] + PEER_IMPLS, generator, tmp_path)
    for impl, case in built.items():
        if (impl, op, dtype) in NOT_AVAILABLE:
            assert case.startswith("n/a: ") and "RotaryEmbedding" in case, (impl, case)
        else:
            assert callable(case), (impl, case)
            assert checks[impl]["ok"] and checks[impl]["tolerance_units"] <= cp.ROUNDINGS[op]
    # Our functional op is the contract's bytes, so it is 0 ulps from itself; in place the same.
    assert checks["ka"]["max_ulp_vs_ka"] == 0
    # Every op has a variant that allocates nothing per call (in place, or out=).
    assert "ka_new" in built


@pytest.mark.parametrize("dtype", DTYPES)
def test_check_refuses_wrong_outputs(dtype, generator, tmp_path):
    op = "multi_axis_rope_fwd"
    (_, checks), expected = cases(op, dtype, ["ka"], generator, tmp_path)
    assert checks["ka"]["ok"]
    (y,) = expected
    atol, rtol = checks["ka"]["atol"], checks["ka"]["rtol"]
    # One element off by two roundings' tolerance (the limit is one for RoPE).
    off = y.clone()
    row_max = y[0, 5, 3].double().abs().max().item()
    off[0, 5, 3, 7] = (y[0, 5, 3, 7].double() + 2 * (atol + rtol * row_max)).to(y.dtype)
    assert not cp.check(op, [off], expected, expected)["ok"]
    # The right values in the half-split order (x[i], x[i + D/2]) instead of interleaved.
    halves = y.view(*y.shape[:-1], -1, 2).transpose(-1, -2).reshape(y.shape)
    assert not cp.check(op, [halves], expected, expected)["ok"]
    # A NaN.
    nan = y.clone()
    nan[0, 0, 0, 0] = math.nan
    assert not cp.check(op, [nan], expected, expected)["ok"]


@pytest.mark.parametrize("op", sorted(cp.IN_PLACE_OPS))
def test_in_place_timing_restores_the_inputs_before_every_call(op, generator):
    # Each timed in-place call must see the inputs, not the last call's outputs: then
    # every call gives the bytes of the new-output op.
    t = tiny(torch.float32, generator)
    expected = cp.ours(op, t, TEXT_LEN, in_place=False)()
    run = cp.ours(op, t, TEXT_LEN, in_place=True)
    outputs = []
    ct.time_ms(lambda: outputs.append([o.clone() for o in run()]), 3, 3, 0.0, before=run.restore)
    assert len(outputs) == 4  # the untimed first call and three timed ones
    for output in outputs:
        assert all(torch.equal(o, e) for o, e in zip(output, expected, strict=True))
