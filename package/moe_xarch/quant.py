"""Quantization helpers for the fused MoE op, exactly as the op contract defines them.

INT8 (``moe_comp_method=1``) is symmetric: per row,
``scale = max(max|x|, 1e-10) / 127`` and ``q = round_half_to_even(x / scale)``
clamped to [-127, 127]. The kernel quantizes activations per token this way at
run time; weights are quantized per output channel by the same rule.

FP8 (``moe_comp_method=2``) weights are float8_e4m3fn with one float32 scale per
``[bn, bk]`` block of the ``[rows, K]`` matrix; blocks at the right and bottom
edges may be partial.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = [
    "FP8_MAX",
    "INT8_MAX",
    "dequantize_fp8_block",
    "quantize_fp8_block",
    "quantize_int8_per_channel",
    "quantize_int8_per_token",
]

INT8_MAX = 127
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448.0
# Keeps the scale of an all-zero row positive, so dividing by it is safe.
_MIN_AMAX = 1e-10


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
