"""The registry settings seen from Python: strict mode, trace records, thread count."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import torch

import kernel_align as ka
from formulas import assert_bitwise


def test_trace_records_every_call(tmp_path, generator):
    """trace_to writes one JSON record per operator call, forward and backward (autograd
    included), naming the backend that ran; None stops it."""
    cos, sin = torch.ones(5, 64), torch.zeros(5, 64)
    x = torch.randn(2, 5, 3, 128, generator=generator, requires_grad=True)
    w = torch.ones(128, requires_grad=True)
    path = tmp_path / "calls.jsonl"
    ka.trace_to(path)
    y = ka.multi_axis_rope(ka.qk_rmsnorm(x, w), cos, sin)
    y.sum().backward()
    ka.trace_to(None)
    ka.qk_rmsnorm(x.detach())  # not traced
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["op"], r["direction"]) for r in records] == [
        ("qk_rmsnorm", "forward"), ("multi_axis_rope", "forward"),
        ("multi_axis_rope", "backward"), ("qk_rmsnorm", "backward")]
    assert {r["backend"] for r in records} == {"simd"}
    assert records[0]["tensors"][0]["shape"] == [2, 5, 3, 128]


def test_strict_mode_runs_supported_calls(generator):
    """Strict mode refuses fallbacks only: a call the first-choice backend supports runs
    and reports no fallback."""
    ka.strict(True)
    assert ka.is_strict()
    before = ka.fallback_count()
    x = torch.randn(3, 128, generator=generator)
    y = ka.qk_rmsnorm(x)
    assert ka.last_call().fallback == "" and ka.fallback_count() == before
    assert 0.0 < ka.last_call().backend_seconds
    ka.strict(False)
    assert not ka.is_strict()
    assert_bitwise(ka.qk_rmsnorm(x), y)


def test_thread_count_does_not_change_bytes(generator):
    cos, sin = ka.rope_tables(ka.qwen_image_rope_positions([(1, 8, 8)], 4))
    q = torch.randn(3, 68, 5, 128, generator=generator).bfloat16()
    w = torch.randn(128, generator=generator).bfloat16()
    results = []
    for threads in (1, 2, 3):
        ka.set_num_threads(threads)
        assert ka.get_num_threads() == threads
        results.append(ka.qk_norm_rope(q, q, cos, sin, text_len=4, image_q_weight=w))
    for other in results[1:]:
        assert_bitwise(other[0], results[0][0])
        assert_bitwise(other[1], results[0][1])


def test_last_call_times_the_backend_within_the_call(generator):
    """backend_seconds is the C++ backend's share of the C++ library call, call_seconds,
    which is itself part of the whole call as Python sees it (compare_torch.py pairs
    the two)."""
    x = torch.randn(1, 64, 24, 128, generator=generator).to(torch.bfloat16)
    for _ in range(3):
        start = time.perf_counter()
        ka.qk_rmsnorm(x)
        whole = time.perf_counter() - start
        report = ka.last_call()
        assert 0.0 < report.backend_seconds <= report.call_seconds <= whole


def test_version_is_the_projects():
    """ka.__version__ comes from the extension, which has it from CMakeLists.txt's
    project(): the one source of the version."""
    cmake = (Path(__file__).resolve().parents[2] / "CMakeLists.txt").read_text()
    project = re.search(r"project\(kernel_align VERSION ([0-9.]+)", cmake).group(1)
    assert ka.__version__ == project
    assert re.fullmatch(r"kernel-align-contract/[0-9]+", ka.CONTRACT_VERSION)
