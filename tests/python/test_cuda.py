"""The operators on CUDA tensors: the same bytes as on the CPU (every op, forward,
backward and in place; autograd; torch.compile), queued on torch's current stream, and
the diffusers processor on a CUDA model. Skipped, with the reason, where the extension
has no CUDA kernels or no device is visible (CI machines have neither a GPU nor a
driver)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernel_align as ka
from formulas import assert_bitwise

OPS = torch.ops.kernel_align

if not ka.HAS_CUDA:
    pytest.skip("the extension was built without the CUDA backend (no nvcc, or a CPU torch)",
                allow_module_level=True)
if not torch.cuda.is_available():
    pytest.skip("no CUDA device is visible to torch (torch.cuda.is_available() is False)",
                allow_module_level=True)


def tables(seq, d, generator):
    angles = torch.rand(seq, d // 2, generator=generator) * 50
    return torch.cos(angles), torch.sin(angles)


def inputs(dtype, generator, seq=37, heads=3, k_heads=2, d=128):
    q = torch.randn(2, seq, heads, d, generator=generator).to(dtype)
    k = torch.randn(2, seq, k_heads, d, generator=generator).to(dtype)
    w = [(1 + 0.2 * torch.randn(d, generator=generator)).to(dtype) for _ in range(4)]
    return q, k, w, tables(seq, d, generator)


def cuda(*tensors):
    return [t.cuda() for t in tensors]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [128, 18])
def test_every_op_gives_the_cpu_bytes(dtype, d, generator):
    q, k, w, (cos, sin) = inputs(dtype, generator, d=d)
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    calls = [
        lambda q, k, w0, w1, w2, w3, cos, sin, dq, dk: OPS.qk_rmsnorm(q, w0, 1e-6, "diffusers",
                                                                      None),
        lambda q, k, w0, w1, w2, w3, cos, sin, dq, dk: OPS.qk_rmsnorm_backward(
            q, dq, w0, 1e-6, "diffusers", True),
        lambda q, k, w0, w1, w2, w3, cos, sin, dq, dk: OPS.multi_axis_rope(
            q, cos, sin, "interleaved", "bshd"),
        lambda q, k, w0, w1, w2, w3, cos, sin, dq, dk: OPS.multi_axis_rope_backward(
            q.transpose(1, 2), cos, sin, "half", "bhsd"),
        lambda q, k, w0, w1, w2, w3, cos, sin, dq, dk: OPS.qk_norm_rope(
            q, k, w0, w1, w2, w3, cos, sin, 5, 1e-6, "diffusers", "interleaved", "bshd", None),
        lambda q, k, w0, w1, w2, w3, cos, sin, dq, dk: OPS.qk_norm_rope_backward(
            q, k, dq, dk, w0, w1, w2, w3, cos, sin, 5, 1e-6, "diffusers", "interleaved", "bshd",
            [True, True, False, True]),
    ]
    host = (q, k, *w, cos, sin, dq, dk)
    for call in calls:
        expected = call(*host)
        got = call(*cuda(*host))
        for e, g in zip(expected if isinstance(expected, tuple) else (expected,),
                        got if isinstance(got, tuple) else (got,)):
            assert g.is_cuda
            assert_bitwise(g.cpu(), e)
    # In place, on a stream of the caller's: ordered with the work torch queues there.
    stream = torch.cuda.Stream()
    q_dev, k_dev = cuda(q, k)
    with torch.cuda.stream(stream):
        q_work, k_work = q_dev * 1, k_dev * 1
        ka.qk_norm_rope_(q_work, k_work, *cuda(cos, sin), text_len=5)
        expected_q, expected_k = ka.qk_norm_rope(q, k, cos, sin, text_len=5)
    stream.synchronize()
    assert_bitwise(q_work.cpu(), expected_q)
    assert_bitwise(k_work.cpu(), expected_k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_ops_give_the_cpu_bytes(dtype, generator):
    """Attention (a padded batch), adaln_modulation and adaln_gate_residual, forward and
    backward, on the CUDA backend's kernels: the CPU's bytes."""
    q, k, v, dout = (torch.randn(2, 40, 2, 128, generator=generator).to(dtype) for _ in range(4))
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, 25:] = False
    x, y, dy = (torch.randn(2, 33, 96, generator=generator).to(dtype) for _ in range(3))
    scale, shift = ((0.1 * torch.randn(2, 96, generator=generator)).to(dtype) for _ in range(2))
    calls = [
        lambda t: OPS.attention(t["q"], t["k"], t["v"], t["mask"], "bshd"),
        lambda t: OPS.attention_backward(t["q"], t["k"], t["v"], t["mask"],
                                         OPS.attention(t["q"], t["k"], t["v"], t["mask"], "bshd"),
                                         t["dout"], "bshd"),
        lambda t: OPS.adaln_modulation(t["x"], t["scale"], t["shift"], 1e-6, "diffusers"),
        lambda t: OPS.adaln_modulation_backward(t["x"], t["scale"], t["dy"], 1e-6, "diffusers"),
        lambda t: OPS.adaln_gate_residual(t["x"], t["scale"], t["y"], "diffusers"),
        lambda t: OPS.adaln_gate_residual_backward(t["scale"], t["y"], t["dy"], "diffusers"),
    ]
    host = dict(q=q, k=k, v=v, dout=dout, mask=mask, x=x, y=y, dy=dy, scale=scale, shift=shift)
    device = {name: t.cuda() for name, t in host.items()}
    for call in calls:
        expected, got = call(host), call(device)
        for e, g in zip(expected if isinstance(expected, tuple) else (expected,),
                        got if isinstance(got, tuple) else (got,)):
            assert g.is_cuda
            assert_bitwise(g.cpu(), e)


def test_batch_invariant_routes_sdpa_on_cuda(generator):
    """F.scaled_dot_product_attention on CUDA tensors inside the mode: the CPU's bytes of
    kernel_align.attention, forward and backward."""
    q, k, v = (torch.randn(2, 2, 24, 128, generator=generator).bfloat16() for _ in range(3))
    mask = torch.ones(2, 24, dtype=torch.bool)
    mask[0, 17:] = False
    expected = ka.attention(q, k, v, mask, layout="bhsd")
    qd, kd, vd = (t.cuda().requires_grad_() for t in (q, k, v))
    with ka.batch_invariant():
        got = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask.cuda()[:, None, None, :])
        grads = torch.autograd.grad(got.float().sum(), (qd, kd, vd))
    assert_bitwise(got.detach().cpu(), expected)
    host = [t.clone().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(ka.attention(*host, mask, layout="bhsd").float().sum(), host)
    for g, w in zip(grads, want):
        assert_bitwise(g.cpu(), w)


def test_autograd_and_compile_on_cuda(generator):
    q, k, w, (cos, sin) = inputs(torch.bfloat16, generator)

    def loss_and_grads(q, k, w, cos, sin, compiled=False):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, *w)]

        def step(q, k, w0, w1, w2, w3):
            qo, ko = ka.qk_norm_rope(q, k, cos, sin, text_len=7, text_q_weight=w0,
                                     text_k_weight=w1, image_q_weight=w2, image_k_weight=w3)
            return (qo.float().square().sum() + ko.float().sum())

        fn = torch.compile(step, fullgraph=True) if compiled else step
        loss = fn(*leaves)
        loss.backward()
        return [leaf.grad for leaf in leaves]

    on_cpu = loss_and_grads(q, k, w, cos, sin)
    on_cuda = loss_and_grads(*cuda(q, k), cuda(*w), *cuda(cos, sin))
    for e, g in zip(on_cpu, on_cuda):
        assert_bitwise(g.cpu(), e)
    compiled = loss_and_grads(*cuda(q, k), cuda(*w), *cuda(cos, sin), compiled=True)
    for e, g in zip(on_cpu, compiled):
        assert_bitwise(g.cpu(), e)


def test_mixed_devices_are_refused(generator):
    q, k, w, (cos, sin) = inputs(torch.float32, generator)
    with pytest.raises(ValueError, match=r"argument 'cos': expected a tensor on cuda:0"):
        OPS.multi_axis_rope(q.cuda(), cos, sin.cuda(), "interleaved", "bshd")


def test_diffusers_processor_on_a_cuda_model():
    diffusers = pytest.importorskip("diffusers", reason="diffusers is not installed here")
    from kernel_align.diffusers import KernelAlignQwenImageAttnProcessor

    def run(device):
        torch.manual_seed(0)
        model = diffusers.QwenImageTransformer2DModel(
            patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=128,
            num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(16, 56, 56))
        model.set_attn_processor(KernelAlignQwenImageAttnProcessor())
        model = model.to(device=device, dtype=torch.bfloat16).eval()
        generator = torch.Generator().manual_seed(5)
        hidden = torch.randn(1, 64, 16, generator=generator).to(device, torch.bfloat16)
        text = torch.randn(1, 5, 32, generator=generator).to(device, torch.bfloat16)
        with torch.no_grad():
            return model(hidden_states=hidden, encoder_hidden_states=text,
                         timestep=torch.full((1,), 0.5, device=device),
                         img_shapes=[[(1, 8, 8)]]).sample

    on_cuda = run("cuda")
    assert on_cuda.is_cuda and torch.isfinite(on_cuda.float()).all()
    # The attention itself (SDPA) differs between devices, so the model output is judged
    # loosely; the fused op's bytes are tested above.
    torch.testing.assert_close(on_cuda.cpu().float(), run("cpu").float(), atol=5e-2, rtol=5e-2)
