"""The integer paths at their worst-case magnitudes, against the reference.

Random inputs keep every integer accumulator far below its bound: products of
random signs cancel. Here every product of a dot product has the same sign and
the largest magnitude the method allows, so each accumulator of every level
(int16 pair sums, int32 lanes, their sums, the zero points' and the u8 bias's
compensation terms) reaches the largest value it can for the length it runs
over; a level that lets one run longer than its type holds gives wrong numbers.

- Activations quantize to +-127 in every position: each token is +-1 throughout
  (the signs alternate from token to token), and the intermediate after the
  activation has one magnitude a token, its signs matching those of w2's rows.
- INT8_W8A8 weights are +-127; INT4_W4A8 nibbles are 0 and 15 against zero
  points 0, 8 and 15 (and none: 8), every (nibble, zero point) pair in each
  matrix. The scales make every row of either GEMM one value of +-1 so that the
  output, a sum of two experts' +-1 times the activation, stays O(1) and exact
  enough for bf16.
- K = 1280: longer than 1024, and than the longest span any level sums before
  widening (avx2's W4A8: 4 steps of 64 values in int16). INT4_W4A8 groups of 32
  (each 128-bit lane its own group), 256 (exactly avx2's span), 320 (a span and
  a step: the shortest group a span of 5 steps or more would overflow) and 640.
- 1 token (the decode paths), 3 (avx2's INT4_W4A8 register tiles of 2 rows and
  of 1) and 7 (AMX's tiles from 4 rows, 6 for INT4_W4A8; i8mm's row pairs with
  an odd one; the x86 INT4_W4A8 panels' blocks of 8 and 16 lanes); weights
  unpacked and packed.
- INT8_W8A8 at K = 66,560 too (LONG_K): VNNI's biased u8 x s8 sum passes int32
  there, and must come back exact.

The largest intermediate of each accumulator, and why it cannot overflow, is
tabled per level in the README ("Integer accumulators at their bounds").
"""

from __future__ import annotations

import functools

import pytest
import torch

import moe_xarch
from moe_xarch import MoeCompMethod, reference
from moe_xarch.quant import (
    INT4_DEFAULT_ZERO,
    INT4_MAX,
    INT8_MAX,
    dequantize_int4,
    pack_nibbles,
    quantize_int8_per_token,
    unpack_nibbles,
)
from moe_xarch.testing import assert_matches_reference

K, N, E = 1280, 32, 2
# Each token's two slots: both experts, one weighted more, so their +-1 columns never cancel.
SLOT_WEIGHTS = (0.7, 0.3)
ZERO_POINTS = (0, INT4_DEFAULT_ZERO, INT4_MAX)
# INT4_W4A8's w1 groups: (group size, zero points given).
GROUPS = {"g32": (32, True), "g256": (256, True), "g320": (320, True), "g640-nozero": (640, False)}
TOKENS = (1, 3, 7)


def _signs(count: int, generator: torch.Generator) -> torch.Tensor:
    """+-1, half of each, in a random order: every sign pattern has both."""
    return torch.cat([torch.ones(count // 2), -torch.ones(count - count // 2)])[torch.randperm(count, generator=generator)]


def _int8_rows(along: torch.Tensor, row_signs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 rows of +-127 whose products with +-1 ``along`` all have the row's sign,
    with the scale that makes each row's dot with ``127 * along`` (scaled 1/127)
    equal to its sign."""
    weight = (INT8_MAX * row_signs[:, None] * along[None, :]).to(torch.int8)
    scale = torch.full(row_signs.shape, 1.0 / (INT8_MAX * along.numel()))
    return weight, scale


def _int4_rows(along: torch.Tensor, row_signs: torch.Tensor, group: int,
               zero: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Nibbles 15 where the row's sign times ``along`` is positive and 0 elsewhere,
    so (nibble - zero) times ``along`` has the row's sign or is 0 throughout, with
    group scales that make each row's dot with ``127 * along`` (scaled 1/127)
    equal to its sign: every group that contributes, the same share."""
    rows, cols = row_signs.numel(), along.numel()
    nibbles = torch.where(row_signs[:, None] * along[None, :] > 0, INT4_MAX, 0)
    zeros = torch.full((rows, cols // group), INT4_DEFAULT_ZERO) if zero is None else zero.long()
    centred = (nibbles - zeros.repeat_interleave(group, dim=1)) * along[None, :]
    per_group = centred.unflatten(1, (-1, group)).sum(dim=2).double()
    contributing = per_group != 0
    shares = contributing.sum(dim=1, keepdim=True)
    assert shares.min() > 0, "a row whose every group sums to zero"
    scale = torch.where(contributing, 1.0 / (shares * per_group.abs()), 1.0 / (INT4_MAX * cols)).float()
    return pack_nibbles(nibbles), scale


def _zero_points(rows: int, groups: int, offset: int) -> torch.Tensor:
    """0, 8 and 15 in turn along each row and down the groups: each row meets two or
    three of them (so one that contributes), each matrix every one with both nibbles."""
    index = torch.arange(rows)[:, None] + torch.arange(groups)[None, :] + offset
    return torch.tensor(ZERO_POINTS, dtype=torch.uint8)[index % len(ZERO_POINTS)]


def worst_case_problem(method: MoeCompMethod, tokens: int, group: int = 32, zero_points: bool = True,
                       k: int = K) -> dict:
    """The op's keyword arguments (unpacked weights, bf16 activations)."""
    generator = torch.Generator().manual_seed(36 + tokens)
    token_signs = torch.tensor([(-1.0) ** m for m in range(tokens)])
    w1, w2, w1_scale, w2_scale, w1_zero, w2_zero = [], [], [], [], [], []
    for expert in range(E):
        up = _signs(N, generator)  # the intermediate's signs, where w2's rows meet it
        out = _signs(k, generator)  # each output column's sign
        gate_and_up = torch.cat([torch.ones(N), up])  # gate rows positive: one silu value a token
        if method == MoeCompMethod.INT8_W8A8:
            first, second = _int8_rows(torch.ones(k), gate_and_up), _int8_rows(up, out)
        else:
            zero1 = _zero_points(2 * N, k // group, expert) if zero_points else None
            zero2 = _zero_points(k, 1, expert) if zero_points else None  # w2's group: all of N
            first, second = _int4_rows(torch.ones(k), gate_and_up, group, zero1), _int4_rows(up, out, N, zero2)
            w1_zero.append(zero1)
            w2_zero.append(zero2)
        for matrix, scales, (weight, scale) in ((w1, w1_scale, first), (w2, w2_scale, second)):
            matrix.append(weight)
            scales.append(scale)
    kwargs = {
        "hidden_states": token_signs[:, None].expand(tokens, k).to(torch.bfloat16).contiguous(),
        "w1": torch.stack(w1), "w2": torch.stack(w2),
        "topk_weights": torch.tensor(SLOT_WEIGHTS).repeat(tokens, 1),
        "topk_ids": torch.tensor([[m % E, (m + 1) % E] for m in range(tokens)], dtype=torch.int32),
        "moe_comp_method": int(method),
        "w1_scale": torch.stack(w1_scale), "w2_scale": torch.stack(w2_scale),
    }
    if method == MoeCompMethod.INT4_W4A8 and zero_points:
        kwargs.update(w1_zero=torch.stack(w1_zero), w2_zero=torch.stack(w2_zero))
    return kwargs


def _op(kwargs: dict, packed: bool) -> torch.Tensor:
    """The op on the problem, its weights packed (convert_weight_packed) or not."""
    if packed:
        method = kwargs["moe_comp_method"]
        kwargs = dict(kwargs, is_vnni=True,
                      **{name: moe_xarch.convert_weight_packed(kwargs[name], method) for name in ("w1", "w2")})
    return moe_xarch.fused_experts(**kwargs)


@functools.cache
def _with_expected(method: MoeCompMethod, tokens: int, group: int = 32, zero_points: bool = True,
                   k: int = K) -> tuple[dict, torch.Tensor]:
    """worst_case_problem and the reference's output, once for both layouts (QEMU's time)."""
    kwargs = worst_case_problem(method, tokens, group, zero_points, k)
    return kwargs, reference.fused_experts(**kwargs)


def _canary(tokens: int, packed: bool, *rest: object) -> list:
    """Many rows, unpacked, and for INT4_W4A8 the groups just past avx2's span, join the canary stage."""
    return [pytest.mark.canary] if tokens == TOKENS[-1] and not packed and rest in ((), ("g320",)) else []


BOTH_LAYOUTS = (False, True)


@pytest.mark.parametrize("tokens, packed", [
    pytest.param(t, p, id=f"M{t}-{'packed' if p else 'unpacked'}", marks=_canary(t, p))
    for t in TOKENS for p in BOTH_LAYOUTS])
def test_int8_at_its_bounds(tokens: int, packed: bool) -> None:
    method = MoeCompMethod.INT8_W8A8
    kwargs, expected = _with_expected(method, tokens)
    assert_matches_reference(_op(kwargs, packed), expected, method, torch.bfloat16)


# The u8 x s8 paths (VNNI's vpdpbusd: avx512 and, from tile-layout weights, avx512_bf16
# and amx) sum (a + 128) * b, up to 255 * 127 a product, and take 128 * sum(b) away at
# the end: past K = 2^31 / (255 * 127) = 66,311 that sum wraps around int32 while the dot
# (127 * 127 a product) does not, and the wrap must cancel. One token: every x86 level
# with VNNI takes such a path for it, from either layout.
LONG_K = 66_560  # the first multiple of 128 past 66,311


@pytest.mark.parametrize("packed", BOTH_LAYOUTS, ids=["unpacked", "packed"])
def test_int8_past_the_biased_sums_int32_range(packed: bool) -> None:
    method = MoeCompMethod.INT8_W8A8
    kwargs, expected = _with_expected(method, 1, k=LONG_K)
    assert_matches_reference(_op(kwargs, packed), expected, method, torch.bfloat16)


@pytest.mark.parametrize("tokens, packed, groups", [
    pytest.param(t, p, g, id=f"M{t}-{'packed' if p else 'unpacked'}-{g}", marks=_canary(t, p, g))
    for t in TOKENS for p in BOTH_LAYOUTS for g in GROUPS])
def test_int4_at_its_bounds(tokens: int, packed: bool, groups: str) -> None:
    method = MoeCompMethod.INT4_W4A8
    kwargs, expected = _with_expected(method, tokens, *GROUPS[groups])
    assert_matches_reference(_op(kwargs, packed), expected, method, torch.bfloat16)


def _dequantized(kwargs: dict, name: str, expert: int) -> torch.Tensor:
    weight, scale = kwargs[name][expert], kwargs[f"{name}_scale"][expert]
    if kwargs["moe_comp_method"] == MoeCompMethod.INT8_W8A8:
        return weight.double() * scale.double()[:, None]
    return dequantize_int4(weight, scale, kwargs.get(f"{name}_zero", [None] * E)[expert], torch.float64)


def _same_signed_dots(a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """a @ weight^T, asserting that each dot's nonzero products share one sign."""
    products = a[:, None, :] * weight[None, :, :]
    dots = products.sum(dim=2)
    assert (products * dots[:, :, None] >= 0).all(), "products of both signs in one dot"
    return dots


@pytest.mark.level_independent  # the problems themselves, through the reference's quantizer
@pytest.mark.parametrize("method, groups", [(MoeCompMethod.INT8_W8A8, None), *(
    (MoeCompMethod.INT4_W4A8, g) for g in GROUPS)], ids=lambda v: getattr(v, "name", v))
def test_the_problems_drive_every_accumulator_to_its_bound(method: MoeCompMethod, groups: str | None) -> None:
    """What the family claims of its inputs, checked on them: both GEMMs' activations
    quantize to +-127 everywhere, every dot's products share a sign, the weights
    are at the ends of their range (INT4_W4A8: each nibble with each zero point),
    and the output is 0.4 or 1 times a token's activation value."""
    group, zero_points = GROUPS.get(groups, (32, True))
    kwargs = worst_case_problem(method, TOKENS[-1], group, zero_points)
    q, a_scale = quantize_int8_per_token(kwargs["hidden_states"])
    assert q.abs().eq(INT8_MAX).all()
    x = q.double() * a_scale.double()[:, None]
    for expert in range(E):
        h = _same_signed_dots(x, _dequantized(kwargs, "w1", expert))
        assert torch.allclose(h.abs(), torch.ones_like(h))
        activated = torch.nn.functional.silu(h[:, :N]) * h[:, N:]
        q2, scale2 = quantize_int8_per_token(activated.float())
        assert q2.abs().eq(INT8_MAX).all()
        y = _same_signed_dots(q2.double() * scale2.double()[:, None], _dequantized(kwargs, "w2", expert))
        assert torch.allclose(y.abs(), activated.abs()[:, :1].expand_as(y))
        for name in ("w1", "w2"):
            weight = kwargs[name][expert]
            if method == MoeCompMethod.INT8_W8A8:
                assert weight.abs().eq(INT8_MAX).all()
                continue
            nibbles = unpack_nibbles(weight).long()
            zeros = kwargs.get(f"{name}_zero")
            zeros = zeros[expert].long() if zeros is not None else torch.full_like(nibbles, INT4_DEFAULT_ZERO)
            pairs = set(zip(nibbles.flatten().tolist(), zeros.repeat_interleave(
                nibbles.shape[1] // zeros.shape[1], dim=1).flatten().tolist()))
            zero_set = ZERO_POINTS if zero_points else (INT4_DEFAULT_ZERO,)
            assert pairs == {(n, z) for n in (0, INT4_MAX) for z in zero_set}, name
    value = torch.nn.functional.silu(torch.tensor([1.0, -1.0])) * torch.tensor([1.0, -1.0])
    out = reference.fused_experts(**kwargs).float()
    for m, row in enumerate(out):
        assert set((row.abs() / value[m % 2]).mul(10).round().tolist()) == {4.0, 10.0}
