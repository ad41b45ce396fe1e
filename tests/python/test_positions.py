"""Positions, tables and the nn.Modules, against independent Python formulas."""

from __future__ import annotations

import math

import pytest
import torch

import kernel_align as ka
from formulas import assert_bitwise, rmsnorm, rope


def seed_positions(text_len, h, w):
    text = [(j, j, j) for j in range(text_len)]
    return torch.tensor(text + [(0, r, c) for r in range(h) for c in range(w)],
                        dtype=torch.int32)


def diffusers_positions(images, text_len):
    """images: (frame, h, w) per image; rows centred at -ceil(n/2) .. floor(n/2) - 1;
    text at (m + j) on all axes, m = max over images of max(h // 2, w // 2)."""
    m = max(max(h // 2, w // 2) for _, h, w in images)
    rows = [(m + j,) * 3 for j in range(text_len)]
    for frame, h, w in images:
        rows += [(frame, r - math.ceil(h / 2), c - math.ceil(w / 2))
                 for r in range(h) for c in range(w)]
    return torch.tensor(rows, dtype=torch.int32)


@pytest.mark.parametrize("text_len,h,w", [(0, 3, 4), (5, 4, 4), (256, 7, 3)])
def test_seed_positions(text_len, h, w):
    assert torch.equal(ka.qwen_image_positions(text_len, h, w), seed_positions(text_len, h, w))


def test_diffusers_positions():
    assert torch.equal(ka.qwen_image_rope_positions([[(1, 83, 83)]], 4),
                       diffusers_positions([(0, 83, 83)], 4))
    grid = ka.qwen_image_rope_positions([(1, 83, 83)], 0)
    assert (grid[:, 1].min().item(), grid[:, 1].max().item()) == (-42, 40)
    # Edit: the reference image is frame 1; a batch repeats the sample's shapes.
    edit = [[(1, 58, 104), (1, 64, 64)]] * 3
    assert torch.equal(ka.qwen_image_rope_positions(edit, 7),
                       diffusers_positions([(0, 58, 104), (1, 64, 64)], 7))
    # An entry of several frames covers frames index .. index + frames - 1.
    assert torch.equal(ka.qwen_image_rope_positions([[(2, 3, 4), (1, 2, 2)]], 2),
                       diffusers_positions([(0, 3, 4), (1, 3, 4), (1, 2, 2)], 2))
    assert torch.equal(ka.qwen_image_rope_positions([(1, 4, 6)], torch.tensor(3)),
                       diffusers_positions([(0, 4, 6)], 3))


def test_rope_tables_vs_fp64():
    """Every entry is the fp32 rounding of the fp64 evaluation of its steps, or one ulp
    from it (fp64 is not exact; ours is correctly rounded at each step)."""
    positions = ka.qwen_image_rope_positions([[(1, 20, 30), (1, 8, 8)]], 40)
    cos, sin = ka.rope_tables(positions)
    assert cos.shape == sin.shape == (positions.shape[0], 64) and cos.dtype == torch.float32
    inverse = []
    for dim in (16, 56, 56):
        for i in range(dim // 2):
            exponent = (torch.tensor(2 * i, dtype=torch.float32)
                        / torch.tensor(dim, dtype=torch.float32))
            power = torch.tensor(10000.0 ** exponent.double().item()).float()
            inverse.append((1.0 / power.double()).float())
    inverse = torch.stack(inverse)
    axis = torch.repeat_interleave(torch.arange(3), torch.tensor([8, 28, 28]))
    angle = (positions[:, axis].double() * inverse.double()).float().double()
    for ours, fn in ((cos, torch.cos), (sin, torch.sin)):
        expected = fn(angle).float()
        off = ours != expected
        assert off.float().mean().item() < 0.01
        step = (torch.nextafter(expected.abs(), torch.tensor(float("inf"))) - expected.abs())
        assert ((ours - expected).abs() <= step)[off].all()
    # Axis sizes and theta are parameters.
    small = ka.rope_tables(torch.tensor([[3, -2]], dtype=torch.int64), axes_dim=(4, 8), theta=100)
    assert small[0].shape == (1, 6)
    assert math.isclose(small[1][0, 1].item(), math.sin(3 / 100 ** 0.5), rel_tol=1e-6)


def test_modules(generator):
    x = torch.randn(2, 10, 3, 128, generator=generator).bfloat16()
    norm = ka.QkRmsNorm(128, mode="diffusers", dtype=torch.bfloat16)
    with torch.no_grad():
        norm.weight.normal_(generator=generator)
    assert_bitwise(norm(x), rmsnorm(x, norm.weight.detach(), "diffusers"))
    assert ka.QkRmsNorm(128, elementwise_affine=False).weight is None
    rope_module = ka.MultiAxisRope(pairing="half", layout="bshd")
    cos, sin = rope_module.tables(ka.qwen_image_positions(2, 2, 4))
    assert_bitwise(rope_module(x, cos, sin), rope(x, cos, sin, "half", "bshd"))
    loss = rope_module(norm(x), cos, sin).float().sum()
    loss.backward()
    assert norm.weight.grad is not None and norm.weight.grad.abs().sum() > 0


def test_timestep_embedding_is_diffusers_recipe_correctly_rounded():
    """kernel_align.timestep_embedding: diffusers' get_timestep_embedding (Qwen-Image's
    configuration) with its fp32 steps correctly rounded: within an ulp of the argument of
    torch's own, a row independent of the batch, any float dtype in."""
    t = torch.rand(40, generator=torch.Generator().manual_seed(4))
    ours = ka.timestep_embedding(t)
    assert ours.dtype == torch.float32 and ours.shape == (40, 256)
    half = 128
    exponent = -math.log(10000) * torch.arange(half, dtype=torch.float32) / half
    angle = 1000 * (t[:, None] * torch.exp(exponent)[None, :])
    theirs = torch.cat([torch.cos(angle), torch.sin(angle)], dim=-1)
    # torch's exp misrounds a few frequencies: those arguments (up to 1000) move by an ulp.
    assert (ours - theirs).abs().max().item() < 1e-4
    assert_bitwise(ka.timestep_embedding(t[7:8]), ours[7:8])
    assert_bitwise(ka.timestep_embedding(t.to(torch.bfloat16)),
                   ka.timestep_embedding(t.to(torch.bfloat16).float()))
    sin_first = ka.timestep_embedding(t, 64, flip_sin_to_cos=False, downscale_freq_shift=1,
                                      scale=1)
    assert sin_first.shape == (40, 64)


def test_timestep_embedding_bad_arguments_name_them():
    t = torch.rand(3)
    with pytest.raises(ValueError, match="argument 'channels'"):
        ka.timestep_embedding(t, 255)
    with pytest.raises(ValueError, match="argument 'timesteps'"):
        ka.timestep_embedding(t[None])
    with pytest.raises(ValueError, match=r"argument 'timesteps\[1\]'"):
        ka.timestep_embedding(torch.tensor([0.5, float("nan")]))
    with pytest.raises(ValueError, match="argument 'downscale_freq_shift'"):
        ka.timestep_embedding(t, 8, downscale_freq_shift=4)
    with pytest.raises(TypeError, match="argument 'timesteps'"):
        ka.timestep_embedding(torch.tensor([1, 2]))
