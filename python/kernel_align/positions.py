"""Token positions, RoPE tables and the timestep embedding: wrappers of the C++ builders (positions.hpp,
tables.hpp), so Python gets the same positions and the same correctly rounded (MPFR)
tables as every other front end (docs/positions-and-tables.md).

Everything here but ``timestep_embedding`` (which returns its result on the timesteps'
device) returns new CPU tensors; move the tables to the device of the tensors
they rotate (``cos.to(x.device)``). ``POSITION_AXES`` (3) is the number of columns of the
positions built here: frame, height, width.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._ops import as_float, as_int, ops

__all__ = ["qwen_image_positions", "qwen_image_rope_positions", "rope_tables",
           "timestep_embedding", "POSITION_AXES"]

# Columns of the positions built here: (frame, height, width) (kPositionAxes, positions.hpp).
POSITION_AXES = 3


def qwen_image_positions(text_len: int, h: int, w: int) -> torch.Tensor:
    """The seed's layout: int32 ``[text_len + h*w, 3]`` (frame, height, width); text token
    j at (j, j, j) first, then the ``h x w`` token grid at (0, row, column), not centred.

    Args:
        text_len: text tokens, 0 to 2^31 - 1.
        h: grid rows (tokens), >= 1.
        w: grid columns (tokens), >= 1.

    Returns:
        A new int32 CPU tensor ``[text_len + h*w, 3]``.

    Raises:
        TypeError: text_len, h or w not an int.
        ValueError: text_len, h or w out of range, or more than 2^31 - 1 tokens.
    """
    op = "qwen_image_positions"
    return ops.positions("seed", as_int(op, "text_len", text_len), [as_int(op, "h", h)],
                         [as_int(op, "w", w)], [])


def _grids(img_shapes) -> tuple[list[int], list[int], list[int]]:
    # QwenEmbedRope.forward: a list is a batch whose first sample is used; a sample is one
    # (frame, height, width) or a list of them (the Edit pipelines' target and reference
    # images); image k covers frames k .. k + frame - 1.
    if isinstance(img_shapes, list):
        if not img_shapes:
            raise ValueError("kernel_align.qwen_image_rope_positions: argument 'img_shapes': "
                             "expected at least one sample, found an empty list")
        if any(sample != img_shapes[0] for sample in img_shapes):
            raise ValueError(
                "kernel_align.qwen_image_rope_positions: argument 'img_shapes': expected "
                f"every sample of the batch to have the same images, found {img_shapes} "
                "(diffusers would use the first sample's positions for all of them)"
            )
        img_shapes = img_shapes[0]
    images = img_shapes if isinstance(img_shapes, list) else [img_shapes]
    heights, widths, frames = [], [], []
    for index, image in enumerate(images):
        if not isinstance(image, Sequence) or len(image) != 3:
            raise ValueError("kernel_align.qwen_image_rope_positions: argument 'img_shapes': "
                             f"expected (frame, height, width) tuples, found {image!r}")
        frame_count, height, width = (
            as_int("qwen_image_rope_positions", "img_shapes", v) for v in image)
        if frame_count < 1:
            raise ValueError("kernel_align.qwen_image_rope_positions: argument 'img_shapes': "
                             f"expected frame counts >= 1, found {image!r}")
        for frame in range(index, index + frame_count):
            heights.append(height)
            widths.append(width)
            frames.append(frame)
    return heights, widths, frames


def qwen_image_rope_positions(img_shapes, txt_seq_len: int | torch.Tensor) -> torch.Tensor:
    """diffusers' layout (``QwenEmbedRope(scale_rope=True)``), in the joint sequence order
    ``[text, image 0, image 1, ...]`` that its attention processor uses: int32
    ``[txt_seq_len + tokens, 3]``. ``img_shapes`` as diffusers passes it to
    ``QwenImageTransformer2DModel`` (e.g. ``[[(1, 83, 83)]]``, or
    ``[[(1, h, w), (1, h2, w2)]] * B`` for Edit with a reference image).

    Image k of a sample sits at frame k (an entry with frame count f covers f frames from
    there), its rows and columns centred; text token j at ``m + j`` on every axis, m the
    largest ``max(h // 2, w // 2)`` of the images.

    Args:
        img_shapes: a batch list whose samples must all be equal (the first is used), a
            sample being one ``(frame, height, width)`` tuple or a list of them (frame
            >= 1, height and width >= 1 tokens); or a single such tuple.
        txt_seq_len: text tokens, 0 to 2^31 - 1 (an int or a 0-d integer tensor).

    Returns:
        A new int32 CPU tensor ``[txt_seq_len + sum of frame*height*width, 3]``.

    Raises:
        TypeError: txt_seq_len, or a frame, height or width, not an integer (1.5).
        ValueError: an empty batch, samples that differ, an entry that is not a
            ``(frame, height, width)`` triple, a frame count below 1, a side or
            txt_seq_len out of range, more than 2^31 - 1 tokens.
    """
    heights, widths, frames = _grids(img_shapes)
    return ops.positions("diffusers", as_int("qwen_image_rope_positions", "txt_seq_len",
                                             txt_seq_len), heights, widths, frames)


def rope_tables(
    positions: torch.Tensor,
    axes_dim: Sequence[int] = (16, 56, 56),
    theta: float = 10000.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, fp32 ``[S, sum(axes_dim)/2]``, of integer positions ``[S, len(axes_dim)]``:
    column i of axis a rotates by ``pos[:, a] / theta^(2i/dim_a)``; every step correctly
    rounded to fp32, identical on every machine.

    Args:
        positions: an integer CPU tensor ``[S, len(axes_dim)]``, S >= 1 (int32, or another
            integer dtype whose values fit int32; any strides).
        axes_dim: one even dim per column of positions, each 2 to 4096, summing to the
            head dim D <= 4096. Qwen-Image's (16, 56, 56) by default.
        theta: the base; finite, > 0 and representable in fp32.

    Returns:
        ``(cos, sin)``: new contiguous fp32 CPU tensors ``[S, D/2]``, the tables
        ``multi_axis_rope`` and ``qk_norm_rope`` take (constants: no gradient).

    Raises:
        TypeError: positions of a floating-point dtype; an axis dim not an int, theta not
            a real number.
        ValueError: positions not on the CPU, not ``[S, len(axes_dim)]``, empty, or with
            values outside int32; a bad axis dim or theta.
    """
    if positions.dtype != torch.int32 and not positions.dtype.is_floating_point:
        info = torch.iinfo(torch.int32)
        if positions.numel() and (positions.min() < info.min or positions.max() > info.max):
            raise ValueError("kernel_align.rope_tables: argument 'positions': expected values "
                             "that fit int32, found larger ones")
        positions = positions.to(torch.int32)
    op = "rope_tables"
    return ops.rope_tables(positions, [as_int(op, "axes_dim", d) for d in axes_dim],
                           as_float(op, "theta", theta))


def timestep_embedding(
    timesteps: torch.Tensor,
    channels: int = 256,
    *,
    flip_sin_to_cos: bool = True,
    downscale_freq_shift: float = 0.0,
    scale: float = 1000.0,
    max_period: float = 10000.0,
) -> torch.Tensor:
    """diffusers' sinusoidal timestep embedding (``Timesteps``, ``get_timestep_embedding``;
    Qwen-Image's by default: 256 channels, cos first, scale 1000) with every step of its
    fp32 recipe correctly rounded (MPFR on the host), so a timestep's row is the same on
    every machine and device and never depends on the batch.

    Args:
        timesteps: ``[n]``, any floating dtype and device (read as fp32; no gradient).
        channels: even, 2 to 4096.
        flip_sin_to_cos: the cos half first (diffusers' ``flip_sin_to_cos``).
        downscale_freq_shift: the frequencies' ``h - shift`` divisor's shift (h =
            channels/2); below h.
        scale: the factor of ``t * f``; finite.
        max_period: the period of the lowest frequency; finite, > 0.

    Returns:
        A new fp32 tensor ``[n, channels]`` on the timesteps' device.

    Raises:
        TypeError: timesteps not a tensor or not of a floating dtype; an option of the
            wrong type.
        ValueError: timesteps not 1-D, empty or not finite; a bad option.
    """
    op = "timestep_embedding"
    if not isinstance(timesteps, torch.Tensor) or not timesteps.dtype.is_floating_point:
        found = timesteps.dtype if isinstance(timesteps, torch.Tensor) else type(timesteps)
        raise TypeError(f"kernel_align.{op}: argument 'timesteps': expected a floating-point "
                        f"torch.Tensor, found {found}")
    if not isinstance(flip_sin_to_cos, bool):
        raise TypeError(f"kernel_align.{op}: argument 'flip_sin_to_cos': expected a bool, "
                        f"found {type(flip_sin_to_cos).__name__}")
    host = timesteps.detach().to("cpu", torch.float32)
    out = ops.timestep_embedding(host, as_int(op, "channels", channels), flip_sin_to_cos,
                                 as_float(op, "downscale_freq_shift", downscale_freq_shift),
                                 as_float(op, "scale", scale), as_float(op, "max_period", max_period))
    return out.to(timesteps.device)
