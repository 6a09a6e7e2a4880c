"""The quantization helpers follow the spec's rules exactly."""

from __future__ import annotations

import math

import pytest
import torch

from moe_xarch.quant import (
    FP8_MAX,
    dequantize_fp8_block,
    dequantize_int4,
    dequantize_mxfp4,
    pack_nibbles,
    quantize_fp8_block,
    quantize_int4,
    quantize_int8_per_channel,
    quantize_int8_per_token,
    quantize_mxfp4,
    unpack_nibbles,
)

# The spec's E2M1 magnitudes by index; the sign is bit 3.
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


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


def test_nibbles_hold_even_columns_low_and_odd_columns_high() -> None:
    q = torch.tensor([[1, 2, 3, 4], [15, 0, 0, 15]])
    packed = pack_nibbles(q)
    assert packed.dtype == torch.uint8
    assert packed.tolist() == [[0x21, 0x43], [0x0F, 0xF0]]
    assert torch.equal(unpack_nibbles(packed), q.to(torch.uint8))


def _int4_grid(gen: torch.Generator, shape: tuple[int, ...], group: int) -> tuple[torch.Tensor, ...]:
    """Random (q, zero, scale) whose every group holds q = 0 and q = 15."""
    *lead, cols = shape
    q = torch.randint(0, 16, shape, generator=gen)
    q[..., 0::group], q[..., 1::group] = 0, 15
    zero = torch.randint(0, 16, (*lead, cols // group), generator=gen)
    scale = torch.rand(*lead, cols // group, generator=gen) + 0.01
    return q, zero, scale


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_recovers_weights_on_its_grid(group_size: int) -> None:
    """Weights (q - zero) * scale whose groups span [0, 15] quantize back to q,
    zero and scale themselves: the layout is the op's, the rounding exact."""
    q, zero, scale = _int4_grid(torch.Generator().manual_seed(4), (2, 6, 256), group_size)
    weight = (q - zero.repeat_interleave(group_size, -1)) * scale.repeat_interleave(group_size, -1)
    packed, got_scale, got_zero = quantize_int4(weight, group_size)
    assert packed.dtype == torch.uint8 and packed.shape == (2, 6, 128)
    assert got_scale.dtype == torch.float32 and got_scale.shape == (2, 6, 256 // group_size)
    assert got_zero.dtype == torch.uint8 and torch.equal(got_zero, zero.to(torch.uint8))
    torch.testing.assert_close(got_scale, scale, rtol=1e-6, atol=0)
    assert torch.equal(unpack_nibbles(packed), q.to(torch.uint8))
    torch.testing.assert_close(dequantize_int4(packed, got_scale, got_zero), weight, rtol=1e-5, atol=1e-6)


def test_int4_dequantizes_by_the_spec_formula() -> None:
    gen = torch.Generator().manual_seed(5)
    q, zero, scale = _int4_grid(gen, (3, 64), 32)
    expected = torch.empty(3, 64)
    for r in range(3):
        for c in range(64):
            expected[r, c] = (q[r, c] - zero[r, c // 32]) * scale[r, c // 32]
    got = dequantize_int4(pack_nibbles(q), scale, zero.to(torch.uint8))
    assert torch.equal(got, expected)
    default = dequantize_int4(pack_nibbles(q), scale)
    assert torch.equal(default, (q - 8) * scale.repeat_interleave(32, -1))


def test_int4_error_is_within_a_step() -> None:
    w = torch.randn(4, 8, 128, generator=torch.Generator().manual_seed(6))
    packed, scale, zero = quantize_int4(w, 32)
    error = dequantize_int4(packed, scale, zero) - w
    assert torch.all(error.abs() <= scale.repeat_interleave(32, -1) * (1 + 1e-5))
    assert error.abs().mean() <= scale.mean() * 0.3  # rounding, not clamping, on most values


def test_int4_symmetric_has_zero_point_8() -> None:
    w = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(7))
    packed, scale, zero = quantize_int4(w, 32, symmetric=True)
    assert zero is None
    torch.testing.assert_close(scale, w.abs().unflatten(-1, (2, 32)).amax(-1) / 7)
    error = dequantize_int4(packed, scale) - w
    assert torch.all(error.abs() <= scale.repeat_interleave(32, -1) * 0.5 * (1 + 1e-5))


def _e2m1(nibble: int) -> float:
    return (-1.0 if nibble & 8 else 1.0) * E2M1[nibble & 7]


def test_mxfp4_dequantizes_by_the_spec_formula() -> None:
    gen = torch.Generator().manual_seed(8)
    packed = torch.randint(0, 256, (2, 3, 32), generator=gen, dtype=torch.uint8)
    scale = torch.randint(100, 150, (2, 3, 2), generator=gen, dtype=torch.uint8)
    got = dequantize_mxfp4(packed, scale)
    assert got.shape == (2, 3, 64) and got.dtype == torch.float32
    for e, r, c in [(0, 0, 0), (0, 0, 1), (1, 2, 33), (1, 1, 62), (0, 2, 63)]:
        nibble = (int(packed[e, r, c // 2]) >> (4 * (c % 2))) & 0xF
        assert got[e, r, c].item() == _e2m1(nibble) * 2.0 ** (int(scale[e, r, c // 32]) - 127)


def test_mxfp4_rounds_to_nearest_e2m1_ties_to_even_and_saturates() -> None:
    # max|block| = 7 makes the shared exponent floor(log2 7) - 2 = 0: elements are the values.
    values = [7.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5, -5.5, 0.3, 2.9, 6.0, -6.5]
    row = torch.tensor(values + [0.0] * (32 - len(values)))
    packed, scale = quantize_mxfp4(row[None])
    assert scale.tolist() == [[127]]
    expected = [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -0.0, -2.0, -6.0, 0.5, 3.0, 6.0, -6.0]
    assert dequantize_mxfp4(packed, scale)[0, : len(values)].tolist() == expected


def test_mxfp4_layout_and_scale_byte() -> None:
    row = torch.zeros(1, 64)
    row[0, :2] = torch.tensor([0.5, -1.0]) * 8  # block 0: max 8 -> exponent 1
    row[0, 32] = 6.0 * 2.0**-10  # block 1: exponent -10
    packed, scale = quantize_mxfp4(row)
    assert packed.shape == (1, 32) and scale.shape == (1, 2)
    assert scale.tolist() == [[128, 117]]
    # 0.5 * 8 / 2 = 2 (index 4) low, -1 * 8 / 2 = -4 (sign + index 6) high
    assert packed[0, 0].item() == 0x4 | (0x8 | 0x6) << 4
    assert packed[0, 16].item() == 0x7


def test_mxfp4_values_it_can_hold_survive_a_round_trip() -> None:
    gen = torch.Generator().manual_seed(9)
    packed = torch.randint(0, 256, (3, 8, 64), generator=gen, dtype=torch.uint8)
    scale = torch.randint(1, 250, (3, 8, 4), generator=gen, dtype=torch.uint8)
    weight = dequantize_mxfp4(packed, scale)
    assert torch.equal(dequantize_mxfp4(*quantize_mxfp4(weight)), weight)


def test_mxfp4_error_is_within_the_saturation_bound() -> None:
    """Elements below 4 units round to within half a step (at most 0.5 unit); the
    block's largest ones, in [4, 8) units, to 4 or 6: at most 2 units off."""
    w = torch.randn(4, 8, 128, generator=torch.Generator().manual_seed(10))
    packed, scale = quantize_mxfp4(w)
    unit = (2.0 ** (scale.float() - 127)).repeat_interleave(32, -1)
    error = (dequantize_mxfp4(packed, scale) - w).abs()
    assert torch.all(error <= 2 * unit)
    small = w.abs() < 4 * unit
    assert torch.all(error[small] <= 0.5 * unit[small])


@pytest.mark.parametrize(
    "call, names",
    [
        (lambda: quantize_int8_per_token(torch.zeros(2, 3, 4)), "x"),
        (lambda: quantize_int8_per_channel(torch.zeros(2, 3, dtype=torch.int8)), "w"),
        (lambda: quantize_fp8_block(torch.zeros(1, 4, 4), (4,)), "block_size"),
        (lambda: dequantize_fp8_block(*quantize_fp8_block(torch.zeros(1, 4, 4), (2, 2)), (4, 4)), "scale"),
        (lambda: quantize_int4(torch.zeros(1, 4, 64), 48), "group_size"),
        (lambda: quantize_int4(torch.zeros(1, 4, 64), 128), "group_size"),
        (lambda: quantize_int4(torch.zeros(1, 4, 64, dtype=torch.int32), 32), "weight"),
        (lambda: dequantize_int4(torch.zeros(1, 4, 32, dtype=torch.uint8), torch.ones(1, 4, 3)), "scale"),
        (lambda: dequantize_int4(torch.zeros(1, 4, 32, dtype=torch.uint8), torch.ones(1, 4, 2),
                                 torch.zeros(1, 4, 1, dtype=torch.uint8)), "zero"),
        (lambda: quantize_mxfp4(torch.zeros(1, 4, 48)), "weight"),
        (lambda: dequantize_mxfp4(torch.zeros(1, 4, 32, dtype=torch.uint8), torch.ones(1, 4, 2)), "scale"),
        (lambda: pack_nibbles(torch.zeros(2, 3, dtype=torch.int32)), "q"),
        (lambda: unpack_nibbles(torch.zeros(2, 3, dtype=torch.int8)), "packed"),
    ],
    ids=["token-rank3", "channel-int8", "block_size-one-value", "scale-grid", "int4-group-48",
         "int4-group-over-cols", "int4-int-weight", "int4-scale-groups", "int4-zero-shape",
         "mxfp4-cols-48", "mxfp4-scale-float", "nibbles-odd", "nibbles-int8"],
)
def test_quant_rejects_bad_arguments(call, names: str) -> None:
    with pytest.raises(ValueError, match=rf"^{names}:"):
        call()
