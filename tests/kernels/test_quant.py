"""The quantization helpers follow the spec's rules exactly."""

from __future__ import annotations

import math

import pytest
import torch

from moe_xarch.quant import (
    FP8_MAX,
    dequantize_fp8_block,
    quantize_fp8_block,
    quantize_int8_per_channel,
    quantize_int8_per_token,
)

pytestmark = pytest.mark.level_independent  # the Python quantizers


def test_int8_rounds_half_to_even() -> None:
    # max|x| = 127 makes the scale exactly 1, so x / scale is x itself.
    x = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.4999]])
    q, scale = quantize_int8_per_token(x)
    assert scale.tolist() == [1.0]
    assert q.tolist() == [[127, 0, 2, 2, 0, -2, -2, 3]]


def test_int8_row_max_maps_to_127_and_scale_is_per_row() -> None:
    x = torch.randn(5, 40, generator=torch.Generator().manual_seed(0)) * torch.arange(1, 6)[:, None]
    q, scale = quantize_int8_per_token(x.bfloat16())
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (5,)
    assert torch.equal(scale, x.bfloat16().float().abs().amax(dim=1) / 127)
    assert torch.equal(q.abs().amax(dim=1), torch.full((5,), 127, dtype=torch.int8))
    assert (q.float() * scale[:, None] - x).abs().max() <= scale.max() * 0.51 + 0.02


def test_int8_zero_row_has_positive_scale() -> None:
    q, scale = quantize_int8_per_token(torch.zeros(2, 8))
    assert torch.equal(q, torch.zeros(2, 8, dtype=torch.int8))
    assert torch.equal(scale, torch.full((2,), 1e-10) / 127)  # in float32, as the kernel


def test_int8_per_channel_is_per_token_on_every_row() -> None:
    w = torch.randn(3, 10, 16, generator=torch.Generator().manual_seed(1))
    q, scale = quantize_int8_per_channel(w)
    q_rows, scale_rows = quantize_int8_per_token(w.reshape(30, 16))
    assert scale.shape == (3, 10)
    assert torch.equal(q.reshape(30, 16), q_rows) and torch.equal(scale.flatten(), scale_rows)


@pytest.mark.parametrize(
    "rows, cols, block_size",
    [(64, 64, (16, 32)), (80, 72, (16, 32)), (40, 72, (32, 16)), (24, 16, (128, 128)), (9, 7, (8, 3))],
    ids=str,
)
def test_fp8_block_shapes_and_round_trip(rows: int, cols: int, block_size: tuple[int, int]) -> None:
    w = torch.randn(2, rows, cols, generator=torch.Generator().manual_seed(2))
    q, scale = quantize_fp8_block(w, block_size)
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape
    assert scale.dtype == torch.float32
    assert scale.shape == (2, math.ceil(rows / block_size[0]), math.ceil(cols / block_size[1]))
    # e4m3 keeps 3 mantissa bits: half an ulp is 2^-4 relative, above the subnormals.
    dequantized = dequantize_fp8_block(q, scale, block_size)
    per_element_scale = dequantized.abs() / q.float().abs().clamp(min=2**-9)
    assert torch.all((dequantized - w).abs() <= w.abs() * 2**-4 + per_element_scale * 2**-10 + 1e-6)


def test_fp8_block_max_maps_to_fp8_max() -> None:
    w = torch.randn(1, 32, 64, generator=torch.Generator().manual_seed(3))
    q, scale = quantize_fp8_block(w, (16, 32))
    block_max = q.float().abs().reshape(1, 2, 16, 2, 32).amax(dim=(2, 4))
    assert torch.equal(block_max, torch.full_like(block_max, FP8_MAX))
    assert torch.allclose(scale, w.abs().reshape(1, 2, 16, 2, 32).amax(dim=(2, 4)) / FP8_MAX)


def test_fp8_zero_block_dequantizes_to_zero() -> None:
    w = torch.zeros(1, 16, 32)
    w[0, 0, 0] = 1.0  # one non-zero block of the two
    q, scale = quantize_fp8_block(w, (16, 16))
    assert torch.equal(dequantize_fp8_block(q, scale, (16, 16)), w)


@pytest.mark.parametrize(
    "call, names",
    [
        (lambda: quantize_int8_per_token(torch.zeros(2, 3, 4)), "x"),
        (lambda: quantize_int8_per_channel(torch.zeros(2, 3, dtype=torch.int8)), "w"),
        (lambda: quantize_fp8_block(torch.zeros(1, 4, 4), (4,)), "block_size"),
        (lambda: dequantize_fp8_block(*quantize_fp8_block(torch.zeros(1, 4, 4), (2, 2)), (4, 4)), "scale"),
    ],
    ids=["token-rank3", "channel-int8", "block_size-one-value", "scale-grid"],
)
def test_quant_rejects_bad_arguments(call, names: str) -> None:
    with pytest.raises(ValueError, match=rf"^{names}:"):
        call()
