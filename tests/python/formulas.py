"""Independent fp32 torch formulas of the ops (docs/contract.md), written from the
contract's text with plain torch element-wise ops (each rounds once to fp32, no fused
multiply-add in eager mode), used as the oracle of the bitwise tests.

Square roots are taken in fp64 and rounded to fp32 (correctly rounded, as binary64
carries more than twice binary32's precision): torch 2.15's fp32 ``sqrt`` on CPU is not
correctly rounded for every input (e.g. sqrt(8.964911460876465) gives 2.9941463470,
the nearest fp32 is 2.9941461086)."""

from __future__ import annotations

import torch

LANES = 16
DW_BLOCK_ROWS = 256


def tree_sum(terms: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim in the contract's order: 16 lanes, term i added to lane
    i mod 16 in order, then halving 8, 4, 2, 1."""
    lanes = torch.zeros(terms.shape[:-1] + (LANES,), dtype=torch.float32)
    d = terms.shape[-1]
    for start in range(0, d, LANES):
        chunk = terms[..., start:start + LANES]
        lanes[..., :chunk.shape[-1]] = lanes[..., :chunk.shape[-1]] + chunk
    width = LANES // 2
    while width >= 1:
        lanes = lanes[..., :width] + lanes[..., width:2 * width]
        width //= 2
    return lanes[..., 0]


def divide(a: torch.Tensor, d: int) -> torch.Tensor:
    # A tensor divisor: torch may turn division by a Python scalar into a reciprocal product.
    return a / torch.full_like(a, float(d))


def sqrt_rn(a: torch.Tensor) -> torch.Tensor:
    """fp32 square root, correctly rounded."""
    return torch.sqrt(a.double()).float()


def rstd_of_mean(mean: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """rstd = 1 / sqrt(mean + eps), each step correctly rounded."""
    return torch.ones_like(mean) / sqrt_rn(mean + torch.full_like(mean, eps))


def rstd_tree(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """[..., 1] fp32 rstd with the contract's sum order."""
    xf = x.float()
    return rstd_of_mean(divide(tree_sum(xf * xf), x.shape[-1]), eps).unsqueeze(-1)


def rstd_torch_mean(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """[..., 1] fp32 rstd as the seed and diffusers compute it: torch's own mean and
    rsqrt."""
    return torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)


def normalized(x, rstd, weight, mode):
    """The value the weight multiplies: x * rstd, rounded through the weight's dtype in
    diffusers mode."""
    n = x.float() * rstd
    if mode == "diffusers" and weight is not None:
        n = n.to(weight.dtype).float()
    return n


def rmsnorm(x, weight=None, mode="single", eps=1e-6, out_dtype=None, rstd=None):
    rstd = rstd_tree(x, eps) if rstd is None else rstd
    n = normalized(x, rstd, weight, mode)
    y = n if weight is None else n * weight.float()
    return y.to(x.dtype if out_dtype is None else out_dtype)


def rmsnorm_backward(x, dy, weight=None, mode="single", eps=1e-6):
    """(dx, dw) per the contract: dx = rstd*g - x*(rstd^3 * dot/D), g = dy*w; dw summed
    over rows in blocks of 256 rows (the last one shorter), each from +0 in row order,
    then the block sums in block order."""
    xf, dyf = x.float(), dy.float()
    g = dyf if weight is None else dyf * weight.float()
    rstd = rstd_tree(x, eps)
    dot = tree_sum(g * xf).unsqueeze(-1)
    coef = ((rstd * rstd) * rstd) * divide(dot, x.shape[-1])
    dx = (rstd * g - xf * coef).to(x.dtype)
    if weight is None:
        return dx, None
    terms = (dyf * normalized(x, rstd, weight, mode)).reshape(-1, x.shape[-1])
    rows = terms.shape[0]
    dw = torch.zeros(x.shape[-1])
    for begin in range(0, rows, DW_BLOCK_ROWS):
        block = torch.zeros(x.shape[-1])
        for r in range(begin, min(begin + DW_BLOCK_ROWS, rows)):
            block = block + terms[r]
        dw = dw + block
    return dx, dw.to(weight.dtype)


def _table(table: torch.Tensor, layout: str) -> torch.Tensor:
    # [S, D/2] broadcast over the batch and head dims of the layout.
    return table[None, :, None, :] if layout == "bshd" else table[None, None, :, :]


def rope(x, cos, sin, pairing="interleaved", layout="bshd", transpose=False):
    """a' = a*c - b*s, b' = a*s + b*c on pairs (x[2i], x[2i+1]) or (x[i], x[i+D/2]);
    the transpose rotation uses -s."""
    c, s = _table(cos, layout), _table(sin, layout)
    if transpose:
        s = -s
    xf = x.float()
    half = x.shape[-1] // 2
    if pairing == "interleaved":
        a, b = xf[..., 0::2], xf[..., 1::2]
    else:
        a, b = xf[..., :half], xf[..., half:]
    ra, rb = a * c - b * s, a * s + b * c
    if pairing == "interleaved":
        out = torch.stack([ra, rb], dim=-1).flatten(-2)
    else:
        out = torch.cat([ra, rb], dim=-1)
    return out.to(x.dtype)


def sequence_split(x, text_len, layout):
    dim = 1 if layout == "bshd" else 2
    return x.narrow(dim, 0, text_len), x.narrow(dim, text_len, x.shape[dim] - text_len), dim


def norm_rope(x, text_w, image_w, cos, sin, text_len, mode="diffusers", pairing="interleaved",
              layout="bshd", out_dtype=None):
    """The fused op as the contract defines it: each stream normalised with its weight
    into the output dtype, then RoPE."""
    text, image, dim = sequence_split(x, text_len, layout)
    normed = torch.cat([rmsnorm(text, text_w, mode, out_dtype=out_dtype),
                        rmsnorm(image, image_w, mode, out_dtype=out_dtype)], dim=dim)
    return rope(normed, cos, sin, pairing, layout)


def as_bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def assert_bitwise(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    a, e = as_bits(actual.contiguous()), as_bits(expected.contiguous())
    mismatches = (a != e).sum().item()
    assert mismatches == 0, f"{mismatches} of {a.numel()} elements differ in their bits"


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in units in the last place between same-dtype finite tensors."""
    def ordered(t):
        bits = as_bits(t.contiguous()).long()
        sign_bit = 1 << (8 * t.element_size() - 1)
        return torch.where(bits < 0, -(bits & (sign_bit - 1)), bits)
    return (ordered(a) - ordered(b)).abs()


# Tolerance classes of the seed's contract (reference-facts.md): (atol, rtol) per dtype.
TOLERANCE = {
    "elementwise": {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 1.6e-2),
                    torch.float16: (1e-3, 1e-3)},
    "reduction_forward": {torch.float32: (1e-4, 1e-4), torch.bfloat16: (5e-2, 2e-2),
                          torch.float16: (1e-3, 1e-3)},
    "reduction_gradient": {torch.float32: (1e-4, 1e-4), torch.bfloat16: (1e-1, 2e-2),
                           torch.float16: (1e-3, 1e-3)},
}


def assert_close(actual, expected, tolerance_class, dtype=None):
    atol, rtol = TOLERANCE[tolerance_class][dtype or actual.dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol)
