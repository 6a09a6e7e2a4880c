"""Quantization helpers for the fused MoE op, exactly as the op contract defines them.

INT8 (``moe_comp_method=1``) is symmetric: per row,
``scale = max(max|x|, 1e-10) / 127`` and ``q = round_half_to_even(x / scale)``
clamped to [-127, 127]. The kernel quantizes activations per token this way at
run time; weights are quantized per output channel by the same rule.

FP8 (``moe_comp_method=2``) weights are float8_e4m3fn with one float32 scale per
``[bn, bk]`` block of the ``[rows, K]`` matrix; blocks at the right and bottom
edges may be partial.

4-bit weights (``moe_comp_method=3`` and ``4``) hold two values per uint8: byte j
of a row holds column 2j in its low nibble and column 2j+1 in its high one, so a
``[..., rows, cols]`` matrix is ``[..., rows, cols / 2]`` bytes.

- INT4_W4A8: value = (q - zero[g]) * scale[g], q in [0, 15], per group g of G
  consecutive columns; scales float32 and zeros uint8 ``[..., rows, cols / G]``,
  no zeros meaning zero point 8.
- MXFP4 (OCP Microscaling): a nibble is an E2M1 element, sign in bit 3 and
  magnitude index in bits 0-2 into {0, 0.5, 1, 1.5, 2, 3, 4, 6}; one E8M0 scale
  byte s per 32 columns, value = element * 2^(s - 127); s = 255 (NaN) is invalid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = [
    "E2M1_VALUES",
    "E8M0_BIAS",
    "FP8_MAX",
    "INT4_DEFAULT_ZERO",
    "INT8_MAX",
    "MXFP4_BLOCK",
    "dequantize_fp8_block",
    "dequantize_int4",
    "dequantize_mxfp4",
    "pack_nibbles",
    "quantize_fp8_block",
    "quantize_int4",
    "quantize_int8_per_channel",
    "quantize_int8_per_token",
    "quantize_mxfp4",
    "unpack_nibbles",
]

INT8_MAX = 127
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448.0
# Keeps the scale of an all-zero row positive, so dividing by it is safe.
_MIN_AMAX = 1e-10

INT4_MAX = 15
# The zero point of INT4_W4A8 weights passed without zeros.
INT4_DEFAULT_ZERO = 8
# The group size of INT4_W4A8 is a multiple of this; MXFP4 blocks are this long.
MXFP4_BLOCK = 32
E8M0_BIAS = 127
E8M0_NAN = 255
# E2M1 by nibble: magnitude index in bits 0-2, sign in bit 3.
_E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_VALUES = torch.tensor(_E2M1_MAGNITUDES + tuple(-v for v in _E2M1_MAGNITUDES))
# log2 of the largest E2M1 magnitude's power of two (6 = 1.5 * 2^2).
_E2M1_EMAX = 2


def _quantize_int8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantization along the last dimension, in float32."""
    x = x.float()
    scale = x.abs().amax(dim=-1).clamp(min=_MIN_AMAX) / INT8_MAX
    # torch.round rounds half to even, as the contract asks.
    q = torch.round(x / scale.unsqueeze(-1)).clamp(-INT8_MAX, INT8_MAX)
    return q.to(torch.int8), scale


def quantize_int8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize activations to int8 with one scale per row (token).

    Args:
        x: ``[rows, K]`` float tensor of any float dtype.

    Returns:
        ``(q, scale)``: ``q`` int8 ``[rows, K]`` and ``scale`` float32 ``[rows]``,
        with ``x ~= q * scale[:, None]``.
    """
    if x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"x: expected a 2-D float tensor, got {x.dim()}-D {x.dtype}")
    return _quantize_int8_rows(x)


def quantize_int8_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize expert weights to int8 with one scale per output channel.

    Args:
        w: ``[E, R, K]`` float weights, row = output channel.

    Returns:
        ``(q, scale)``: ``q`` int8 ``[E, R, K]`` and ``scale`` float32 ``[E, R]``
        (the ``w1_scale`` / ``w2_scale`` of ``moe_comp_method=1``).
    """
    if w.dim() != 3 or not w.is_floating_point():
        raise ValueError(f"w: expected a 3-D float tensor [E, R, K], got {w.dim()}-D {w.dtype}")
    return _quantize_int8_rows(w)


def _check_block_size(block_size: Sequence[int]) -> tuple[int, int]:
    if len(block_size) != 2 or any(int(b) <= 0 for b in block_size):
        raise ValueError(f"block_size: expected two positive ints [bn, bk], got {list(block_size)}")
    return int(block_size[0]), int(block_size[1])


def _pad_to_blocks(w: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    """Zero-pad the last two dims of ``w`` up to whole blocks."""
    rows, cols = w.shape[-2:]
    return torch.nn.functional.pad(w, (0, -cols % bk, 0, -rows % bn))


def quantize_fp8_block(
    w: torch.Tensor, block_size: Sequence[int] = (128, 128)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize expert weights to float8_e4m3fn with one scale per block.

    Each ``[bn, bk]`` block gets ``scale = max(max|block|, 1e-10) / 448`` so that
    its largest value maps onto the largest finite e4m3 value.

    Args:
        w: ``[E, R, K]`` float weights, row = output channel.
        block_size: ``(bn, bk)``, block rows and columns; need not divide R, K.

    Returns:
        ``(q, scale)``: ``q`` float8_e4m3fn ``[E, R, K]`` and ``scale`` float32
        ``[E, ceil(R / bn), ceil(K / bk)]``.
    """
    if w.dim() != 3 or not w.is_floating_point():
        raise ValueError(f"w: expected a 3-D float tensor [E, R, K], got {w.dim()}-D {w.dtype}")
    bn, bk = _check_block_size(block_size)
    e, rows, cols = w.shape
    grid_rows, grid_cols = math.ceil(rows / bn), math.ceil(cols / bk)
    blocks = _pad_to_blocks(w.float(), bn, bk).reshape(e, grid_rows, bn, grid_cols, bk)
    scale = blocks.abs().amax(dim=(2, 4)).clamp(min=_MIN_AMAX) / FP8_MAX
    q = (blocks / scale[:, :, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    q = q.reshape(e, grid_rows * bn, grid_cols * bk)[:, :rows, :cols]
    return q.contiguous().to(torch.float8_e4m3fn), scale


def dequantize_fp8_block(
    q: torch.Tensor, scale: torch.Tensor, block_size: Sequence[int]
) -> torch.Tensor:
    """Expand block-scaled float8_e4m3fn weights to float32.

    Args:
        q: ``[E, R, K]`` float8_e4m3fn weights.
        scale: ``[E, ceil(R / bn), ceil(K / bk)]`` float32 block scales.
        block_size: ``(bn, bk)``.

    Returns:
        ``[E, R, K]`` float32, ``q * scale`` of each element's block.
    """
    bn, bk = _check_block_size(block_size)
    e, rows, cols = q.shape
    expected = (e, math.ceil(rows / bn), math.ceil(cols / bk))
    if tuple(scale.shape) != expected:
        raise ValueError(
            f"scale: expected shape {list(expected)} for weights {list(q.shape)} and "
            f"block_size [{bn}, {bk}], got {list(scale.shape)}"
        )
    per_element = scale.float().repeat_interleave(bn, dim=1).repeat_interleave(bk, dim=2)
    return q.float() * per_element[:, :rows, :cols]


def _check_float_matrix(name: str, w: torch.Tensor) -> None:
    if w.dim() < 2 or not w.is_floating_point():
        raise ValueError(f"{name}: expected a float tensor [..., rows, cols], got {w.dim()}-D {w.dtype}")


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """Two 4-bit values per byte along the last dimension: column 2j in the low
    nibble of byte j, column 2j+1 in its high nibble.

    Args:
        q: ``[..., cols]`` integer tensor of values in [0, 15], cols even.

    Returns:
        uint8 ``[..., cols / 2]``.
    """
    if q.is_floating_point() or q.dim() == 0 or q.shape[-1] % 2:
        raise ValueError(f"q: expected integers [..., cols] with cols even, got {q.dtype} {list(q.shape)}")
    q = q.to(torch.uint8)
    return q[..., 0::2] | (q[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of ``pack_nibbles``: uint8 ``[..., bytes]`` to ``[..., 2 * bytes]``."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed: expected uint8 (two 4-bit values per byte), got {packed.dtype}")
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def _group_size(name: str, cols: int, groups: int) -> int:
    """The group size a scale of ``groups`` columns gives a ``cols``-wide matrix."""
    if groups <= 0 or cols % groups:
        raise ValueError(f"{name}: {groups} groups do not divide the {cols} columns of the weight")
    return cols // groups


def quantize_int4(
    weight: torch.Tensor, group_size: int, *, symmetric: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Quantize float weights to INT4_W4A8's layout, per group of ``group_size``
    consecutive columns (the reduction dimension) of each row.

    Asymmetric (default), GPTQ's rule: with ``lo = min(min, 0)`` and
    ``hi = max(max, 0)`` of a group, ``scale = max(hi - lo, 1e-10) / 15`` and
    ``zero = round(-lo / scale)``, so the range, 0 included, spans the 16 levels. Symmetric: zero point 8 and ``scale = max(max|w|, 1e-10) / 7``. Then
    ``q = clamp(round(w / scale) + zero, 0, 15)``, rounding half to even.

    Args:
        weight: ``[..., rows, cols]`` float weights, row = output channel.
        group_size: a multiple of 32 that divides cols.
        symmetric: no zero points (the op's zeros=None).

    Returns:
        ``(packed, scale, zero)``: uint8 ``[..., rows, cols / 2]``, float32
        ``[..., rows, cols / group_size]`` and uint8 zeros of the scale's shape, or
        None when ``symmetric`` - the op's w / w_scale / w_zero.
    """
    _check_float_matrix("weight", weight)
    cols = weight.shape[-1]
    if group_size <= 0 or group_size % MXFP4_BLOCK or cols % group_size:
        raise ValueError(
            f"group_size: expected a multiple of {MXFP4_BLOCK} that divides the {cols} columns, got {group_size}"
        )
    groups = weight.float().unflatten(-1, (cols // group_size, group_size))
    if symmetric:
        scale = groups.abs().amax(dim=-1).clamp(min=_MIN_AMAX) / (INT4_DEFAULT_ZERO - 1)
        zero = torch.full_like(scale, INT4_DEFAULT_ZERO)
    else:
        low, high = groups.amin(dim=-1).clamp(max=0), groups.amax(dim=-1).clamp(min=0)
        scale = (high - low).clamp(min=_MIN_AMAX) / INT4_MAX
        zero = torch.round(-low / scale)
    q = (torch.round(groups / scale.unsqueeze(-1)) + zero.unsqueeze(-1)).clamp(0, INT4_MAX)
    packed = pack_nibbles(q.flatten(-2).to(torch.uint8))
    return packed, scale, None if symmetric else zero.to(torch.uint8)


def dequantize_int4(
    packed: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Expand INT4_W4A8 weights: ``(q - zero[g]) * scale[g]``.

    Args:
        packed: uint8 ``[..., rows, cols / 2]``.
        scale: float ``[..., rows, cols / G]``; G = cols / scale.shape[-1].
        zero: uint8 of the scale's shape, or None (zero point 8).
        dtype: of the result; float64 holds every value exactly.

    Returns:
        ``[..., rows, cols]`` in ``dtype``.
    """
    q = unpack_nibbles(packed)
    if scale.shape[:-1] != packed.shape[:-1]:
        raise ValueError(f"scale: expected shape [{', '.join(map(str, packed.shape[:-1]))}, groups], got {list(scale.shape)}")
    group = _group_size("scale", q.shape[-1], scale.shape[-1])
    if zero is None:
        zero = torch.full(scale.shape, INT4_DEFAULT_ZERO, dtype=torch.uint8)
    elif zero.shape != scale.shape:
        raise ValueError(f"zero: expected the scale's shape {list(scale.shape)}, got {list(zero.shape)}")
    centred = q.to(dtype).unflatten(-1, (-1, group)) - zero.to(dtype).unsqueeze(-1)
    return (centred * scale.to(dtype).unsqueeze(-1)).flatten(-2)


def _round_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Nibbles of the E2M1 values nearest ``x``, ties to the even code, saturating at 6."""
    magnitudes = torch.tensor(_E2M1_MAGNITUDES)
    midpoints = (magnitudes[1:] + magnitudes[:-1]) / 2
    a = x.abs()
    down = torch.bucketize(a, midpoints, right=False)  # a tie goes to the lower code
    up = torch.bucketize(a, midpoints, right=True)  # a tie goes to the upper code
    index = torch.where((down != up) & (down % 2 == 1), up, down)
    return index.to(torch.uint8) | (torch.signbit(x).to(torch.uint8) << 3)


def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize float weights to MXFP4, one E8M0 scale per 32 columns of a row.

    The OCP Microscaling rule: a block's shared exponent is
    ``floor(log2(max|block|)) - 2`` (2 being E2M1's largest exponent), clamped to
    the E8M0 range [-127, 127]; elements are ``block / 2^exponent`` rounded to the
    nearest E2M1 value, ties to even, saturating at +-6.

    Args:
        weight: ``[..., rows, cols]`` float weights, cols a multiple of 32.

    Returns:
        ``(packed, scale)``: uint8 ``[..., rows, cols / 2]`` and uint8 E8M0
        ``[..., rows, cols / 32]`` - the op's w / w_scale.
    """
    _check_float_matrix("weight", weight)
    cols = weight.shape[-1]
    if cols % MXFP4_BLOCK:
        raise ValueError(f"weight: expected a multiple of {MXFP4_BLOCK} columns, got {cols}")
    blocks = weight.float().unflatten(-1, (cols // MXFP4_BLOCK, MXFP4_BLOCK))
    amax = blocks.abs().amax(dim=-1).clamp(min=torch.finfo(torch.float32).tiny)
    exponent = (torch.floor(torch.log2(amax)) - _E2M1_EMAX).clamp(-E8M0_BIAS, E8M0_BIAS)
    nibbles = _round_to_e2m1(torch.ldexp(blocks, -exponent.unsqueeze(-1)))
    return pack_nibbles(nibbles.flatten(-2)), (exponent + E8M0_BIAS).to(torch.uint8)


def dequantize_mxfp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Expand MXFP4 weights to float32: ``e2m1(nibble) * 2^(scale - 127)``.

    Args:
        packed: uint8 ``[..., rows, cols / 2]``.
        scale: uint8 E8M0 ``[..., rows, cols / 32]``.

    Returns:
        ``[..., rows, cols]`` float32.
    """
    elements = E2M1_VALUES[unpack_nibbles(packed).long()]
    expected = (*packed.shape[:-1], elements.shape[-1] // MXFP4_BLOCK)
    if scale.dtype != torch.uint8 or tuple(scale.shape) != expected or elements.shape[-1] % MXFP4_BLOCK:
        raise ValueError(
            f"scale: expected uint8 E8M0 of shape {list(expected)} (one per {MXFP4_BLOCK} columns), "
            f"got {scale.dtype} {list(scale.shape)}"
        )
    exponent = scale.to(torch.int32) - E8M0_BIAS
    blocks = elements.unflatten(-1, (-1, MXFP4_BLOCK))
    return torch.ldexp(blocks, exponent.unsqueeze(-1).float()).flatten(-2)
