"""Where do two runs of a model part bits? Per-sample digests of every module call of
any PyTorch model, in the trace the library writes its own records to, and the check
that compares a sampler with a trainer (docs/alignment.md).

    from kernel_align.alignment import digest_modules
    with digest_modules(model, "sampler.jsonl"):
        model(batch)                       # one record per module call
    # ... the same for the trainer's run, then:
    #   kernel-align trace diff sampler.jsonl trainer.jsonl --sample 2:0

``python -m kernel_align.alignment check`` runs that comparison on a small randomly
initialised Qwen-Image transformer, with diffusers' attention processor and with
kernel-align's, and prints where the two runs first differ.

``ROOT_NAME`` ("(root)") is the name the model itself has in its records.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from . import _cli
from ._ops import ops

__all__ = ["digest_modules", "digests", "find_cli", "ROOT_NAME"]

# The name the model itself gets in its records (named_modules() calls it "").
ROOT_NAME = "(root)"

# The library's dtype names (docs/trace.md) where it has them; torch's otherwise.
_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def digests(tensor: torch.Tensor, batch_dim: int | None = None) -> list[str]:
    """digest-v1 (docs/trace.md) of each index of ``batch_dim`` of ``tensor``, or one of
    the whole tensor when ``batch_dim`` is None, as 16 hex digits: computed by the C++
    library's digest code, the one its own trace records use. Any dtype; a device tensor
    is copied to the host to be digested."""
    if not isinstance(tensor, torch.Tensor):
        kind = type(tensor)
        raise TypeError("kernel_align.alignment.digests: argument 'tensor': expected a torch.Tensor, "
                        f"found {kind.__module__}.{kind.__qualname__}")
    return list(ops.digests(tensor.detach(), batch_dim))


def _dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype) or str(dtype).removeprefix("torch.")


def _flatten(value, found: list) -> list:
    """The tensors of a module's output in order: a tensor, tuples and lists, dicts (and
    diffusers' output classes, which are dicts) by value, dataclasses by field. Anything
    else holds no tensor for the record; None keeps its place (a missing gradient)."""
    if value is None or isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _flatten(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _flatten(item, found)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _flatten(getattr(value, f.name), found)
    return found


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    for value in (*args, *kwargs.values()):
        tensors = [t for t in _flatten(value, []) if t is not None]
        if tensors:
            return tensors[0]
    return None


class _Recorder:
    """The hooks of one ``digest_modules`` block."""

    def __init__(self, model: torch.nn.Module, path, modules, batch_dim: int, backward: bool,
                 tokens: torch.Tensor | None = None):
        if not isinstance(model, torch.nn.Module):
            kind = type(model)
            raise TypeError("kernel_align.digest_modules: argument 'model': expected a "
                            f"torch.nn.Module, found {kind.__module__}.{kind.__qualname__}")
        if isinstance(batch_dim, bool) or not isinstance(batch_dim, int) or batch_dim < 0:
            raise ValueError("kernel_align.digest_modules: argument 'batch_dim': expected a "
                             f"dim >= 0 (an int), found {batch_dim!r}")
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise ValueError("kernel_align.digest_modules: argument 'path': expected a trace "
                             f"file path, found {path!r}")
        self.model = model
        self.path = os.fspath(path)
        self.batch_dim = batch_dim
        self.backward = backward
        if tokens is not None and (not isinstance(tokens, torch.Tensor) or tokens.dim() != 2
                                   or tokens.dtype != torch.bool):
            raise ValueError("kernel_align.digest_modules: argument 'tokens': expected None or "
                             f"a bool tensor [batch, tokens], found {tokens!r}")
        self.tokens = tokens
        self.tokens_after = 0  # tokens after the masked ones in a joint sequence (the image's)
        self.selected = self._select(model, modules)
        self.batch: int | None = None  # the batch of the model call in progress
        self.calls: dict[tuple[str, str], int] = {}
        self.records = 0
        self.handles: list = []
        self.previous_trace: str | None = None

    @staticmethod
    def _select(model, modules) -> list[tuple[str, torch.nn.Module]]:
        named = [(name or ROOT_NAME, m) for name, m in model.named_modules()]
        if modules is None:
            return named
        if isinstance(modules, (str, type)):
            modules = [modules]
        wanted = list(modules)
        names = {name for name, _ in named}
        for w in wanted:
            if isinstance(w, str):
                if w not in names:
                    known = sorted(names)
                    shown = ", ".join(known[:8]) + (", ..." if len(known) > 8 else "")
                    raise ValueError(
                        "kernel_align.digest_modules: argument 'modules': expected qualified "
                        f"names of the model's modules ({len(known)}: {shown}), found {w!r}")
            elif isinstance(w, type) and issubclass(w, torch.nn.Module):
                if not any(isinstance(m, w) for _, m in named):
                    raise ValueError(
                        "kernel_align.digest_modules: argument 'modules': expected module "
                        f"types present in the model, found {w.__qualname__} (no module of it)")
            else:
                raise TypeError("kernel_align.digest_modules: argument 'modules': expected "
                                "module names (str) or torch.nn.Module subclasses, found "
                                f"{w!r}")
        return [(name, m) for name, m in named
                if name in wanted or any(isinstance(w, type) and isinstance(m, w)
                                         for w in wanted)]

    # -- hooks --------------------------------------------------------------------------

    def _root_pre_hook(self, module, args, kwargs):
        # The batch is the size along batch_dim of the model's first input tensor: an
        # output whose size there is another one (a table of positions) is not per sample.
        first = _first_tensor(args, kwargs)
        if first is None:
            self.batch = None
            return
        if first.dim() <= self.batch_dim:
            raise ValueError(
                "kernel_align.digest_modules: argument 'batch_dim': expected a dim below the "
                f"rank {first.dim()} of the model's first input tensor (shape "
                f"{list(first.shape)}), found {self.batch_dim}")
        self.batch = first.shape[self.batch_dim]
        if self.tokens is not None:
            # The model's first input is the image stream, [B, image tokens, C].
            self.tokens_after = first.shape[1] if first.dim() > 1 else 0
            if self.tokens_after == self.tokens.shape[1]:
                raise ValueError(
                    "kernel_align.digest_modules: argument 'tokens': expected a token count "
                    f"other than the model's first input's {self.tokens_after} (whose tensors "
                    "could not be told apart), found the same")
            # A sample alone with every token valid reads the same either way.
            if (self.batch in (self.tokens.shape[1], self.tokens.shape[1] + self.tokens_after)
                    and not (self.batch == 1 and bool(self.tokens.all()))):
                # A per-position table [T, ...] would look like a per-sample tensor.
                raise ValueError(
                    "kernel_align.digest_modules: argument 'tokens': expected a token count "
                    f"whose text or joint sequence differs from the batch {self.batch} (a "
                    "per-position table could not be told from a per-sample tensor), found "
                    f"{self.tokens.shape[1]} text tokens and {self.tokens_after} after them")

    def _record(self, name: str, module: torch.nn.Module, direction: str, prefix: str,
                values) -> None:
        key = (name, direction)
        call = self.calls.get(key, 0)
        self.calls[key] = call + 1
        tensors, digest_lists = [], {}
        for index, t in enumerate(_flatten(values, [])):
            if t is None:
                continue
            out = f"{prefix}{index}"
            per_sample = t.dim() > self.batch_dim and (
                self.batch is None or t.shape[self.batch_dim] == self.batch)
            batch_dim = self.batch_dim if per_sample else None
            # With tokens: a sample's valid tokens of a per-sample tensor (dim 1 the tokens'),
            # or its rows of a per-position table (dim 0).
            token_digests = self._valid_token_digests(t, 1 if per_sample else 0)
            if token_digests is not None:
                batch_dim = self.batch_dim
            tensors.append({"name": out, "dtype": _dtype_name(t.dtype), "shape": list(t.shape),
                            "strides": list(t.stride()), "batch_dim": batch_dim})
            digest_lists[out] = token_digests or digests(t, batch_dim)
        record = {"kind": "module", "op": name, "module_type": type(module).__name__,
                  "call": call, "direction": direction, "tensors": tensors,
                  "digests": digest_lists}
        text = json.dumps(record, separators=(",", ":"))
        # The members after the library's "seq", "session" and "pid": the library numbers
        # and writes the record, in one write, in the same sequence as its own records.
        if ops.append_trace_record("," + text[1:-1]):
            self.records += 1

    def _valid_token_digests(self, t: torch.Tensor, dim: int) -> list[str] | None:
        """With ``tokens`` [B, T]: one digest per sample of the valid tokens along ``dim`` of
        ``t`` (dim 1 of a per-sample tensor, whose sample i is taken; dim 0 of a
        per-position table, shared by the samples), when that dim's size is T (the text)
        or T + N (the joint [text, image] sequence: the N image tokens all valid); None
        for any other tensor."""
        if self.tokens is None or self.batch_dim != 0 or t.dim() <= dim:
            return None
        batch, width = self.tokens.shape
        if dim == 1 and t.shape[0] != batch:
            return None
        if t.shape[dim] == width:
            keep = self.tokens
        elif self.tokens_after and t.shape[dim] == width + self.tokens_after:
            keep = torch.cat([self.tokens, self.tokens.new_ones(batch, self.tokens_after)], 1)
        else:
            return None
        keep = keep.to(t.device)
        if dim == 1:
            return [digests(t[i:i + 1, keep[i]], 0)[0] for i in range(batch)]
        return [digests(t[keep[i]])[0] for i in range(batch)]

    def _forward_hook(self, name: str):
        def hook(module, args, output):
            self._record(name, module, "forward", "out", output)
        return hook

    def _backward_hook(self, name: str):
        def hook(module, grad_input, grad_output):
            # What the module's backward computed: the gradients of its inputs.
            self._record(name, module, "backward", "grad_in", grad_input)
        return hook

    # -- the block ----------------------------------------------------------------------

    def __enter__(self) -> "_Recorder":
        self.previous_trace = ops.get_trace_path()
        same = bool(self.previous_trace) and (
            os.path.abspath(self.previous_trace) == os.path.abspath(self.path))
        if not same:
            # The library's own records go to the same file, in one sequence with ours.
            ops.set_trace_path(self.path)
        try:
            self.handles.append(self.model.register_forward_pre_hook(
                self._root_pre_hook, with_kwargs=True))
            for name, module in self.selected:
                self.handles.append(module.register_forward_hook(self._forward_hook(name)))
                if self.backward:
                    self.handles.append(
                        module.register_full_backward_hook(self._backward_hook(name)))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        # Off means no hooks at all: every handle is removed.
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        if ops.get_trace_path() != self.previous_trace:
            ops.set_trace_path(self.previous_trace or "")


@contextlib.contextmanager
def digest_modules(model: torch.nn.Module, path: str | os.PathLike,
                   modules: Iterable[str | type] | str | type | None = None, batch_dim: int = 0,
                   backward: bool = False,
                   tokens: torch.Tensor | None = None) -> Iterator[_Recorder]:
    """Within the block, every call of every submodule of ``model`` (or of the modules
    named in ``modules``, by qualified name as ``named_modules()`` gives it, the model
    itself being "(root)", or by type) appends one record to the trace ``path``
    (docs/trace.md): the module's name as ``op``, its class, the call's index, dtype,
    shape, strides and digest-v1 of each output tensor, one digest per index of
    ``batch_dim`` for a tensor whose size there is the batch of the model's first input
    (one for the whole tensor otherwise). ``backward=True`` adds full backward hooks:
    records of direction "backward" with the gradients of each module's inputs
    (``grad_in0``, ...). The library's own calls in the block are traced to the same
    file, between the module records, in call order. Nothing but digests is stored.
    ``tokens``, a bool ``[B, T]`` mask of the valid tokens of padded prompts (diffusers'
    ``encoder_hidden_states_mask``; batch_dim 0), digests a sample of a tensor ``[B, T, ...]``
    over its valid tokens only, and of a joint ``[B, T + N, ...]`` (N: the tokens of the
    model's first input, the image's) over its valid text tokens and all N: so a padded
    sample's records compare with those of the same prompt run at its own length. T must
    differ from N, and T and T + N from the batch (a per-position table ``[T, ...]`` could
    not be told from a per-sample tensor): the model's call raises ValueError otherwise,
    except for one sample whose every token is valid (either reading keeps every token).

    The trace is the library's (``trace_to``): it is opened on ``path`` for the block
    (unless already open there) and set back afterwards; the hooks are removed on exit.
    """
    recorder = _Recorder(model, path, modules, batch_dim, backward, tokens)
    with recorder:
        yield recorder


# ---------------------------------------------------------------------------------------
# python -m kernel_align.alignment check

_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
AXES = (16, 56, 56)  # Qwen-Image's axes_dims_rope
HEAD_DIM = 128  # Qwen-Image's attention_head_dim
SLOT = 2  # the sampler's batch slot that the trainer runs alone
TEXT_LENS = (32, 25, 20, 28)  # the default prompts' lengths: padded to 32 in the batch


def _image(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)x(\d+)", text)
    if not match or int(match[1]) % 16 or int(match[2]) % 16 or not int(match[1]) * int(match[2]):
        raise argparse.ArgumentTypeError(
            f"expected WIDTHxHEIGHT in pixels, multiples of 16 (the VAE's 8 times the patch's "
            f"2), such as 256x256, found {text!r}")
    return int(match[1]), int(match[2])


def _lengths(text: str) -> list[int]:
    parts = text.split(",")
    if len(parts) <= SLOT or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(
            f"expected at least {SLOT + 1} whole numbers >= 1, comma-separated (the prompts' "
            f"token counts; sample {SLOT} is the trainer's), found {text!r}")
    return [int(p) for p in parts]


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, found {text!r}")
    return int(text)


def find_cli(given: str | None = None) -> str:
    """The kernel-align executable whose `trace diff` compares traces: ``given``, else
    $KERNEL_ALIGN_CLI, else the one installed with this package (the wheel's), else the
    README set-up's build/release/kernel-align beside this (editable) package, else
    kernel-align on PATH. FileNotFoundError if none is."""
    candidates = [given] if given else [
        os.environ.get("KERNEL_ALIGN_CLI"),
        _cli.executable(),
        # The README's set-up builds it beside the sources of this editable package.
        str(Path(__file__).resolve().parents[2] / "build" / "release" / "kernel-align"),
        shutil.which("kernel-align"),
    ]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError(
        "kernel_align.alignment: argument '--cli': expected the kernel-align executable (built "
        "by scripts/setup.sh as build/release/kernel-align; or KERNEL_ALIGN_CLI), found "
        f"{given or 'none of ' + str(candidates[1:])}")


def _build_model(layers: int, heads: int, dtype: torch.dtype):
    from diffusers import QwenImageTransformer2DModel
    from diffusers.utils import logging as diffusers_logging

    torch.manual_seed(0)
    model = QwenImageTransformer2DModel(
        patch_size=2, in_channels=64, out_channels=16, num_layers=layers,
        attention_head_dim=HEAD_DIM, num_attention_heads=heads, joint_attention_dim=64,
        axes_dims_rope=AXES)
    # Norm weights away from their initial ones, so that they matter.
    for name, parameter in model.named_parameters():
        if "norm" in name:
            parameter.data.normal_(1.0, 0.2)
    # diffusers warns that .to() of a model it did not load may cast modules it would keep
    # in fp32; this model has none (it lists them: []), so the warning would only be noise.
    verbosity = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()
    try:
        return model.to(dtype)
    finally:
        diffusers_logging.set_verbosity(verbosity)


def _negative_len(text_len: int) -> int:
    """The length of the negative prompt paired with a prompt of ``text_len`` tokens under
    true CFG (shorter, and different for prompts of different lengths)."""
    return max(1, text_len * 2 // 5)


def _batch_lens(text_lens: list[int], cfg: bool) -> list[int]:
    """The text lengths of the sampler's batch: the prompts', then (true CFG) their negative
    prompts'."""
    return list(text_lens) + ([_negative_len(n) for n in text_lens] if cfg else [])


def _image_tokens(image: tuple[int, int], edit: bool) -> int:
    """A sample's image tokens: VAE /8, then 2x2 patches; Edit adds a reference image's."""
    return (image[0] // 16) * (image[1] // 16) * (2 if edit else 1)


def _inputs(image: tuple[int, int], text_lens: list[int], dtype: torch.dtype, cfg: bool,
            edit: bool):
    """The sampler's batch: one sample per prompt of ``text_lens`` tokens (latents, text
    embeddings, timesteps), and with ``cfg`` the same samples again with their negative
    prompts (true CFG's unconditional pass, in the same batch); every prompt padded to the
    longest (longer where that width equals the batch or the image tokens, which
    digest_modules could not tell apart), ``encoder_hidden_states_mask`` marking its tokens
    when the lengths differ.
    With ``edit`` the image stream is the target's tokens followed by a reference image's
    (Qwen-Image-Edit)."""
    grid_h, grid_w = image[1] // 16, image[0] // 16  # VAE /8, then 2x2 patches
    images = 2 if edit else 1
    lens = _batch_lens(text_lens, cfg)
    batch, width = len(lens), max(lens)
    image_tokens = _image_tokens(image, edit)
    if len(set(lens)) > 1:
        # A padded width that digest_modules could not tell from the batch or the image
        # stream gets more padding (which, under the contract, changes no valid byte).
        while width in (batch, image_tokens) or width + image_tokens == batch:
            width += 1
    g = torch.Generator().manual_seed(42)
    latents = torch.randn(len(text_lens), image_tokens, 64, generator=g)
    text = torch.randn(batch, width, 64, generator=g)
    timestep = torch.rand(len(text_lens), generator=g)
    mask = torch.arange(width)[None, :] < torch.tensor(lens)[:, None]
    copies = 2 if cfg else 1
    inputs = dict(
        hidden_states=latents.repeat(copies, 1, 1).to(dtype),
        encoder_hidden_states=(text * mask[..., None]).to(dtype),
        timestep=timestep.repeat(copies).to(dtype),
        img_shapes=[[(1, grid_h, grid_w)] * images] * batch,
    )
    if len(set(lens)) > 1:
        inputs["encoder_hidden_states_mask"] = mask
    return inputs, lens


def _slot(inputs: dict, slot: int, text_len: int) -> dict:
    """The trainer's batch of one: the sampler's sample ``slot``, copied, at its own prompt
    length (no padding, no mask)."""
    return dict(hidden_states=inputs["hidden_states"][slot:slot + 1].clone(),
                encoder_hidden_states=inputs["encoder_hidden_states"][slot:slot + 1,
                                                                      :text_len].clone(),
                timestep=inputs["timestep"][slot:slot + 1].clone(),
                img_shapes=inputs["img_shapes"][slot:slot + 1])


def _drop_library_records(path: Path) -> None:
    """Keeps a trace's module records only, numbered again from 0 in each session (as
    docs/trace.md's seq is): the library's own records digest a padded sample over the
    batch's whole width, which a sample at its own length cannot match."""
    kept, seqs = [], {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") != "module":
            continue
        session = record.get("session")
        record["seq"] = seqs.get(session, 0)
        seqs[session] = record["seq"] + 1
        kept.append(json.dumps(record, separators=(",", ":")) + "\n")
    path.write_text("".join(kept))


def _with_grad(inputs: dict) -> dict:
    """The inputs with gradients asked for the latents and the text: the backward records
    then reach the first modules."""
    return {name: value.detach().clone().requires_grad_() if name in (
        "hidden_states", "encoder_hidden_states") else value for name, value in inputs.items()}


def _sampler_step(model, inputs, backward: bool = False):
    if backward:
        # A batched training step: the same forward with gradients, and the backward of
        # the sum of the outputs (each sample's gradient independent of the others').
        return _trainer_step(model, inputs, backward)
    with torch.inference_mode():
        return model(**inputs).sample


def _trainer_step(model, inputs, backward: bool = False):
    with torch.enable_grad():
        if not backward:
            return model(**inputs).sample
        with warnings.catch_warnings():
            # The recorder's full backward hooks sit on modules whose outputs are not all
            # tensors (the model returns a Transformer2DModelOutput); torch says so per call.
            warnings.filterwarnings("ignore", message=r"(Full backward hook|For backward hooks "
                                    r"to be called)")
            output = model(**_with_grad(inputs)).sample
            output.float().sum().backward()
        return output


_DIVERGED = re.compile(r"diverged at (module|library) call (\S+) #(\d+) \((\w+)\) \([^)]*\): (.*)")
_SUMMARY = re.compile(r"  (.+): (\d+) matching, (\d+) differing, (\d+) missing")
_OUR_OP = "qk_norm_rope (kernel-align)"


def _diff(cli: str, a: Path, b: Path) -> dict:
    """`kernel-align trace diff A B --sample 2:0`, and what it printed, parsed."""
    run = subprocess.run([cli, "trace", "diff", str(a), str(b), "--sample", f"{SLOT}:0"],
                         capture_output=True, text=True)
    if run.returncode not in (0, 1):
        raise SystemExit(f"kernel_align.alignment check: trace diff failed ({run.returncode}): "
                         f"{run.stderr.strip()}")
    lines = run.stdout.splitlines()
    result = {"exit": run.returncode, "first_line": lines[0] if lines else "",
              "first_divergence": None, "types": {}}
    match = _DIVERGED.match(result["first_line"])
    if match:
        result["first_divergence"] = {"kind": match[1], "name": match[2], "call": int(match[3]),
                                      "direction": match[4], "reason": match[5]}
    for line in lines:
        if m := _SUMMARY.fullmatch(line):
            result["types"][m[1]] = {"matching": int(m[2]), "differing": int(m[3]),
                                     "missing": int(m[4])}
    return result


def _verdict(diff: dict, with_our_ops: bool, padded: bool) -> tuple[str, str]:
    """The table's two cells: the first divergent module call, and our ops' verdict."""
    first = diff["first_divergence"]
    if first is None:
        where = "identical"
    else:
        where = f"{first['name']} #{first['call']}: {first['reason'].split(':')[0]}"
    if not with_our_ops:
        return where, "not used (diffusers' own norm and RoPE)"
    if padded:
        # The library's records digest the batch's whole padded width: left out.
        return where, "not compared (padded prompts: modules are, over valid tokens)"
    ours = diff["types"].get(_OUR_OP)
    if ours is None:
        return where, "no calls recorded"
    calls = ours["matching"] + ours["differing"] + ours["missing"]
    if ours["differing"] == 0 and ours["missing"] == 0:
        return where, f"identical ({calls} of {calls} calls)"
    if first is not None and first["kind"] == "module":
        # The first divergence came before any call of ours differed: what reached our
        # ops was already different, so their outputs cannot be equal.
        return where, (f"differ ({ours['differing']} of {calls} calls): inputs already differ "
                       f"(first: {first['name']})")
    return where, f"differ ({ours['differing']} of {calls} calls) with identical inputs"


def check(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kernel_align.alignment check",
        description="A small random Qwen-Image transformer run as a sampler (a batch of "
                    "prompts of different lengths padded to the longest, with their negative "
                    "prompts: true CFG) and as a trainer (sample 2 alone at its own length, "
                    "grad enabled), forward and backward, with diffusers' attention "
                    "processor, with kernel-align's, and with the whole model under the "
                    "contract: where do the two runs' bits first part? (docs/alignment.md)")
    parser.add_argument("--layers", type=_positive, default=2)
    parser.add_argument("--heads", type=_positive, default=2)
    parser.add_argument("--image", type=_image, default=(256, 256), help="WIDTHxHEIGHT pixels")
    parser.add_argument("--text-lens", type=_lengths, default=list(TEXT_LENS),
                        help="the prompts' token counts, comma-separated (default "
                             f"{','.join(map(str, TEXT_LENS))}; padded to the longest)")
    parser.add_argument("--text-len", type=_positive,
                        help="every prompt this many tokens (no padding; overrides --text-lens)")
    parser.add_argument("--no-cfg", dest="cfg", action="store_false",
                        help="no negative prompts in the batch")
    parser.add_argument("--edit", action="store_true",
                        help="Qwen-Image-Edit: a reference image's tokens after the target's")
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="bf16")
    parser.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    parser.add_argument("--keep", metavar="DIR", help="keep the four traces in DIR")
    parser.add_argument("--cli", metavar="PATH", help="the kernel-align executable")
    parser.add_argument("--backward", action=argparse.BooleanOptionalAction, default=True,
                        help="also digest the backward pass (the gradients of every module's "
                             "inputs; the sampler then runs its batch with gradients): on by "
                             "default, --no-backward compares the forward only")
    args = parser.parse_args(argv)
    if args.text_len is not None:
        args.text_lens = [args.text_len] * len(TEXT_LENS)
    image_tokens = _image_tokens(args.image, args.edit)
    padded = len(set(_batch_lens(args.text_lens, args.cfg))) > 1
    if padded and args.text_lens[SLOT] == image_tokens:
        # Its digests over valid tokens could not tell its text tables from the image's.
        parser.error(f"--text-lens/--text-len: expected the trainer's prompt (sample {SLOT}) "
                     f"to have a token count other than the image's {image_tokens} when "
                     f"prompts are padded, found {args.text_lens[SLOT]}")
    started = time.perf_counter()
    try:
        from .diffusers import KernelAlignQwenImageAttnProcessor, under_contract
        from diffusers.models.transformers.transformer_qwenimage import (
            QwenDoubleStreamAttnProcessor2_0)
    except ImportError as e:
        raise SystemExit(f"kernel_align.alignment check: needs diffusers ({e}); "
                         "pip install -r requirements.txt") from e
    try:
        cli = find_cli(args.cli)
    except FileNotFoundError as e:
        raise SystemExit(str(e)) from e
    dtype = _DTYPES[args.dtype]
    model = _build_model(args.layers, args.heads, dtype)
    inputs, lens = _inputs(args.image, args.text_lens, dtype, args.cfg, args.edit)
    trainer_inputs = _slot(inputs, SLOT, lens[SLOT])
    width = inputs["encoder_hidden_states"].shape[1]
    tokens = inputs["encoder_hidden_states_mask"] if padded else None
    # The trainer's prompt is all valid tokens: digested as the sampler's valid ones are.
    trainer_tokens = torch.ones(1, lens[SLOT], dtype=torch.bool) if padded else None
    directory = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="ka_alignment_"))
    directory.mkdir(parents=True, exist_ok=True)

    # The hooks' cost: the same sampler step without hooks and with them, alternately
    # after a warm-up, the best of five each (the machine may be busy with other work:
    # the minimum is the run least disturbed by it).
    model.set_attn_processor(QwenDoubleStreamAttnProcessor2_0())
    _sampler_step(model, inputs)
    plain, hooked, hook_calls = [], [], 0
    for n in range(5):
        t0 = time.perf_counter()
        _sampler_step(model, inputs)
        plain.append(time.perf_counter() - t0)
        scratch = directory / f"overhead{n}.jsonl"
        scratch.unlink(missing_ok=True)
        t0 = time.perf_counter()
        with digest_modules(model, scratch, tokens=tokens) as recorder:
            _sampler_step(model, inputs)
        hooked.append(time.perf_counter() - t0)
        hook_calls = recorder.records
        scratch.unlink()
    overhead = {"step_s": min(plain), "hooked_step_s": min(hooked), "hook_calls": hook_calls,
                "per_call_us": (min(hooked) - min(plain)) / hook_calls * 1e6,
                "share": (min(hooked) - min(plain)) / min(plain)}

    results = []
    # (label, attention processor, whether the whole model is under_contract)
    configurations = (("diffusers", QwenDoubleStreamAttnProcessor2_0, False),
                      ("kernel-align", KernelAlignQwenImageAttnProcessor, False),
                      ("kernel-align, full", KernelAlignQwenImageAttnProcessor, True))
    for label, processor, full in configurations:
        model.set_attn_processor(processor())
        traces = {}
        for role, step, step_inputs, step_tokens in (
                ("sampler", _sampler_step, inputs, tokens),
                ("trainer", _trainer_step, trainer_inputs, trainer_tokens)):
            path = directory / f"{label.replace(', ', '-').replace(' ', '_')}-{role}.jsonl"
            path.unlink(missing_ok=True)  # traces are appended to
            with (under_contract(model) if full else contextlib.nullcontext()), \
                    digest_modules(model, path, backward=args.backward, tokens=step_tokens):
                step(model, step_inputs, args.backward)
            if padded:
                _drop_library_records(path)
            traces[role] = path
        diff = _diff(cli, traces["sampler"], traces["trainer"])
        where, ours = _verdict(diff, processor is KernelAlignQwenImageAttnProcessor, padded)
        # The module types that differ anywhere, the first divergence's first.
        differing = [t for t, c in diff["types"].items() if c["differing"] or c["missing"]]
        results.append({"processor": label, "first_divergent_module": where,
                        "our_norm_rope_per_sample": ours, "differing_types": differing,
                        "diff": diff, "traces": {k: str(v) for k, v in traces.items()}})

    wall = time.perf_counter() - started
    w, h = args.image
    print(f"kernel-align alignment check: QwenImageTransformer2DModel, {args.layers} layers, "
          f"{args.heads} heads x {HEAD_DIM}, axes {AXES}, {w}x{h} image"
          f"{' + a reference image (Edit)' if args.edit else ''}, {args.dtype}, random weights")
    sampler_mode = "grad enabled, forward and backward" if args.backward else "inference_mode"
    prompts = ", ".join(map(str, args.text_lens))
    negatives = ", ".join(str(n) for n in lens[len(args.text_lens):])
    print(f"sampler: batch of {len(lens)}: prompts of {prompts} tokens"
          f"{f' and their negative prompts of {negatives} (true CFG)' if args.cfg else ''}"
          f"{f', padded to {width} with the mask' if padded else ''}; {sampler_mode}")
    print(f"trainer: sample {SLOT} alone, {lens[SLOT]} tokens, grad enabled"
          f"{', forward and backward' if args.backward else ''}; compared as trace diff "
          f"--sample {SLOT}:0{' over valid tokens' if padded else ''}")
    rows = [("attention processor", "first divergent module call",
             "our norm+RoPE calls, per sample")]
    rows += [(r["processor"], r["first_divergent_module"], r["our_norm_rope_per_sample"])
             for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for n, row in enumerate(rows):
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if n == 0:
            print("  ".join("-" * widths[i] for i in range(3)))
    for r in results:
        if r["differing_types"]:
            print(f"{r['processor']}: module types that differ: "
                  f"{', '.join(r['differing_types'])}")
    print(f"hooks: {overhead['hook_calls']} module calls recorded per sampler step, "
          f"{overhead['per_call_us']:.0f} us each ({overhead['share']:.1%} of a "
          f"{overhead['step_s'] * 1e3:.0f} ms step)")
    print(f"traces: {directory}{'' if args.keep else ' (temporary; --keep DIR keeps them)'}; "
          f"wall time {wall:.1f} s")
    if args.json:
        document = {"model": {"layers": args.layers, "heads": args.heads, "head_dim": HEAD_DIM,
                              "axes_dims_rope": list(AXES), "image": f"{w}x{h}",
                              "text_lens": args.text_lens, "cfg": args.cfg, "edit": args.edit,
                              "padded_to": width if padded else None,
                              "dtype": args.dtype, "backward": args.backward},
                    "slot": SLOT, "batch": len(lens), "results": results, "overhead": overhead,
                    "wall_s": wall}
        Path(args.json).write_text(json.dumps(document, indent=2) + "\n")
    if not args.keep:
        shutil.rmtree(directory)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "grpo":
        from .grpo import grpo
        return grpo(argv[1:])
    if not argv or argv[0] != "check":
        print("usage: python -m kernel_align.alignment check [--layers N] [--heads N] "
              "[--image WxH] [--text-lens L,L,L,L | --text-len N] [--no-cfg] [--edit] "
              "[--dtype bf16|fp16|fp32] [--no-backward] [--json FILE] [--keep DIR] [--cli PATH]\n"
              "       python -m kernel_align.alignment grpo [--layers N] [--heads N] "
              "[--image N] [--dtype bf16|fp32]",
              file=sys.stderr)
        return 2
    return check(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
