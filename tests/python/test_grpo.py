"""python -m kernel_align.alignment grpo: Flow-GRPO's per-step log-probabilities of a batched
sampler (padded prompts, true CFG in one batch) and a per-sample trainer are the same bits
under kernel-align's contract (ratio exactly 1), on a model small enough for the tests."""

from __future__ import annotations

import torch

import kernel_align.alignment as alignment
from kernel_align import grpo as grpo_module
from kernel_align.diffusers import under_contract


def _config(dtype):
    lens = [9, 6, 4, 7]
    return dict(lens=lens, negative_lens=[alignment._negative_len(n) for n in lens],
                dtype=dtype, tokens=16, grid=4)


def test_ratio_is_exactly_one_under_the_contract():
    for dtype in (torch.bfloat16, torch.float32):
        model = alignment._build_model(1, 1, dtype).eval()
        with under_contract(model):
            assert grpo_module._run(model, _config(dtype), True) == (0.0, 0.0)


def test_the_sampler_split_over_ranks_gives_one_process_logps():
    # torch.distributed (gloo), 2 and 4 processes: the batch split (each rank sampling its
    # share with its own padding), and the joint attention's tokens split (Ulysses' all-to-all
    # of heads and tokens, 2 heads over 2 ranks), and the Linears' K split (row-parallel where
    # the tree reproduces the split): every sample's logp per step the bits of the
    # one-process sampler.
    config = _config(torch.bfloat16)
    model = alignment._build_model(1, 2, torch.bfloat16).eval()
    with under_contract(model):
        alone = torch.stack([logp for _, _, logp in
                             grpo_module._sample(model, config, True, [0, 1, 2, 3])])
    for split, world in (("data", 2), ("data", 4), ("sequence", 2), ("tensor", 2),
                         ("tensor", 4)):
        logps = grpo_module.logps_across_ranks(config, 1, 2, world, split)
        assert logps.shape == alone.shape
        assert torch.equal(logps, alone), (split, world)


def test_the_command_prints_every_configuration(capsys):
    assert alignment.main(["grpo", "--layers", "1", "--heads", "1", "--image", "64",
                           "--ranks", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # 1 head: no sequence split over 2 ranks.
    assert lines[-4].startswith("diffusers' defaults")
    assert lines[-3].split()[:4] == ["kernel-align", "contract", "0", "0"]
    assert lines[-2].split()[:6] == ["data", "split,", "2", "ranks", "0", "0"]
    assert lines[-1].split()[:6] == ["tensor", "split,", "2", "ranks", "0", "0"]
