"""kernel_align.alignment (docs/alignment.md): module hooks that append per-sample
digest-v1 records to the library's trace, checked against digests recomputed here from
docs/trace.md's formula and against outputs captured by hooks of the test's own;
`kernel-align trace diff` on the model traces they write; bad arguments."""

from __future__ import annotations

import json
import warnings
import subprocess

import pytest
import torch

import kernel_align as ka
from kernel_align import alignment
from kernel_align.alignment import ROOT_NAME, digest_modules

MASK = (1 << 64) - 1


def digest_v1(data: bytes) -> str:
    """digest-v1 exactly as docs/trace.md writes it (pure Python)."""
    h = 0x9E3779B97F4A7C15 ^ len(data)
    data += bytes(-len(data) % 8)
    for i in range(0, len(data), 8):
        x = h ^ ((int.from_bytes(data[i:i + 8], "little") * 0xBF58476D1CE4E5B9) & MASK)
        h = ((((x << 27) | (x >> 37)) & MASK) * 0x94D049BB133111EB) & MASK
    h ^= h >> 31
    h = (h * 0xD6E8FEDA2F3F19D5) & MASK
    h ^= h >> 29
    return f"{h:016x}"


def logical_bytes(t: torch.Tensor) -> bytes:
    """The bytes of t's elements in row-major index order (x86-64: little-endian)."""
    return t.detach().resolve_conj().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def expected_digests(t: torch.Tensor, batch_dim: int | None) -> list[str]:
    if batch_dim is None:
        return [digest_v1(logical_bytes(t))]
    return [digest_v1(logical_bytes(t.select(batch_dim, b))) for b in range(t.shape[batch_dim])]


def read_trace(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def cli() -> str:
    try:
        return alignment.find_cli()
    except FileNotFoundError as e:
        pytest.skip(f"the kernel-align executable is not built ({e})")


def trace_diff(a, b, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([cli(), "trace", "diff", str(a), str(b), *extra], capture_output=True,
                          text=True)


# ---------------------------------------------------------------------------------------
# A small model whose every op computes each sample on its own: batch 4 and batch 1 give a
# sample the same bytes (a per-sample loop for the matrix product, elementwise ops), so
# that a divergence is one the test plants.

class PerSampleLinear(torch.nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n_out, n_in) / n_in ** 0.5)

    def forward(self, x):
        return torch.stack([torch.nn.functional.linear(s, self.weight) for s in x.unbind(0)])


class Perturb(torch.nn.Module):
    """Identity, or adds 1 to one batch element when planted."""

    def __init__(self):
        super().__init__()
        self.sample: int | None = None

    def forward(self, x):
        if self.sample is None:
            return x * 1
        out = x.clone()
        out[self.sample] += 1
        return out


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.linear = PerSampleLinear(width, width)
        self.act = torch.nn.Tanh()
        self.perturb = Perturb()

    def forward(self, x):
        # The activation runs twice: call indices 0 and 1.
        return self.perturb(self.act(self.linear(self.act(x))))


class Positions(torch.nn.Module):
    """A table that does not carry the batch (as RoPE frequencies), and the input."""

    def forward(self, x):
        return x, torch.arange(x.shape[1] * 3, dtype=torch.float32).reshape(x.shape[1], 3)


class Tiny(torch.nn.Module):
    def __init__(self, width=16, with_norm=False):
        super().__init__()
        self.positions = Positions()
        self.blocks = torch.nn.ModuleList([Block(width), Block(width)])
        # kernel-align's RMSNorm (a library call inside a module) or none.
        self.norm = ka.QkRmsNorm(width) if with_norm else None

    def forward(self, x):
        x, table = self.positions(x)
        for block in self.blocks:
            x = block(x)
        if self.norm is not None:
            x = self.norm(x)  # [B, S, H, D]
        return x + table.sum()


def tiny(with_norm=False):
    torch.manual_seed(0)
    return Tiny(with_norm=with_norm)


def batch(n=4, seed=0):
    # [B, S, H, D]: 4-D, as the library's ops take it.
    return torch.randn(n, 6, 2, 16, generator=torch.Generator().manual_seed(seed))


class Capture:
    """The test's own hooks: every module call's name and output, in firing order."""

    def __init__(self, model):
        self.calls = []
        self.handles = [m.register_forward_hook(self._hook(name or ROOT_NAME))
                        for name, m in model.named_modules()]

    def _hook(self, name):
        def hook(module, args, output):
            self.calls.append((name, type(module).__name__, output))
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def test_digests_are_the_documented_function():
    g = torch.Generator().manual_seed(3)
    base = torch.randn(3, 4, 5, 6, generator=g)
    cases = [base, base.permute(2, 0, 3, 1), base[:, 1:3, ::2], base.to(torch.bfloat16),
             base.to(torch.float16).transpose(1, 3), base[0, 0], torch.tensor(2.5),
             torch.randint(0, 100, (4, 7), generator=g), torch.randn(3, 5, dtype=torch.complex64,
                                                                     generator=g).conj(),
             torch.randn(2, 3, 2, 2, 3, generator=g)]
    for t in cases:
        for dim in [None, *range(t.dim())]:
            assert alignment.digests(t, dim) == expected_digests(t, dim), (t.shape, dim)
    # A changed element changes its batch element's digest only.
    changed = base.clone()
    changed[1, 2, 3, 4] += 1
    a, b = alignment.digests(base, 0), alignment.digests(changed, 0)
    assert [x == y for x, y in zip(a, b)] == [True, False, True]


def test_digests_bad_arguments():
    with pytest.raises(ValueError, match=r"argument 'batch_dim': expected a dim from 0 to 1 "
                                         r"\(the tensor's rank is 2\), found 2"):
        alignment.digests(torch.zeros(2, 3), 2)
    with pytest.raises(TypeError, match="argument 'tensor': expected a torch.Tensor"):
        alignment.digests([1.0, 2.0])


def test_hooks_record_every_module_call(tmp_path):
    model, x = tiny(), batch()
    capture = Capture(model)
    path = tmp_path / "run.jsonl"
    with digest_modules(model, path) as recorder:
        model(x)
    capture.remove()
    records = read_trace(path)
    assert recorder.records == len(records) == len(capture.calls)
    # Names in call order, every module (the model itself last: its hook fires last).
    assert [r["op"] for r in records] == [name for name, _, _ in capture.calls]
    assert records[-1]["op"] == ROOT_NAME
    # Every module that ran (the ModuleList holding the blocks is never called).
    assert {r["op"] for r in records} == {n or ROOT_NAME for n, m in model.named_modules()
                                          if not isinstance(m, torch.nn.ModuleList)}
    calls: dict[str, int] = {}
    for r, (name, type_name, output) in zip(records, capture.calls):
        assert r["kind"] == "module" and r["direction"] == "forward"
        assert r["module_type"] == type_name
        assert r["call"] == calls.get(name, 0)
        calls[name] = r["call"] + 1
        outputs = list(output) if isinstance(output, tuple) else [output]
        assert [t["name"] for t in r["tensors"]] == [f"out{i}" for i in range(len(outputs))]
        for entry, t in zip(r["tensors"], outputs):
            # Per sample where the size along dim 0 is the batch (4); the table of
            # positions, [6, 3], is digested whole.
            per_sample = t.shape[0] == 4
            assert entry["batch_dim"] == (0 if per_sample else None)
            assert entry["shape"] == list(t.shape) and entry["strides"] == list(t.stride())
            assert entry["dtype"] == "fp32"
            assert r["digests"][entry["name"]] == expected_digests(t, entry["batch_dim"])
    assert calls["blocks.0.act"] == 2 and calls["blocks.1.act"] == 2
    # One session, seq from 0 in file order.
    assert [r["seq"] for r in records] == list(range(len(records)))
    assert len({r["session"] for r in records}) == 1


def test_off_means_no_hooks_and_the_trace_is_restored(tmp_path):
    model = tiny()
    ka.trace_to(tmp_path / "outer.jsonl")
    with digest_modules(model, tmp_path / "inner.jsonl", backward=True):
        assert model.blocks[0].linear._forward_hooks
        assert model._forward_pre_hooks
    assert all(not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks
               for m in model.modules())
    assert torch.ops.kernel_align.get_trace_path() == str(tmp_path / "outer.jsonl")
    model(batch())  # no hook: nothing is written
    assert (tmp_path / "outer.jsonl").read_text() == ""
    assert (tmp_path / "inner.jsonl").read_text() == ""
    ka.trace_to(None)
    with digest_modules(model, tmp_path / "inner.jsonl"):
        pass
    assert torch.ops.kernel_align.get_trace_path() == ""


def test_selected_modules_by_name_and_type(tmp_path):
    model = tiny()
    path = tmp_path / "run.jsonl"
    with digest_modules(model, path, modules=["blocks.1.linear", torch.nn.Tanh]):
        model(batch())
    assert [r["op"] for r in read_trace(path)] == [
        "blocks.0.act", "blocks.0.act", "blocks.1.act", "blocks.1.linear", "blocks.1.act"]


def test_sample_alone_and_in_a_batch_of_four(tmp_path):
    """The trace diff of a batch of 4 against its sample 2 alone, --sample 2:0: identical;
    --sample 1:0 names the first module call, output and elements."""
    model, x = tiny(), batch()
    with digest_modules(model, tmp_path / "batch.jsonl"):
        model(x)
    with digest_modules(model, tmp_path / "alone.jsonl"):
        model(x[2:3].clone())
    same = trace_diff(tmp_path / "batch.jsonl", tmp_path / "alone.jsonl", "--sample", "2:0")
    assert same.returncode == 0, same.stdout + same.stderr
    assert same.stdout.startswith("identical: 12 module calls and 0 library calls")
    other = trace_diff(tmp_path / "batch.jsonl", tmp_path / "alone.jsonl", "--sample", "1:0")
    assert other.returncode == 1
    # positions' first output is the input itself: the first call that differs.
    first = read_trace(tmp_path / "batch.jsonl")[0]
    assert first["op"] == "positions"
    assert other.stdout.startswith(
        "diverged at module call positions #0 (forward) (A line 1, B line 1): output out0 "
        f"element 1 vs 0: {first['digests']['out0'][1]} != ")
    # Without --sample the batches themselves differ.
    assert trace_diff(tmp_path / "batch.jsonl", tmp_path / "alone.jsonl").returncode == 1


def test_a_planted_divergence_is_named_exactly(tmp_path):
    model, x = tiny(), batch()
    with digest_modules(model, tmp_path / "a.jsonl"):
        model(x)
    model.blocks[1].perturb.sample = 3
    with digest_modules(model, tmp_path / "b.jsonl"):
        model(x)
    result = trace_diff(tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    assert result.returncode == 1, result.stdout + result.stderr
    line = next(i for i, r in enumerate(read_trace(tmp_path / "a.jsonl"), 1)
                if r["op"] == "blocks.1.perturb")
    assert result.stdout.splitlines()[0].startswith(
        f"diverged at module call blocks.1.perturb #0 (forward) (A line {line}, B line {line}): "
        "output out0 element 3 vs 3: ")
    # The perturbation reaches blocks.1 and the model's output, nothing before it.
    assert "  Perturb: 1 matching, 1 differing, 0 missing" in result.stdout
    assert "  Block: 1 matching, 1 differing, 0 missing" in result.stdout
    assert "  Tiny: 0 matching, 1 differing, 0 missing" in result.stdout
    assert "  PerSampleLinear: 2 matching, 0 differing, 0 missing" in result.stdout


def test_backward_digests(tmp_path):
    model, x = tiny(), batch().requires_grad_()
    grads = {}

    def capture(name):
        def hook(module, grad_input, grad_output):
            grads.setdefault(name, []).append(grad_input)
        return hook

    handles = [model.blocks[0].linear.register_full_backward_hook(capture("blocks.0.linear")),
               model.blocks[1].act.register_full_backward_hook(capture("blocks.1.act"))]
    path = tmp_path / "run.jsonl"
    with digest_modules(model, path, backward=True):
        model(x).square().sum().backward()
    for h in handles:
        h.remove()
    records = read_trace(path)
    backward = [r for r in records if r["direction"] == "backward"]
    assert backward and records.index(backward[0]) > max(
        i for i, r in enumerate(records) if r["direction"] == "forward")
    for name, captured in grads.items():
        mine = [r for r in backward if r["op"] == name]
        assert [r["call"] for r in mine] == list(range(len(captured)))
        for r, grad_input in zip(mine, captured):
            assert r["tensors"][0]["name"] == "grad_in0"
            assert r["digests"]["grad_in0"] == expected_digests(grad_input[0], 0)
    # blocks.1.act runs twice: its backward calls count 0 and 1 (the second forward call
    # is the first backward one).
    assert len(grads["blocks.1.act"]) == 2


def test_library_records_interleave_in_call_order(tmp_path):
    model, x = tiny(with_norm=True), batch()
    with digest_modules(model, tmp_path / "with.jsonl"):
        model(x)
    records = read_trace(tmp_path / "with.jsonl")
    ops = [r["op"] if r.get("kind") == "module" else f"library:{r['op']}" for r in records]
    # The library's call is inside the norm module: its record precedes the module's.
    at = ops.index("library:qk_rmsnorm")
    assert ops[at + 1:at + 3] == ["norm", ROOT_NAME]
    assert "kind" not in records[at] and records[at]["digests"]["y"]
    assert [r["seq"] for r in records] == list(range(len(records)))
    assert len({r["session"] for r in records}) == 1
    # The same run again: identical, our op's call counted; one sample against a batch.
    with digest_modules(model, tmp_path / "again.jsonl"):
        model(x)
    result = trace_diff(tmp_path / "with.jsonl", tmp_path / "again.jsonl")
    assert result.returncode == 0, result.stdout
    assert result.stdout.startswith("identical: 13 module calls and 1 library calls")
    assert "  qk_rmsnorm (kernel-align): 1 matching, 0 differing, 0 missing" in result.stdout
    with digest_modules(model, tmp_path / "alone.jsonl"):
        model(x[2:3].clone())
    result = trace_diff(tmp_path / "with.jsonl", tmp_path / "alone.jsonl", "--sample", "2:0")
    assert result.returncode == 0, result.stdout
    # Against a run without our op: its call is missing, the rest matches.
    plain = tiny()
    with digest_modules(plain, tmp_path / "without.jsonl"):
        plain(x)
    result = trace_diff(tmp_path / "with.jsonl", tmp_path / "without.jsonl")
    assert result.returncode == 1
    assert "  qk_rmsnorm (kernel-align): 0 matching, 0 differing, 1 missing" in result.stdout


def test_bad_arguments(tmp_path):
    model = tiny()
    with pytest.raises(ValueError, match=r"argument 'modules': expected qualified names of the "
                                         r"model's modules \(\d+: .*\), found 'blocks.2.linear'"):
        with digest_modules(model, tmp_path / "t.jsonl", modules=["blocks.2.linear"]):
            pass
    with pytest.raises(ValueError, match="argument 'modules': expected module types present in "
                                         "the model, found Conv2d"):
        with digest_modules(model, tmp_path / "t.jsonl", modules=[torch.nn.Conv2d]):
            pass
    with pytest.raises(TypeError, match="argument 'modules'"):
        with digest_modules(model, tmp_path / "t.jsonl", modules=[3]):
            pass
    with pytest.raises(ValueError, match=r"argument 'batch_dim': expected a dim >= 0 \(an int\), "
                                         "found -1"):
        with digest_modules(model, tmp_path / "t.jsonl", batch_dim=-1):
            pass
    with pytest.raises(TypeError, match="argument 'model': expected a torch.nn.Module"):
        with digest_modules(lambda x: x, tmp_path / "t.jsonl"):
            pass
    with pytest.raises(ValueError, match=r"argument 'batch_dim': expected a dim below the rank 4 "
                                         r"of the model's first input tensor \(shape "
                                         r"\[4, 6, 2, 16\]\), found 4"):
        with digest_modules(model, tmp_path / "t.jsonl", batch_dim=4):
            model(batch())
    # A padded width equal to the batch: a per-position table [T, ...] would read as a
    # per-sample tensor, so the digests would be wrong; refused at the model's call.
    tokens = torch.ones(4, 4, dtype=torch.bool)
    tokens[0, 3] = False
    with pytest.raises(ValueError, match=r"argument 'tokens': expected a token count whose text "
                                         r"or joint sequence differs from the batch 4 .*found 4 "
                                         r"text tokens and 6 after them"):
        with digest_modules(model, tmp_path / "t.jsonl", tokens=tokens):
            model(batch())
    # The failed block left no hook behind.
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


# ---------------------------------------------------------------------------------------
# The real diffusers model and the check command.

def test_qwen_image_transformer_trace(tmp_path):
    pytest.importorskip("diffusers", reason="diffusers is not installed (requirements.txt)")
    from kernel_align.diffusers import KernelAlignQwenImageAttnProcessor

    model = alignment._build_model(layers=1, heads=2, dtype=torch.float32)
    inputs, _ = alignment._inputs((64, 64), [8] * 4, torch.float32, cfg=False, edit=False)
    model.set_attn_processor(KernelAlignQwenImageAttnProcessor())
    with digest_modules(model, tmp_path / "q.jsonl"):
        alignment._sampler_step(model, inputs)
    records = read_trace(tmp_path / "q.jsonl")
    ops = [r["op"] for r in records]
    fused = [i for i, r in enumerate(records) if r.get("kind") is None]
    assert [records[i]["op"] for i in fused] == ["qk_norm_rope", "attention"]
    # Our calls come after the six projections of their block and before the output ones.
    assert ops.index("transformer_blocks.0.attn.to_q") < fused[0]
    assert ops.index("transformer_blocks.0.attn.add_k_proj") < fused[0]
    assert ops.index("transformer_blocks.0.attn.to_out.0") > fused[1]
    # The RoPE frequencies do not carry the batch: one digest each.
    rope = records[ops.index("pos_embed")]
    assert [t["batch_dim"] for t in rope["tensors"]] == [None, None]


def test_check_command_equal_lengths(tmp_path, capsys):
    """--text-len: every prompt the same length, no padding, no CFG, forward only: the
    library's records are compared too, and under the contract everything is identical."""
    pytest.importorskip("diffusers", reason="diffusers is not installed (requirements.txt)")
    cli()
    out = tmp_path / "check.json"
    assert alignment.main(["check", "--layers", "1", "--image", "64x64", "--text-len", "8",
                           "--no-cfg", "--no-backward", "--dtype", "fp32", "--json", str(out),
                           "--keep", str(tmp_path / "traces")]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["model"]["padded_to"] is None and result["batch"] == 4
    assert [r["processor"] for r in result["results"]] == [
        "diffusers", "kernel-align", "kernel-align, full"]
    for r in result["results"]:
        assert r["first_divergent_module"] in printed
        diff = r["diff"]
        # The table says what trace diff found: identical exactly when it exited 0.
        assert (r["first_divergent_module"] == "identical") == (diff["exit"] == 0)
        assert (diff["first_divergence"] is None) == (diff["exit"] == 0)
    ours = result["results"][1]["diff"]["types"]["qk_norm_rope (kernel-align)"]
    assert sum(ours.values()) == 1  # one block, one fused call
    verdict = result["results"][1]["our_norm_rope_per_sample"]
    assert verdict.startswith("identical") == (ours["differing"] == 0)
    assert result["overhead"]["hook_calls"] > 0
    # Under the contract the sampler's slot and the trainer's sample agree everywhere.
    assert result["results"][2]["first_divergent_module"] == "identical"
    assert "attention (kernel-align)" in result["results"][2]["diff"]["types"]
    assert "adaln_modulation (kernel-align)" in result["results"][2]["diff"]["types"]


def test_check_command_padded_prompts_cfg_and_backward(tmp_path):
    """The defaults: prompts of different lengths padded to the longest with the mask,
    their negative prompts in the same batch, forward and backward; the trainer runs its
    prompt at its own length. Under the contract every module agrees over the valid
    tokens; diffusers' own configuration does not."""
    pytest.importorskip("diffusers", reason="diffusers is not installed (requirements.txt)")
    cli()
    out = tmp_path / "check.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the check keeps torch's hook warnings to itself
        assert alignment.main(["check", "--layers", "1", "--image", "64x64", "--dtype", "fp32",
                               "--json", str(out), "--keep", str(tmp_path / "traces")]) == 0
    result = json.loads(out.read_text())
    model = result["model"]
    assert model["backward"] is True and model["cfg"] is True
    assert model["text_lens"] == [32, 25, 20, 28] and model["padded_to"] == 32
    assert result["batch"] == 8
    diffusers, _, full = result["results"]
    assert diffusers["first_divergent_module"] != "identical"
    assert full["first_divergent_module"] == "identical"
    assert full["diff"]["exit"] == 0
    # Backward records were compared, and only module records (the library's digest the
    # padded width).
    trainer = [json.loads(line) for line in open(full["traces"]["trainer"])]
    assert {r["direction"] for r in trainer} == {"forward", "backward"}
    assert all(r.get("kind") == "module" for r in trainer)
    assert [r["seq"] for r in trainer] == list(range(len(trainer)))


def test_check_pads_past_a_width_equal_to_the_batch(tmp_path):
    """Prompts of 8 tokens with their negatives in one batch of 8: padded to 9, not 8 (a
    width equal to the batch would make digest_modules read the text RoPE table as one row
    per sample), and identical under the contract."""
    pytest.importorskip("diffusers", reason="diffusers is not installed (requirements.txt)")
    cli()
    out = tmp_path / "check.json"
    assert alignment.main(["check", "--layers", "1", "--image", "64x64", "--text-len", "8",
                           "--dtype", "fp32", "--no-backward", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["batch"] == 8 and result["model"]["padded_to"] == 9
    assert result["results"][2]["first_divergent_module"] == "identical"


def test_check_rejects_bad_lengths(capsys):
    with pytest.raises(SystemExit):
        alignment.main(["check", "--text-lens", "8,9"])
    with pytest.raises(SystemExit):
        alignment.main(["check", "--text-lens", "8,0,4"])
    # The trainer's text as long as the image (4x4 tokens): its tables could not be told apart.
    with pytest.raises(SystemExit):
        alignment.main(["check", "--image", "64x64", "--text-len", "16"])
    assert "expected the trainer's prompt (sample 2) to have a token count other than the " \
           "image's 16 when prompts are padded, found 16" in capsys.readouterr().err
