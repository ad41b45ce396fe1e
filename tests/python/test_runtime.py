"""The registry settings seen from Python: strict mode, trace records, thread count."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import torch

import kernel_align as ka
from kernel_align import alignment
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


def test_forked_workers_trace_sessions_of_their_own(tmp_path):
    """A forked process (a DataLoader worker) writes its records in a session of its own,
    numbered from 0, so that the file stays a trace: sharing the parent's session, the
    two children and the parent each wrote seq 1, and ``trace diff`` refused the file."""
    path = tmp_path / "forked.jsonl"
    x = torch.randn(2, 128)
    ka.trace_to(path)
    try:
        ka.qk_rmsnorm(x)
        fork = multiprocessing.get_context("fork")
        workers = [fork.Process(target=ka.qk_rmsnorm, args=(x,)) for _ in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert [w.exitcode for w in workers] == [0, 0]
        ka.qk_rmsnorm(x)
    finally:
        ka.trace_to(None)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 4
    parent = [r for r in records if r["pid"] == os.getpid()]
    children = [r for r in records if r["pid"] != os.getpid()]
    assert [r["seq"] for r in parent] == [0, 1]
    assert len({r["session"] for r in parent}) == 1
    assert {r["pid"] for r in children} == {w.pid for w in workers}
    assert [r["seq"] for r in children] == [0, 0]
    assert len({r["session"] for r in children} | {parent[0]["session"]}) == 3
    try:
        cli = alignment.find_cli()
    except FileNotFoundError as e:
        pytest.skip(f"the kernel-align executable is not built ({e})")
    diff = subprocess.run([cli, "trace", "diff", str(path), str(path)], capture_output=True,
                          text=True)
    assert diff.returncode == 0, diff.stdout + diff.stderr
    assert diff.stdout.startswith("identical: 4 calls"), diff.stdout


def test_trace_path_with_a_nul_is_refused(tmp_path):
    """A NUL would end the path the kernel sees ('/tmp/a\\0/etc/x' traced to /tmp/a while
    the trace path said otherwise): a ValueError, as open() raises, and tracing stays as
    it was."""
    ka.trace_to(tmp_path / "kept.jsonl")
    try:
        with pytest.raises(ValueError, match="argument 'path'.*NUL"):
            ka.trace_to(str(tmp_path / "a") + "\0/evil.jsonl")
        assert torch.ops.kernel_align.get_trace_path() == str(tmp_path / "kept.jsonl")
    finally:
        ka.trace_to(None)
    assert not (tmp_path / "a").exists()


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
