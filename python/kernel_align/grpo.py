"""The RL step's log-probabilities, sampler against trainer (issue 33's demonstration):
``python -m kernel_align.alignment grpo``.

A small random Qwen-Image transformer runs as Flow-GRPO's sampler (4 prompts of different
lengths padded to the longest with the mask, true CFG's conditional and unconditional
passes in one batch, a few SDE steps under ``inference_mode``, each step's log-probability
recorded) and as its trainer (each sample alone at its own prompt length, the two CFG
passes each alone, gradients enabled, the log-probability of each recorded step recomputed
from the recorded latents). It prints, per configuration, the largest
``|logp_train - logp_sample|`` and ``|exp(logp_train - logp_sample) - 1|`` over samples and
steps: with diffusers' defaults (torch's kernels and Flow-GRPO's expressions) and with the
model under kernel-align's contract (``kernel_align.diffusers.under_contract``, and the step
by ``kernel_align.flow_sde_step_logp``, whose bytes for a sample depend on that sample alone).

The step is Flow-GRPO's ``sde_step_with_logprob`` of the flow-matching Euler scheduler:
with ``std = sqrt(sigma / (1 - sigma')) * noise_level`` (``sigma' = sigma_max`` where
``sigma = 1``), ``dt = sigma_prev - sigma``,

    mean = x (1 + std^2 dt / (2 sigma)) + v (1 + std^2 (1 - sigma) / (2 sigma)) dt
    prev = mean + std sqrt(-dt) noise                       (sampling)
    logp = mean over the sample's elements of
           -(prev - mean)^2 / (2 (std sqrt(-dt))^2) - log(std sqrt(-dt)) - log(sqrt(2 pi))

and true CFG is ``v = uncond + scale (cond - uncond)``, rescaled per token to the
conditional prediction's norm, as the Qwen-Image pipeline does. Under the contract the
step is the library's ``flow_sde_step_logp`` (docs/contract.md section 15: the step's
constants each its exact expression rounded once to fp32, fp32 elementwise steps, each
sample's squared distance summed by linear's fixed tree), and true CFG is the library's
``true_cfg`` (section 17: fp32 arithmetic, each token's two sums of squares by the row
tree over that token's channels alone).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch

from . import diffusers as ka_diffusers
from .functional import flow_sde_step_logp, true_cfg

__all__ = ["grpo"]

_SIGMAS = (1.0, 0.8, 0.6, 0.4)  # the steps' sigmas: sigma_max = _SIGMAS[1], as Flow-GRPO's
_NOISE_LEVEL = 0.7  # Flow-GRPO's default
_CFG_SCALE = 4.0  # the Qwen-Image pipeline's true_cfg_scale default


def _cfg(cond: torch.Tensor, uncond: torch.Tensor, contract: bool) -> torch.Tensor:
    """True CFG with the pipeline's norm rescale, per token over the channels: the
    pipeline's torch expression, or under the contract ``kernel_align.true_cfg``."""
    if contract:
        return true_cfg(cond, uncond, _CFG_SCALE)
    combined = uncond + _CFG_SCALE * (cond - uncond)
    cond_norm = torch.norm(cond, dim=-1, keepdim=True)
    combined_norm = torch.norm(combined, dim=-1, keepdim=True)
    return combined * (cond_norm / combined_norm)


def _step(x: torch.Tensor, v: torch.Tensor, sigma: float, sigma_prev: float,
          noise: torch.Tensor | None, prev: torch.Tensor | None, contract: bool):
    """(prev, logp [B]) of the step; with ``noise``, sampling, else replaying ``prev``."""
    if not contract:  # Flow-GRPO's expressions, in torch's tensors and reductions
        sigma_t = torch.full((x.shape[0], 1, 1), sigma)
        dt = sigma_prev - sigma_t
        std = torch.sqrt(sigma_t / (1 - torch.where(sigma_t == 1, _SIGMAS[1], sigma_t)))
        std = std * _NOISE_LEVEL
        mean = x * (1 + std ** 2 / (2 * sigma_t) * dt) + v * (
            1 + std ** 2 * (1 - sigma_t) / (2 * sigma_t)) * dt
        if prev is None:
            prev = mean + std * torch.sqrt(-1 * dt) * noise
        logp = (-((prev.detach() - mean) ** 2) / (2 * ((std * torch.sqrt(-1 * dt)) ** 2))
                - torch.log(std * torch.sqrt(-1 * dt))
                - torch.log(torch.sqrt(2 * torch.as_tensor(math.pi))))
        return prev, logp.mean(dim=tuple(range(1, logp.ndim)))
    if prev is None:
        return flow_sde_step_logp(x, v, sigma, sigma_prev, sigma_max=_SIGMAS[1], noise=noise,
                                  noise_level=_NOISE_LEVEL)
    return flow_sde_step_logp(x, v, sigma, sigma_prev, sigma_max=_SIGMAS[1], prev=prev,
                              noise_level=_NOISE_LEVEL)


def _inputs(config: dict):
    """Every sample's prompt and negative prompt (text [2 * samples, width, 64], zero past
    each one's length), initial latents and per-step noise: the same on every rank."""
    lens, negative_lens = config["lens"], config["negative_lens"]
    samples, width = len(lens), max(lens + negative_lens)
    g = torch.Generator().manual_seed(7)
    text = torch.randn(2 * samples, width, 64, generator=g)
    mask = torch.arange(width)[None, :] < torch.tensor(lens + negative_lens)[:, None]
    text = (text * mask[..., None]).to(config["dtype"])
    x = torch.randn(samples, config["tokens"], 64, generator=g)
    noises = [torch.randn(samples, config["tokens"], 64, generator=g)
              for _ in range(len(_SIGMAS) - 1)]
    return text, x, noises


def _velocity(model, config: dict, latents, prompts, prompt_mask, sigma):
    shapes = [[(1, config["grid"], config["grid"])]]
    out = model(hidden_states=latents.to(config["dtype"]), encoder_hidden_states=prompts,
                encoder_hidden_states_mask=prompt_mask,
                timestep=torch.full((latents.shape[0],), sigma).to(config["dtype"]),
                img_shapes=shapes * latents.shape[0]).sample
    return out.float()


def _sample(model, config: dict, contract: bool, chosen: list[int]):
    """The sampler over the samples `chosen`: their conditional and unconditional passes in
    one batch, prompts padded to the longest of theirs, under inference_mode. Per step:
    (latents, prev, logp) of those samples, in their order."""
    text, x, noises = _inputs(config)
    samples = len(config["lens"])
    lens = [config["lens"][i] for i in chosen] + [config["negative_lens"][i] for i in chosen]
    width = max(lens)
    rows = chosen + [samples + i for i in chosen]
    prompts = text[rows, :width]
    mask = torch.arange(width)[None, :] < torch.tensor(lens)[:, None]
    recorded = []
    with torch.inference_mode():
        latents = x[chosen]
        for step, (sigma, sigma_prev) in enumerate(zip(_SIGMAS, _SIGMAS[1:])):
            both = _velocity(model, config, torch.cat([latents, latents]), prompts, mask, sigma)
            v = _cfg(both[:len(chosen)], both[len(chosen):], contract)
            prev, logp = _step(latents, v, sigma, sigma_prev, noises[step][chosen], None, contract)
            recorded.append((latents, prev, logp))
            latents = prev
    # Out of inference mode: the trainer's graph may hold them.
    return [tuple(t.clone() for t in step) for step in recorded]


def _run(model, config: dict, contract: bool) -> tuple[float, float]:
    """(largest |logp_train - logp_sample|, largest |ratio - 1|) over samples and steps."""
    lens, negative_lens = config["lens"], config["negative_lens"]
    samples = len(lens)
    text, _, _ = _inputs(config)
    recorded = _sample(model, config, contract, list(range(samples)))

    # The trainer: each sample alone, each pass at its own prompt length, with gradients.
    worst, worst_ratio = 0.0, 0.0
    with torch.enable_grad():
        for i in range(samples):
            for step, (sigma, sigma_prev) in enumerate(zip(_SIGMAS, _SIGMAS[1:])):
                latents, prev, logp_sample = recorded[step]
                xi = latents[i:i + 1].clone()
                cond = _velocity(model, config, xi, text[i:i + 1, :lens[i]], None, sigma)
                uncond = _velocity(model, config, xi,
                                   text[samples + i:samples + i + 1, :negative_lens[i]], None,
                                   sigma)
                v = _cfg(cond, uncond, contract)
                _, logp = _step(xi, v, sigma, sigma_prev, None, prev[i:i + 1], contract)
                difference = (logp.detach() - logp_sample[i]).abs().item()
                worst = max(worst, difference)
                worst_ratio = max(worst_ratio, abs(math.expm1(difference)))
    return worst, worst_ratio


def _row_parallel(model, world: int, rank: int) -> int:
    """Every nn.Linear of `model` whose K the contract's tree splits `world` ways runs
    row-parallel (kernel_align.tensor_parallel.row_parallel_linear: this rank's K/world
    columns, the partials combined in the tree's order); the count of those."""
    from .tensor_parallel import row_parallel_linear, shards_reproduce

    count = 0
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        k = module.in_features
        if not shards_reproduce(k, world):
            continue
        share = slice(rank * k // world, (rank + 1) * k // world)

        def forward(x, module=module, share=share):
            return row_parallel_linear(x[..., share], module.weight[:, share], module.bias)

        module.forward = forward
        count += 1
    return count


def _sampler_rank(rank: int, world: int, init: str, config: dict, layers: int, heads: int,
                  split: str, out: str) -> None:
    """One rank of a sampler under the contract across ranks (torch.distributed, gloo), its
    logps [steps, samples] into rank 0's file. "data": the rank samples samples rank,
    rank + world, ... in a batch of its own, the logps all-gathered; "sequence": every rank
    samples the whole batch, its joint attention Ulysses' over the ranks
    (kernel_align.sequence_parallel); "tensor": every rank samples the whole batch, each
    Linear whose K the contract's tree splits row-parallel over the ranks
    (kernel_align.tensor_parallel)."""
    import torch.distributed as dist

    from . import set_num_threads
    from .alignment import _build_model
    from .sequence_parallel import sequence_parallel

    torch.set_num_threads(1)
    set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        model = _build_model(layers, heads, config["dtype"]).eval()
        samples = len(config["lens"])
        with ka_diffusers.under_contract(model):
            if split == "data":
                recorded = _sample(model, config, True, list(range(rank, samples, world)))
            elif split == "sequence":
                with sequence_parallel():
                    recorded = _sample(model, config, True, list(range(samples)))
            else:
                if _row_parallel(model, world, rank) == 0:
                    raise ValueError(f"kernel_align.grpo: no Linear of the model splits "
                                     f"{world} ways")
                recorded = _sample(model, config, True, list(range(samples)))
        logps = torch.stack([logp for _, _, logp in recorded])  # [steps, this rank's samples]
        if split == "data":
            gathered = [torch.empty_like(logps) for _ in range(world)]
            dist.all_gather(gathered, logps)
            merged = torch.empty(logps.shape[0], samples)
            for r, part in enumerate(gathered):
                merged[:, r::world] = part
            logps = merged
        if rank == 0:
            torch.save(logps, out)
    finally:
        dist.destroy_process_group()


def logps_across_ranks(config: dict, layers: int, heads: int, world: int,
                       split: str = "data") -> torch.Tensor:
    """The contract's sampler's logps [steps, samples] on `world` ranks (torch.distributed,
    gloo, processes started here): split "data", the batch split over the ranks (each rank
    padding its own prompts); "sequence", the joint attention's tokens split over them
    (Ulysses' all-to-all of heads and tokens; heads a multiple of `world`); "tensor", the
    Linears' K split over them where the tree reproduces the split (row-parallel, the
    partials combined in the tree's order). Equal, bit for bit, to one process's."""
    import os
    import tempfile

    import torch.multiprocessing as mp

    if split == "data" and len(config["lens"]) % world != 0:
        raise ValueError(f"kernel_align.grpo: argument 'world': expected a divisor of the "
                         f"{len(config['lens'])} samples, found {world}")
    if split == "sequence" and heads % world != 0:
        raise ValueError(f"kernel_align.grpo: argument 'world': expected a divisor of the "
                         f"{heads} heads, found {world}")
    with tempfile.TemporaryDirectory() as directory:
        init = "file://" + os.path.join(directory, "rendezvous")
        out = os.path.join(directory, "logps.pt")
        mp.spawn(_sampler_rank, args=(world, init, config, layers, heads, split, out),
                 nprocs=world, join=True)
        return torch.load(out)


def grpo(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kernel_align.alignment grpo",
        description="Flow-GRPO's per-step log-probabilities of a small random Qwen-Image "
        "transformer, a batched sampler (padded prompts, true CFG) against a per-sample "
        "trainer, with diffusers' defaults and under kernel-align's contract")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--image", type=int, default=256, help="square image side (pixels)")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--ranks", type=int, nargs="*", default=[2, 4],
                        help="also run the contract's sampler data-parallel on these many "
                        "ranks (torch.distributed, gloo) against one process")
    args = parser.parse_args(argv)
    from .alignment import _build_model, _negative_len

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    grid = args.image // 16
    lens = [32, 25, 20, 28]
    config = dict(lens=lens, negative_lens=[_negative_len(n) for n in lens], dtype=dtype,
                  tokens=grid * grid, grid=grid)
    model = _build_model(args.layers, args.heads, dtype).eval()
    print(f"kernel-align grpo: QwenImageTransformer2DModel, {args.layers} layers, {args.heads} "
          f"heads, {args.image}x{args.image} image, {args.dtype}, random weights; "
          f"{len(_SIGMAS) - 1} SDE steps (sigmas {', '.join(map(str, _SIGMAS))}, noise level "
          f"{_NOISE_LEVEL}), true CFG scale {_CFG_SCALE}")
    print(f"sampler: batch of {2 * len(lens)} (prompts of {', '.join(map(str, lens))} tokens "
          "and their negative prompts, padded with the mask), inference_mode")
    print("trainer: each sample alone, each CFG pass at its own prompt length, grad enabled")
    if args.ranks:
        print("data split, N ranks: the contract's sampler with its batch split over N "
              "processes (torch.distributed, gloo; each rank pads its own prompts); sequence "
              "split: its joint attention's tokens split over them (Ulysses' all-to-all); "
              "tensor split: its Linears' K split over them (row-parallel, where the tree "
              "reproduces the split); the sampler's logps against one process's")
    print(f"{'configuration':<24} {'max |logp_train - logp_sample|':>31} {'max |ratio - 1|':>16}"
          f" {'time s':>7}")
    for name, contract in (("diffusers' defaults", False), ("kernel-align contract", True)):
        start = time.perf_counter()
        if contract:
            with ka_diffusers.under_contract(model):
                worst, ratio = _run(model, config, True)
        else:
            worst, ratio = _run(model, config, False)
        print(f"{name:<24} {worst:>31.3g} {ratio:>16.3g} {time.perf_counter() - start:>7.1f}",
              flush=True)
    if args.ranks:
        with ka_diffusers.under_contract(model):
            alone = torch.stack([logp for _, _, logp in
                                 _sample(model, config, True, list(range(len(lens))))])
        for split, world in [("data", w) for w in args.ranks] + [
                ("sequence", w) for w in args.ranks if args.heads % w == 0] + [
                ("tensor", w) for w in args.ranks]:
            start = time.perf_counter()
            logps = logps_across_ranks(config, args.layers, args.heads, world, split)
            worst = (logps - alone).abs().max().item()
            print(f"{f'{split} split, {world} ranks':<24} {worst:>31.3g} "
                  f"{abs(math.expm1(worst)):>16.3g} {time.perf_counter() - start:>7.1f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(grpo())
