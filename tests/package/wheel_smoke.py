"""Smoke test of an installed kernel-align wheel (scripts/package_test.sh runs it in a
fresh virtualenv, from a directory outside the checkout). Exits non-zero on the first
failure. It checks that:

- the package is the installed one (site-packages), not the source tree;
- its version is the project's (argv[1], from CMakeLists.txt);
- every op runs forward and backward and agrees with torch formulas of the same math;
- the diffusers processor runs a tiny randomly initialised QwenImageTransformer2DModel,
  and kernel_align.alignment digests its module calls;
- torch.compile(fullgraph=True) gives the eager bytes;
- MPFR and GMP are the wheel's bundled copies: after a call that uses MPFR (rope_tables),
  /proc/self/maps shows libmpfr and libgmp mapped from the wheel's kernel_align.libs
  directory and from nowhere else;
- the wheel's `kernel-align` command (the venv's bin/, found with only /usr/bin and /bin
  on PATH besides it) reports the version, `trace diff` compares two traces the package
  wrote (identical: exit 0; different: exit 1), and `python -m kernel_align.alignment
  check` finds it with no --cli.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import torch

import kernel_align as ka
import kernel_align.functional as F


def check(condition: bool, what: str) -> None:
    if not condition:
        sys.exit(f"wheel_smoke: FAILED: {what}")
    print(f"wheel_smoke: ok: {what}")


def rmsnorm_formula(x, w, eps=1e-6):
    x32 = x.float()
    rstd = torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)
    return (x32 * rstd * w.float()).to(x.dtype)


def rope_formula(x, cos, sin):
    """Interleaved pairs, BSHD: (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos)."""
    x32 = x.float()
    x0, x1 = x32[..., 0::2], x32[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2).to(x.dtype)


def mapped_paths(stem: str) -> set[str]:
    paths = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and Path(fields[5]).name.startswith(stem):
            paths.add(fields[5])
    return paths


def check_cli(expected_version: str) -> None:
    venv_bin = Path(sys.executable).parent
    command = venv_bin / "kernel-align"
    # Only the venv and the system's own directories: no checkout's build can be found.
    env = dict(os.environ, PATH=f"{venv_bin}:/usr/bin:/bin")
    env.pop("KERNEL_ALIGN_CLI", None)

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(args, capture_output=True, text=True, env=env)
    version = run(str(command), "--version")
    check(version.returncode == 0 and version.stdout.startswith(f"kernel-align {expected_version} "),
          f"the wheel's kernel-align command reports {expected_version}: {version.stdout.strip()}"
          f"{version.stderr.strip()}")

    # What the executable loads (the loader's trace, as ldd prints it): the MPFR bundled in
    # the wheel (the RPATH auditwheel gave it) and torch's CUDA runtime from the nvidia
    # wheels beside it (its own RPATH, python/CMakeLists.txt), never a system copy.
    loaded = subprocess.run([str(Path(ka.__file__).parent / "bin" / "kernel-align")],
                            capture_output=True, text=True,
                            env=dict(env, LD_TRACE_LOADED_OBJECTS="1"))
    libs = {line.split()[0]: Path(line.split("=>")[1].split("(")[0].strip()).resolve()
            for line in loaded.stdout.splitlines() if "=>" in line}
    mpfr = [path for name, path in libs.items() if name.startswith("libmpfr")]
    check(len(mpfr) == 1 and mpfr[0].parent.name == "kernel_align.libs",
          f"the executable loads the wheel's bundled MPFR: {mpfr}")
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    runtimes = sorted(site.glob("nvidia/*/lib/libcudart.so.*"))
    if runtimes:
        cudart = [path for name, path in libs.items() if name.startswith("libcudart")]
        check(len(cudart) == 1 and cudart[0].parent == runtimes[0].resolve().parent,
              f"the executable loads torch's CUDA runtime from {runtimes[0].parent}: {cudart}")

    x = torch.randn(1, 4, 2, 128, generator=torch.Generator().manual_seed(1))
    cos, sin = ka.rope_tables(ka.qwen_image_positions(2, 1, 2), (16, 56, 56))
    traces = []
    for name, scale in (("a", 1.0), ("b", 1.0), ("c", 2.0)):
        path = Path.cwd() / f"cli_{name}.jsonl"
        path.unlink(missing_ok=True)
        ka.trace_to(path)
        try:
            F.multi_axis_rope(x * scale, cos, sin)
        finally:
            ka.trace_to(None)
        traces.append(str(path))
    same = run("kernel-align", "trace", "diff", traces[0], traces[1])
    check(same.returncode == 0 and same.stdout.startswith("identical"),
          f"kernel-align trace diff of equal traces exits 0: {same.stdout.strip()}{same.stderr.strip()}")
    differ = run("kernel-align", "trace", "diff", traces[0], traces[2])
    check(differ.returncode == 1,
          f"kernel-align trace diff of different traces exits 1 (exit {differ.returncode})")

    result = Path.cwd() / "alignment.json"
    alignment = run(sys.executable, "-m", "kernel_align.alignment", "check", "--layers", "1",
                    "--image", "64x64", "--text-len", "8", "--dtype", "fp32", "--json",
                    str(result))
    results = json.loads(result.read_text())["results"] if alignment.returncode == 0 else []
    # diffusers' processor, ours, the whole model under the contract: identical there.
    check(len(results) == 3 and results[2]["first_divergent_module"] == "identical",
          f"python -m kernel_align.alignment check runs without --cli (exit "
          f"{alignment.returncode}): {alignment.stderr.strip()[-300:]}")


def main() -> None:
    expected_version = sys.argv[1]
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    package_dir = Path(ka.__file__).resolve().parent
    check(package_dir.parent == site, f"kernel_align imported from {package_dir} (site-packages)")
    check(ka.__version__ == expected_version,
          f"kernel_align.__version__ {ka.__version__} == project version {expected_version}")

    g = torch.Generator().manual_seed(0)
    B, S, H, D, text_len = 2, 12, 3, 128, 4
    positions = ka.qwen_image_rope_positions([[(1, 2, 4)]], text_len)
    cos, sin = ka.rope_tables(positions, (16, 56, 56))
    check(tuple(cos.shape) == (S, D // 2), f"rope_tables gives [S, D/2] = {tuple(cos.shape)}")

    x = torch.randn(B, S, H, D, generator=g, requires_grad=True)
    w = (1 + 0.1 * torch.randn(D, generator=g)).requires_grad_()
    y = F.qk_rmsnorm(x, w)
    check(torch.allclose(y, rmsnorm_formula(x, w), rtol=1e-5, atol=1e-5), "qk_rmsnorm forward")
    y.square().sum().backward()
    check(x.grad is not None and w.grad is not None and bool(torch.isfinite(x.grad).all()),
          "qk_rmsnorm backward gives dx and dw")

    x = torch.randn(B, S, H, D, generator=g, requires_grad=True)
    y = F.multi_axis_rope(x, cos, sin)
    check(torch.allclose(y, rope_formula(x, cos, sin), rtol=1e-5, atol=1e-5), "multi_axis_rope forward")
    y.sum().backward()
    check(x.grad is not None, "multi_axis_rope backward")
    x2 = x.detach().clone()
    check(torch.equal(F.multi_axis_rope_(x2, cos, sin), y.detach()), "multi_axis_rope_ in place")

    q = torch.randn(B, S, H, D, generator=g, requires_grad=True)
    k = torch.randn(B, S, H, D, generator=g, requires_grad=True)
    weights = {name: (1 + 0.1 * torch.randn(D, generator=g)).requires_grad_()
               for name in ("text_q_weight", "text_k_weight", "image_q_weight", "image_k_weight")}
    q_out, k_out = F.qk_norm_rope(q, k, cos, sin, text_len=text_len, **weights, mode="single")
    q_unfused = torch.cat([F.qk_rmsnorm(q[:, :text_len], weights["text_q_weight"]),
                           F.qk_rmsnorm(q[:, text_len:], weights["image_q_weight"])], dim=1)
    check(torch.equal(q_out, F.multi_axis_rope(q_unfused, cos, sin)), "qk_norm_rope = the unfused ops")
    (q_out.sum() + k_out.sum()).backward()
    check(all(t.grad is not None for t in (q, k, *weights.values())), "qk_norm_rope backward")
    q2, k2 = q.detach().clone(), k.detach().clone()
    plain = {name: t.detach() for name, t in weights.items()}
    F.qk_norm_rope_(q2, k2, cos, sin, text_len=text_len, **plain, mode="single")
    check(torch.equal(q2, q_out.detach()) and torch.equal(k2, k_out.detach()), "qk_norm_rope_ in place")

    def fused(q, k):
        return F.qk_norm_rope(q, k, cos, sin, text_len=text_len, **plain)
    compiled = torch.compile(fused, fullgraph=True)
    eager = fused(q.detach(), k.detach())
    check(all(torch.equal(a, b) for a, b in zip(compiled(q.detach(), k.detach()), eager)),
          "torch.compile(fullgraph=True) gives the eager bytes")

    from diffusers import QwenImageTransformer2DModel
    from kernel_align.diffusers import KernelAlignQwenImageAttnProcessor
    torch.manual_seed(0)
    model = QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=1, attention_head_dim=128,
        num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(16, 56, 56)).eval()
    hidden = torch.randn(1, 64, 16, generator=g)
    text = torch.randn(1, 5, 32, generator=g)

    def sample():
        with torch.no_grad():
            return model(hidden_states=hidden, encoder_hidden_states=text,
                         timestep=torch.full((1,), 0.5), img_shapes=[[(1, 8, 8)]]).sample
    theirs = sample()
    model.set_attn_processor(KernelAlignQwenImageAttnProcessor())
    ours = sample()
    check(torch.allclose(ours, theirs, rtol=1e-4, atol=1e-4),
          "KernelAlignQwenImageAttnProcessor matches diffusers' processor on a tiny model")

    from kernel_align.alignment import digest_modules
    trace = Path.cwd() / "model.jsonl"
    with digest_modules(model, trace):
        sample()
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    check(any(r.get("kind") == "module" and r["op"] == "(root)" for r in records)
          and any(r["op"] == "qk_norm_rope" for r in records),
          f"digest_modules traced {len(records)} module and op records in one file")

    libs = site / "kernel_align.libs"
    for stem in ("libmpfr", "libgmp"):
        paths = mapped_paths(stem)
        check(bool(paths) and all(Path(p).parent == libs for p in paths),
              f"{stem} is mapped only from the wheel's {libs}: {sorted(paths)}")
    check_cli(expected_version)
    print("wheel_smoke: all checks passed")


if __name__ == "__main__":
    main()
