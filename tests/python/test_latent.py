"""kernel_align.latent_normalize, latent_pack, latent_unpack, latent_grid: the Qwen-Image
pipelines' latent normalization and 2x2 patchify under the contract. Bitwise equal to
diffusers' own _pack_latents and _unpack_latents (compiled from the installed pipeline's
source) and to the pipelines' normalization formulas in fp32 torch, rounded once in
bf16/fp16; strided inputs read in place; a sample's bytes independent of its batch;
exact gradients of every order (mean and std constants); opcheck and torch.compile
(static and dynamic shapes) giving the eager bytes; the CPU's bytes on a CUDA device
(skipped without one); bad arguments errors naming them."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import diffusers
import pytest
import torch
from diffusers.models.autoencoders.autoencoder_kl_qwenimage import AutoencoderKLQwenImage

import kernel_align as ka
from formulas import assert_bitwise

OPS = torch.ops.kernel_align
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
PIPELINE = Path(diffusers.__file__).parent / "pipelines" / "qwenimage" / "pipeline_qwenimage.py"
VAE_SCALE_FACTOR = 8


def _pipeline_static_methods() -> dict:
    """QwenImagePipeline's _pack_latents and _unpack_latents, compiled from diffusers' own
    source file: importing the pipeline module needs transformers, which the project does
    not install."""
    tree = ast.parse(PIPELINE.read_text(encoding="utf-8"))
    pipeline = next(node for node in tree.body
                    if isinstance(node, ast.ClassDef) and node.name == "QwenImagePipeline")
    methods = [node for node in pipeline.body if isinstance(node, ast.FunctionDef)
               and node.name in ("_pack_latents", "_unpack_latents")]
    assert len(methods) == 2 and all(
        [d.id for d in m.decorator_list] == ["staticmethod"] for m in methods)
    for method in methods:
        method.decorator_list = []
    namespace = {}
    exec(compile(ast.Module(body=methods, type_ignores=[]), str(PIPELINE), "exec"), namespace)
    return namespace


DIFFUSERS = _pipeline_static_methods()


def _vae_constants() -> tuple[list[float], list[float]]:
    """The Qwen-Image VAE's latents_mean and latents_std (its config's defaults)."""
    parameters = inspect.signature(AutoencoderKLQwenImage.__init__).parameters
    return parameters["latents_mean"].default, parameters["latents_std"].default


LATENTS_MEAN, LATENTS_STD = _vae_constants()
C = len(LATENTS_MEAN)


def _t(shape, dtype=torch.float32, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(shape, generator=g)).to(dtype).requires_grad_(grad)


def _constants():
    return torch.tensor(LATENTS_MEAN), torch.tensor(LATENTS_STD)


def _channels(t: torch.Tensor, rank: int) -> torch.Tensor:
    # [C] as [1, C, 1, ...] against latents of `rank` dims.
    return t.view(1, -1, *([1] * (rank - 2)))


def _pipeline_normalize(z: torch.Tensor) -> torch.Tensor:
    """The Edit pipelines' _encode_vae_image, in fp32: latents [B, C, 1, H, W]."""
    latents_mean = torch.tensor(LATENTS_MEAN).view(1, C, 1, 1, 1).to(z.device, z.dtype)
    latents_std = torch.tensor(LATENTS_STD).view(1, C, 1, 1, 1).to(z.device, z.dtype)
    return (z - latents_mean) / latents_std


def _pipeline_denormalize(z: torch.Tensor) -> torch.Tensor:
    """The pipelines' latents before vae.decode, in fp32: latents [B, C, 1, H, W]."""
    latents_mean = torch.tensor(LATENTS_MEAN).view(1, C, 1, 1, 1).to(z.device, z.dtype)
    latents_std = 1.0 / torch.tensor(LATENTS_STD).view(1, C, 1, 1, 1).to(z.device, z.dtype)
    return z / latents_std + latents_mean


def _fp32_formula(z, mean, std, transform):
    """The contract's arithmetic in fp32 torch, each operation rounded once to fp32."""
    zf, m, s = z.float(), _channels(mean.float(), z.dim()), _channels(std.float(), z.dim())
    if transform == "normalize":
        return (zf - m) / s
    return zf / (torch.ones_like(s) / s) + m


# ---------------------------------------------------------------------------------------
# latent_normalize


@pytest.mark.parametrize("transform", ["normalize", "denormalize"])
def test_normalize_is_the_pipelines_formula_in_fp32(transform):
    mean, std = _constants()
    z = _t((2, C, 1, 12, 10))  # the pipelines' [B, C, frames, H, W]
    want = (_pipeline_normalize if transform == "normalize" else _pipeline_denormalize)(z)
    assert_bitwise(ka.latent_normalize(z[:, :, 0], mean, std, transform=transform), want[:, :, 0])
    # [B, C, L]: the same per-channel map over a flattened grid.
    flat = ka.latent_normalize(z.flatten(2), mean, std, transform=transform)
    assert_bitwise(flat, want.flatten(2))


@pytest.mark.parametrize("transform", ["normalize", "denormalize"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("constants_dtype", DTYPES)
def test_normalize_rounds_once(transform, dtype, constants_dtype):
    """Any dtypes: fp32 arithmetic on the widened values, one rounding to z's dtype."""
    mean, std = (c.to(constants_dtype) for c in _constants())
    z = _t((3, C, 8, 6), dtype, seed=1)
    y = ka.latent_normalize(z, mean, std, transform=transform)
    assert y.dtype == dtype and y.shape == z.shape
    assert_bitwise(y, _fp32_formula(z, mean, std, transform).to(dtype))


def test_normalize_reads_strided_views_in_place():
    mean, std = _constants()
    base = _t((2, 2 * C, 9, 14), torch.bfloat16, seed=2)
    z = base[:, ::2, 1:, ::2].transpose(2, 3)  # sliced channels, offset rows, permuted dims
    means = torch.stack([mean, -mean], 1).flatten()[::2]  # [C] of stride 2
    assert not z.is_contiguous() and means.stride() == (2,)
    y = ka.latent_normalize(z, means, std)
    assert y.stride() == torch.empty_like(z).stride()
    assert_bitwise(y, ka.latent_normalize(z.contiguous(), mean, std))
    assert_bitwise(y, _fp32_formula(z, mean, std, "normalize").to(torch.bfloat16))


def test_normalize_samples_do_not_depend_on_their_batch():
    mean, std = _constants()
    z = _t((5, C, 6, 8), torch.bfloat16, seed=3)
    for transform in ("normalize", "denormalize"):
        batch = ka.latent_normalize(z, mean, std, transform=transform)
        for i in range(5):
            alone = ka.latent_normalize(z[i:i + 1].clone(), mean, std, transform=transform)
            assert_bitwise(alone, batch[i:i + 1])


@pytest.mark.parametrize("transform", ["normalize", "denormalize"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_normalize_gradient_is_dy_over_std(transform, dtype):
    """dz = dy / std or dy / (1 / std) in fp32, rounded once; mean and std, constants, get
    no gradient even when they require grad; the gradient's own gradient is the same
    scaling (exact double backward)."""
    mean, std = (c.requires_grad_() for c in _constants())
    z = _t((2, C, 4, 6), dtype, seed=4, grad=True)
    y = ka.latent_normalize(z, mean, std, transform=transform)
    dy = _t(y.shape, dtype, seed=5, grad=True)
    (dz,) = torch.autograd.grad(y, z, dy, create_graph=True)
    s = _channels(std.detach(), 4)
    divisor = s if transform == "normalize" else torch.ones_like(s) / s
    assert_bitwise(dz, (dy.detach().float() / divisor).to(dtype))
    assert_bitwise(dz, OPS.latent_normalize_backward(dy.detach(), std.detach(), transform))
    y.backward(dy.detach())
    assert mean.grad is None and std.grad is None and z.grad is not None
    g = _t(dz.shape, dtype, seed=6)
    (ddy,) = torch.autograd.grad(dz, dy, g)
    assert_bitwise(ddy, (g.float() / divisor).to(dtype))


# ---------------------------------------------------------------------------------------
# latent_pack, latent_unpack, latent_grid


@pytest.mark.parametrize("dtype", DTYPES)
def test_pack_and_unpack_are_diffusers(dtype):
    """For an image size that is not a multiple of 16 (the pipelines truncate it)."""
    image_height, image_width = 1000, 760
    h, w = ka.latent_grid(image_height, image_width)
    x = _t((2, C, h, w), dtype, seed=7)
    tokens = ka.latent_pack(x)
    assert tokens.shape == (2, h // 2 * w // 2, 4 * C) and tokens.is_contiguous()
    assert_bitwise(tokens, DIFFUSERS["_pack_latents"](x, 2, C, h, w))
    latents = ka.latent_unpack(tokens, h, w)
    assert latents.is_contiguous()
    want = DIFFUSERS["_unpack_latents"](tokens, image_height, image_width, VAE_SCALE_FACTOR)
    assert_bitwise(latents, want[:, :, 0])
    assert_bitwise(latents, x)


def test_latent_grid_is_the_pipelines_rule():
    for height, width, factor in ((1328, 1328, 8), (1000, 760, 8), (16, 17, 8), (1024, 31, 4)):
        want = tuple(2 * (int(n) // (factor * 2)) for n in (height, width))
        assert ka.latent_grid(height, width, factor) == want
        # The grid _unpack_latents derives from the same image size.
        tokens = torch.zeros(1, want[0] // 2 * want[1] // 2, 4)
        assert DIFFUSERS["_unpack_latents"](tokens, height, width, factor).shape[-2:] == want
    assert ka.latent_grid(1328, 1328) == (166, 166)


def test_pack_reads_strided_views_in_place():
    base = _t((3, C, 10, 12), torch.float16, seed=8)
    x = base.transpose(2, 3)[::2, :, 2:]  # [2, C, 10, 10], permuted and sliced
    assert not x.is_contiguous()
    assert_bitwise(ka.latent_pack(x), DIFFUSERS["_pack_latents"](x.contiguous(), 2, C, 10, 10))
    tokens = _t((2, 4 * C, 15), seed=9).transpose(1, 2)[:, 3:]  # [2, 12, 4C] of stride 1 in S
    assert not tokens.is_contiguous()
    assert_bitwise(ka.latent_unpack(tokens, 6, 8), ka.latent_unpack(tokens.contiguous(), 6, 8))


def test_pack_samples_do_not_depend_on_their_batch():
    x = _t((4, C, 6, 10), torch.bfloat16, seed=10)
    tokens = ka.latent_pack(x)
    for i in range(4):
        alone = ka.latent_pack(x[i:i + 1].clone())
        assert_bitwise(alone, tokens[i:i + 1])
        assert_bitwise(ka.latent_unpack(alone, 6, 10), ka.latent_unpack(tokens, 6, 10)[i:i + 1])


def test_pack_and_unpack_are_each_others_gradients_to_any_order():
    x = _t((2, C, 4, 6), torch.bfloat16, seed=11, grad=True)
    tokens = ka.latent_pack(x)
    g = _t(tokens.shape, torch.bfloat16, seed=12, grad=True)
    (dx,) = torch.autograd.grad(tokens, x, g, create_graph=True)
    assert_bitwise(dx, ka.latent_unpack(g.detach(), 4, 6))
    h = _t(dx.shape, torch.bfloat16, seed=13)
    (dg,) = torch.autograd.grad(dx, g, h)
    assert_bitwise(dg, ka.latent_pack(h))
    t = _t(tokens.shape, seed=14, grad=True)
    (dt,) = torch.autograd.grad(ka.latent_unpack(t, 4, 6), t, x.detach().float())
    assert_bitwise(dt, ka.latent_pack(x.detach().float()))


# ---------------------------------------------------------------------------------------
# torch.library and torch.compile


def test_opcheck():
    mean, std = _constants()
    z = _t((2, C, 4, 6), seed=15, grad=True)
    torch.library.opcheck(OPS.latent_normalize, (z, mean, std, "normalize"))
    torch.library.opcheck(OPS.latent_normalize, (z.flatten(2), mean, std, "denormalize"))
    torch.library.opcheck(OPS.latent_normalize_backward, (z.detach(), std, "denormalize"))
    torch.library.opcheck(OPS.latent_pack, (z,))
    torch.library.opcheck(OPS.latent_pack_backward, (_t((2, 6, 4 * C), seed=16, grad=True), 4, 6))


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_gives_the_eager_bytes(dynamic):
    """The pipeline's round trip, compiled (fullgraph): the same bytes forward and backward,
    for two latent sizes (with dynamic shapes, the pack's gradient takes symbolic sizes)."""
    mean, std = _constants()

    def round_trip(z):
        tokens = ka.latent_pack(ka.latent_normalize(z, mean, std))
        latents = ka.latent_unpack(tokens * 2, z.shape[2], z.shape[3])
        return ka.latent_normalize(latents, mean, std, transform="denormalize")

    torch._dynamo.reset()
    compiled = torch.compile(round_trip, fullgraph=True, dynamic=dynamic)
    for seed, shape in enumerate(((2, C, 6, 8), (1, C, 10, 4))):
        z = _t(shape, torch.bfloat16, seed=17 + seed, grad=True)
        eager = round_trip(z)
        (eager_grad,) = torch.autograd.grad(eager, z, torch.ones_like(eager))
        out = compiled(z)
        assert_bitwise(out, eager)
        assert_bitwise(torch.autograd.grad(out, z, torch.ones_like(out))[0], eager_grad)


@pytest.mark.skipif(not (ka.HAS_CUDA and torch.cuda.is_available()),
                    reason="the extension has no CUDA kernels or no CUDA device is visible")
def test_cuda_gives_the_cpu_bytes():
    """The four operators on CUDA tensors (strided ones too), and a gradient through them."""
    mean, std = _constants()
    host = dict(z=_t((2, C, 6, 8), torch.bfloat16, seed=21), mean=mean, std=std,
                dy=_t((2, C, 6, 8), torch.float16, seed=22),
                tokens=_t((2, 12, 4 * C), torch.float32, seed=23))
    calls = [
        lambda t: OPS.latent_normalize(t["z"], t["mean"], t["std"], "normalize"),
        lambda t: OPS.latent_normalize(t["z"].transpose(2, 3), t["mean"], t["std"],
                                       "denormalize"),
        lambda t: OPS.latent_normalize_backward(t["dy"], t["std"], "denormalize"),
        lambda t: OPS.latent_pack(t["z"]),
        lambda t: OPS.latent_pack(t["z"].transpose(2, 3)),
        lambda t: OPS.latent_pack_backward(t["tokens"], 6, 8),
    ]
    device = {name: t.cuda() for name, t in host.items()}
    for call in calls:
        got = call(device)
        assert got.is_cuda
        assert_bitwise(got.cpu(), call(host))
    z = device["z"].clone().requires_grad_()
    tokens = ka.latent_pack(ka.latent_normalize(z, device["mean"], device["std"]))
    (dz,) = torch.autograd.grad(tokens, z, device["tokens"].bfloat16())
    want = OPS.latent_normalize_backward(ka.latent_unpack(host["tokens"].bfloat16(), 6, 8),
                                         std, "normalize")
    assert_bitwise(dz.cpu(), want)


# ---------------------------------------------------------------------------------------
# Errors


def test_bad_arguments_name_them():
    mean, std = _constants()
    z = _t((2, C, 6, 8))
    with pytest.raises(ValueError, match=r"argument 'mean'.*shape \[16\].*found shape \[3\]"):
        ka.latent_normalize(z, mean[:3], std)
    with pytest.raises(ValueError, match=r"argument 'std'"):
        ka.latent_normalize(z, mean, std[None])
    with pytest.raises(ValueError, match=r"argument 'z'.*rank 3 or 4"):
        ka.latent_normalize(z[0, 0], mean, std)
    with pytest.raises(ValueError, match=r"argument 'transform'.*normalize, denormalize"):
        ka.latent_normalize(z, mean, std, transform="scale")
    with pytest.raises(TypeError, match=r"argument 'transform'"):
        ka.latent_normalize(z, mean, std, transform=1)
    with pytest.raises(TypeError, match=r"argument 'std'"):
        ka.latent_normalize(z, mean, LATENTS_STD)
    with pytest.raises(ValueError, match=r"argument 'latents'.*even H and W"):
        ka.latent_pack(z[:, :, :5])
    with pytest.raises(ValueError, match=r"argument 'latents'.*rank 4"):
        ka.latent_pack(z[0])
    with pytest.raises(TypeError, match=r"argument 'latents'.*torch.float64"):
        ka.latent_pack(z.double())
    tokens = ka.latent_pack(z)
    with pytest.raises(ValueError, match=r"argument 'height, width'.*even H and W"):
        ka.latent_unpack(tokens, 5, 8)
    with pytest.raises(ValueError, match=r"argument 'height, width'.*non-empty"):
        ka.latent_unpack(tokens, -6, 8)
    with pytest.raises(ValueError, match=r"argument 'tokens'.*\[2, 15, 64\]"):
        ka.latent_unpack(tokens, 6, 10)
    with pytest.raises(TypeError, match=r"argument 'tokens'.*torch.int32"):
        ka.latent_unpack(tokens.int(), 6, 8)
    with pytest.raises(TypeError, match=r"argument 'height'"):
        ka.latent_unpack(tokens, 6.0, 8)
    with pytest.raises(ValueError, match=r"argument 'width'.*at least 16"):
        ka.latent_grid(1024, 15)
    with pytest.raises(ValueError, match=r"argument 'vae_scale_factor'"):
        ka.latent_grid(1024, 1024, 0)
    with pytest.raises(TypeError, match=r"argument 'height'"):
        ka.latent_grid(1024.0, 1024)
