"""Against the real diffusers package (imported, pinned in requirements.txt): positions,
tables, RoPE, RMSNorm and a small randomly initialised QwenImageTransformer2DModel run
with diffusers' attention processor and with ours."""

from __future__ import annotations

import pytest
import torch
from diffusers import QwenImageTransformer2DModel
from diffusers.models.normalization import RMSNorm
from diffusers.models.transformers.transformer_qwenimage import (QwenEmbedRope,
                                                                 apply_rotary_emb_qwen)

import kernel_align as ka
import kernel_align.functional
from formulas import assert_bitwise, assert_close, rstd_torch_mean, rstd_tree, ulp_distance
from kernel_align.diffusers import (KernelAlignQwenImageAttnProcessor,
                                    under_contract)

AXES = (16, 56, 56)
# img_shapes as the pipelines pass them: text-to-image at the sizes, and an
# Edit call (target and one reference image) for a batch of two.
IMG_SHAPES = {
    "1024x1024": ([[(1, 64, 64)]], 256),
    "1328x1328": ([[(1, 83, 83)]], 256),
    "1664x928": ([[(1, 58, 104)]], 256),
    "edit": ([[(1, 64, 64), (1, 58, 72)]] * 2, 77),
    "frames": ([(2, 6, 5)], 3),
}


@pytest.fixture(scope="module")
def embed_rope():
    return QwenEmbedRope(theta=10000, axes_dim=list(AXES), scale_rope=True)


def diffusers_freqs(embed_rope, img_shapes, text_len):
    """diffusers' complex frequencies in the joint order [text, images]."""
    vid, txt = embed_rope(img_shapes, max_txt_seq_len=text_len, device=torch.device("cpu"))
    return torch.cat([txt, vid])


def freqs_of_positions(embed_rope, positions):
    """Frequencies looked up in diffusers' own per-position tables at our positions: equal
    to diffusers' output bitwise exactly when the positions are the same."""
    offsets = [0, AXES[0] // 2, (AXES[0] + AXES[1]) // 2]
    columns = []
    for axis, dim in enumerate(AXES):
        pos = positions[:, axis].long()
        cols = slice(offsets[axis], offsets[axis] + dim // 2)
        # pos_freqs[p] for p >= 0; neg_freqs holds -4096 .. -1 at rows 0 .. 4095.
        positive = embed_rope.pos_freqs[pos.clamp(min=0), cols]
        negative = embed_rope.neg_freqs[(pos + 4096).clamp(max=4095), cols]
        columns.append(torch.where((pos >= 0)[:, None], positive, negative))
    return torch.cat(columns, dim=1)


@pytest.mark.parametrize("case", IMG_SHAPES)
def test_positions_and_tables_vs_qwen_embed_rope(case, embed_rope):
    """Positions exact; tables (ours correctly rounded) within one ulp of the value plus
    two ulps of the angle of diffusers' (torch's pow, division and cos/sin are not
    correctly rounded, so its angles can be an ulp off); most entries bitwise equal."""
    img_shapes, text_len = IMG_SHAPES[case]
    freqs = diffusers_freqs(embed_rope, img_shapes, text_len)
    positions = ka.qwen_image_rope_positions(img_shapes, text_len)
    assert positions.dtype == torch.int32 and positions.shape == (freqs.shape[0], 3)
    assert torch.equal(torch.view_as_real(freqs_of_positions(embed_rope, positions)),
                       torch.view_as_real(freqs))

    cos, sin = ka.rope_tables(positions, AXES)
    axis_of_column = torch.repeat_interleave(torch.arange(3), torch.tensor(AXES) // 2)
    inverse = torch.cat([10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
                         for d in AXES])
    angle = (positions[:, axis_of_column].double() * inverse).abs().float()

    def ulp(v):
        v = v.abs()
        return (torch.nextafter(v, torch.full_like(v, float("inf"))) - v).double()

    for ours, theirs in ((cos, freqs.real), (sin, freqs.imag)):
        diff = (ours.double() - theirs.double()).abs()
        assert (diff <= ulp(ours) + 2 * ulp(angle)).all()
        assert (diff == 0).double().mean().item() > 0.95


def test_rope_with_diffusers_freqs_is_bitwise(embed_rope, generator):
    """Our interleaved RoPE fed diffusers' own frequencies (as strided cos/sin views of
    the complex tensor, no copy) equals apply_rotary_emb_qwen(use_real=False) bitwise."""
    freqs = diffusers_freqs(embed_rope, [[(1, 20, 24)]], 11)
    table = torch.view_as_real(freqs)
    cos, sin = table[..., 0], table[..., 1]
    assert not cos.is_contiguous()
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.randn(2, freqs.shape[0], 3, 128, generator=generator).to(dtype)
        assert_bitwise(ka.multi_axis_rope(x, cos, sin), apply_rotary_emb_qwen(x, freqs,
                                                                               use_real=False))


@pytest.mark.parametrize("dtype,weight_dtype", [(torch.bfloat16, torch.bfloat16),
                                                (torch.float16, torch.float16),
                                                (torch.float32, torch.float32),
                                                (torch.float32, torch.bfloat16)])
def test_diffusers_mode_vs_rmsnorm(dtype, weight_dtype, generator):
    """Mode "diffusers" vs diffusers' RMSNorm: bitwise on every row whose rstd agrees with
    the one torch's mean gives (most rows); rstd itself within two ulps. Elsewhere, at
    bf16/fp16 outputs, within two ulps of the output dtype (an ulp of rstd can move each
    of the mode's two roundings by one), and in the reduction class at fp32."""
    norm = RMSNorm(128, eps=1e-6)
    norm.weight.data = torch.randn(128, generator=generator).to(weight_dtype)
    x = (torch.randn(4, 300, 2, 128, generator=generator) * 2).to(dtype)
    with torch.no_grad():
        theirs = norm(x)
    ours = ka.qk_rmsnorm(x, norm.weight.detach(), mode="diffusers", out_dtype=theirs.dtype)
    rstd_ours, rstd_theirs = rstd_tree(x), rstd_torch_mean(x)
    assert ulp_distance(rstd_ours, rstd_theirs).max().item() <= 2
    agree = (rstd_ours == rstd_theirs).squeeze(-1)
    assert agree.float().mean().item() > 0.5
    assert_bitwise(ours[agree], theirs[agree])
    if theirs.dtype == torch.float32:
        assert_close(ours, theirs, "reduction_forward")
    else:
        distance = ulp_distance(ours, theirs)
        assert distance.max().item() <= 2
        assert (distance == 0).float().mean().item() > 0.9


def small_transformer(dtype, zero_cond_t=False):
    torch.manual_seed(0)
    model = QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=128,
        num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=AXES,
        zero_cond_t=zero_cond_t)
    # Norm weights away from their initial ones, so that the weights matter.
    for name, parameter in model.named_parameters():
        if "norm" in name:
            parameter.data.normal_(1.0, 0.2)
    return model.to(dtype).eval()


def run(model, grid, batch, text_len, generator, dtype):
    h, w = grid
    hidden = torch.randn(batch, h * w, 16, generator=generator).to(dtype)
    text = torch.randn(batch, text_len, 32, generator=generator).to(dtype)
    timestep = torch.full((batch,), 0.5).to(dtype)
    with torch.no_grad():
        return model(hidden_states=hidden, encoder_hidden_states=text, timestep=timestep,
                     img_shapes=[[(1, h, w)]] * batch).sample


@pytest.mark.parametrize("grid", [(64, 64), (83, 83)])
def test_transformer_with_our_processor(grid):
    """A 2-layer model (head_dim 128, axes (16, 56, 56), 2 heads, random weights, nothing
    downloaded) at 64x64 and 83x83 token latents with 24 text tokens: diffusers'
    processor and ours give outputs within the reduction forward class (fp32)."""
    model = small_transformer(torch.float32)
    theirs = run(model, grid, 1, 24, torch.Generator().manual_seed(7), torch.float32)
    model.set_attn_processor(KernelAlignQwenImageAttnProcessor())
    assert all(isinstance(p, KernelAlignQwenImageAttnProcessor)
               for p in model.attn_processors.values())
    ours = run(model, grid, 1, 24, torch.Generator().manual_seed(7), torch.float32)
    assert not torch.equal(theirs, torch.zeros_like(theirs))
    assert_close(ours, theirs, "reduction_forward")


def test_transformer_bf16_and_batch_invariance(monkeypatch):
    """bf16 model with our processor vs diffusers' (reduction forward class at bf16); and
    inside the model, the fused op's output bytes of a sample equal those of the same
    input alone: they do not depend on the rest of the batch."""
    model = small_transformer(torch.bfloat16)
    theirs = run(model, (32, 40), 2, 16, torch.Generator().manual_seed(3), torch.bfloat16)
    model.set_attn_processor(KernelAlignQwenImageAttnProcessor())
    calls = []
    fused = kernel_align.functional.qk_norm_rope_

    def recording(q, k, cos, sin, **kwargs):
        inputs = (q.clone(), k.clone())
        fused(q, k, cos, sin, **kwargs)
        calls.append((inputs, (q.clone(), k.clone()), (cos, sin), kwargs))
        return q, k

    monkeypatch.setattr(kernel_align.functional, "qk_norm_rope_", recording)
    ours = run(model, (32, 40), 2, 16, torch.Generator().manual_seed(3), torch.bfloat16)
    assert_close(ours, theirs, "reduction_forward")
    assert len(calls) == 2  # one per block
    for (q, k), (q_out, k_out), (cos, sin), kwargs in calls:
        for index in range(2):
            alone = ka.qk_norm_rope(q[index:index + 1], k[index:index + 1], cos, sin, **kwargs)
            assert_bitwise(alone[0], q_out[index:index + 1])
            assert_bitwise(alone[1], k_out[index:index + 1])


def test_processor_trains():
    """With grad enabled the processor uses the differentiable op: every block's four
    norm weights get the gradients diffusers' processor gives them (reduction gradient
    class, fp32; the last block's text-query weight rightly gets none, since the text
    stream's last output is unused)."""
    def norm_grads(processor):
        model = small_transformer(torch.float32).train()
        if processor is not None:
            model.set_attn_processor(processor)
        generator = torch.Generator().manual_seed(11)
        hidden = torch.randn(1, 64, 16, generator=generator)
        text = torch.randn(1, 5, 32, generator=generator)
        out = model(hidden_states=hidden, encoder_hidden_states=text,
                    timestep=torch.full((1,), 0.5), img_shapes=[[(1, 8, 8)]]).sample
        out.square().mean().backward()
        return [getattr(block.attn, name).weight.grad
                for block in model.transformer_blocks
                for name in ("norm_q", "norm_k", "norm_added_q", "norm_added_k")]

    theirs = norm_grads(None)
    ours = norm_grads(KernelAlignQwenImageAttnProcessor())
    assert sum(bool(g.abs().sum() > 0) for g in theirs) == len(theirs) - 1
    for o, t in zip(ours, theirs):
        scale = t.abs().max().clamp(min=1e-30)
        assert_close(o / scale, t / scale, "reduction_gradient")


def test_under_contract_norm_out_is_one_adaln_modulation_call():
    """The output's AdaLayerNormContinuous under the switch: adaln_modulation of its input
    with the (scale, shift) chunks of its linear(silu(temb)), close to diffusers' own."""
    model = small_transformer(torch.bfloat16)
    g = torch.Generator().manual_seed(7)
    dim = model.inner_dim
    x = torch.randn(2, 16, dim, generator=g).to(torch.bfloat16)
    temb = torch.randn(2, dim, generator=g).to(torch.bfloat16)
    with torch.no_grad():
        theirs = model.norm_out(x, temb)
        with under_contract(model):
            ours = model.norm_out(x, temb)
            emb = model.norm_out.linear(torch.nn.functional.silu(temb))
        scale, shift = emb.chunk(2, dim=1)
        assert_bitwise(ours, ka.adaln_modulation(x, scale, shift, eps=model.norm_out.norm.eps))
        assert_close(ours, theirs, "reduction_forward")


def test_under_contract_timesteps_are_the_correctly_rounded_embedding():
    """The timestep embedding's Timesteps under the switch: kernel_align.timestep_embedding
    with the module's configuration, close to diffusers' own (torch's exp is not correctly
    rounded at 3 of Qwen-Image's 128 frequencies, which moves those columns' arguments)."""
    model = small_transformer(torch.bfloat16)
    proj = model.time_text_embed.time_proj
    t = torch.rand(6, generator=torch.Generator().manual_seed(3))
    theirs = proj(t)
    with under_contract(model):
        ours = proj(t)
    assert_bitwise(ours, ka.timestep_embedding(t))
    assert ours.dtype == theirs.dtype == torch.float32 and ours.shape == theirs.shape
    assert (ours - theirs).abs().max().item() < 1e-4


def test_under_contract_txt_norm_is_one_qk_rmsnorm_call():
    """The text path's RMSNorm under the switch: qk_rmsnorm in diffusers mode with its
    weight and eps, close to diffusers' own (the row's sum by the contract's tree)."""
    model = small_transformer(torch.bfloat16)
    norm = model.txt_norm
    x = torch.randn(2, 9, norm.weight.shape[0],
                    generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    with torch.no_grad():
        theirs = norm(x)
        with under_contract(model):
            ours = norm(x)
    assert ours.dtype == theirs.dtype
    assert_bitwise(ours, ka.qk_rmsnorm(x, norm.weight, eps=norm.eps, mode="diffusers"))
    assert_close(ours, theirs, "reduction_forward")


def test_under_contract_blocks_compute_diffusers_model_in_fp32():
    """Every module under the switch computes diffusers' math in the contract's order: the
    whole fp32 model (blocks through the library's adaln_modulation, attention and
    adaln_gate_residual; every Linear batch-invariant) within fp32 reduction tolerance of
    diffusers' own, and its gradients too."""
    model = small_transformer(torch.float32)
    g = torch.Generator().manual_seed(9)
    hidden = torch.randn(2, 16, 16, generator=g)
    text = torch.randn(2, 12, 32, generator=g)
    kwargs = dict(encoder_hidden_states=text, timestep=torch.tensor([0.3, 0.7]),
                  img_shapes=[[(1, 4, 4)]] * 2)

    def run():
        x = hidden.clone().requires_grad_()
        out = model(hidden_states=x, **kwargs).sample
        out.square().mean().backward()
        return out.detach(), x.grad

    theirs = run()
    with under_contract(model):
        ours = run()
    for o, t in zip(ours, theirs):
        assert_close(o, t, "reduction_forward")


def test_under_contract_edit_modulation_index_runs_the_library_ops(monkeypatch):
    """An Edit model's per-token modulation (zero_cond_t: the reference image's tokens take
    the modulation of timestep 0) under the switch: each run of tokens of one modulation set
    is one adaln_modulation / adaln_gate_residual call (counted); the fp32 model and its
    gradients within reduction tolerance of diffusers' own; in bf16 a sample alone gives its
    bytes in a padded batch."""
    g = torch.Generator().manual_seed(12)
    shapes = [[(1, 4, 4), (1, 4, 4)]]
    hidden = torch.randn(2, 32, 16, generator=g)
    text = torch.randn(2, 12, 32, generator=g)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 7:] = False
    text[1, 7:] = 0
    timestep = torch.tensor([0.3, 0.7])

    model = small_transformer(torch.float32, zero_cond_t=True)

    def run(x, t, ts, **kwargs):
        x = x.clone().requires_grad_()
        out = model(hidden_states=x, encoder_hidden_states=t, timestep=ts,
                    img_shapes=shapes * x.shape[0], **kwargs).sample
        out.square().mean().backward()
        return out.detach(), x.grad

    theirs = run(hidden, text, timestep)
    calls = []
    with under_contract(model):
        ours = run(hidden, text, timestep)
        with monkeypatch.context() as patch:
            for name in ("adaln_modulation", "adaln_gate_residual"):
                def counted(*args, _original=getattr(ka.functional, name), _name=name,
                            **kwargs):
                    calls.append(_name)
                    return _original(*args, **kwargs)
                patch.setattr(ka.functional, name, counted)
            run(hidden[:1], text[:1], timestep[:1])
    # Per block: 4 image-stream calls of 2 runs each and 4 text-stream calls; norm_out 1.
    assert calls.count("adaln_modulation") == 2 * (2 * 2 + 2) + 1
    assert calls.count("adaln_gate_residual") == 2 * (2 * 2 + 2)
    for o, t in zip(ours, theirs):
        assert_close(o, t, "reduction_forward")

    model = small_transformer(torch.bfloat16, zero_cond_t=True)
    with under_contract(model):
        batch = run(hidden.bfloat16(), text.bfloat16(), timestep.bfloat16(),
                    encoder_hidden_states_mask=mask)
        alone = run(hidden[1:].bfloat16(), text[1:, :7].bfloat16(), timestep[1:].bfloat16())
    assert_bitwise(batch[0][1:], alone[0])


def test_under_contract_switches_the_model_and_restores_it():
    """The switch sets our processor on every attention and the batch-invariant mode;
    restore() (or the end of its with block) puts the model's processors back and ends the
    mode; a prompt padded in a batch then gives its own length's bytes (forward)."""
    model = small_transformer(torch.bfloat16)
    before = dict(model.attn_processors)
    with under_contract(model) as switch:
        assert ka.is_batch_invariant()
        assert all(isinstance(p, KernelAlignQwenImageAttnProcessor)
                   for p in model.attn_processors.values())
        # Each block runs the library's ops (its forward replaced).
        for block in model.transformer_blocks:
            assert "forward" in block.__dict__
        # norm_out: one adaln_modulation call of its LayerNorm and (scale, shift) chunks.
        assert "forward" in model.norm_out.__dict__
        assert "forward" in model.time_text_embed.time_proj.__dict__
        assert "forward" in model.txt_norm.__dict__
        g = torch.Generator().manual_seed(5)
        hidden = torch.randn(2, 16, 16, generator=g).to(torch.bfloat16)
        text = torch.randn(2, 12, 32, generator=g).to(torch.bfloat16)
        mask = torch.ones(2, 12, dtype=torch.bool)
        mask[1, 7:] = False
        text[1, 7:] = 0
        timestep = torch.tensor([0.3, 0.7]).to(torch.bfloat16)
        with torch.no_grad():
            batch = model(hidden_states=hidden, encoder_hidden_states=text,
                          encoder_hidden_states_mask=mask, timestep=timestep,
                          img_shapes=[[(1, 4, 4)]] * 2).sample
            alone = model(hidden_states=hidden[1:], encoder_hidden_states=text[1:, :7],
                          timestep=timestep[1:], img_shapes=[[(1, 4, 4)]]).sample
        assert_bitwise(batch[1:], alone)
    assert not ka.is_batch_invariant()
    assert model.attn_processors == before
    for block in model.transformer_blocks:
        assert "forward" not in block.__dict__
    assert "forward" not in model.norm_out.__dict__
    assert "forward" not in model.time_text_embed.time_proj.__dict__
    assert "forward" not in model.txt_norm.__dict__
    switch.restore()  # idempotent
    with pytest.raises(TypeError, match="argument 'model': expected a diffusers "
                                        "QwenImageTransformer2DModel"):
        under_contract(torch.nn.Linear(2, 2))

