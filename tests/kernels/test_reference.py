"""The oracle itself: the vectorized reference against the spec written as a
per-token, per-slot loop (4-bit weights decoded nibble by nibble, INT4_W4A8's
dot done per group in integers), plus its own edge cases."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from moe_xarch import MoeCompMethod, reference
from moe_xarch.quant import dequantize_fp8_block, dequantize_int4, dequantize_mxfp4, quantize_int8_per_token
from moe_xarch.testing import ACTIVATIONS, assert_matches_reference, make_moe_problem

METHODS = pytest.mark.parametrize("method", list(reference.IMPLEMENTED_METHODS), ids=lambda m: m.name)
FOUR_BIT = (MoeCompMethod.INT4_W4A8, MoeCompMethod.MXFP4)
# (K, N): the 4-bit methods need multiples of 32; G = 32 gives w1 and w2 two groups each.
SHAPE = {method: (64, 64) if method in FOUR_BIT else (40, 24) for method in MoeCompMethod}


def _nibbles(w: torch.Tensor) -> torch.Tensor:
    """The 4-bit values of rows of bytes: column 2j the low nibble of byte j, 2j+1 its high."""
    values = torch.empty(*w.shape[:-1], 2 * w.shape[-1], dtype=torch.long)
    values[..., 0::2], values[..., 1::2] = w.long() % 16, w.long() // 16
    return values


def _naive_int4_linear(v: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None) -> torch.Tensor:
    """Per group g: scale_a * scale[g] * (sum q_w * q_a - zero[g] * sum q_a), in float32."""
    q, v_scale = quantize_int8_per_token(v[None])
    q, qw = q[0].long(), _nibbles(w)
    group = q.shape[0] // scale.shape[1]
    out = torch.zeros(w.shape[0])
    for g in range(scale.shape[1]):
        cols = slice(g * group, (g + 1) * group)
        dot = (qw[:, cols] * q[cols]).sum(dim=1)
        z = torch.full((w.shape[0],), 8) if zero is None else zero[:, g].long()
        out += v_scale * scale[:, g] * (dot - z * q[cols].sum()).float()
    return out


def _naive_mxfp4_weight(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """value = element * 2^(s - 127), one scale byte per 32 columns; an element is
    sign (bit 3) and magnitude index (bits 0-2) into {0, 0.5, 1, 1.5, 2, 3, 4, 6}."""
    n = _nibbles(w)
    magnitude = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6])[n % 8]
    element = torch.where(n >= 8, -magnitude, magnitude)
    return element * 2.0 ** (scale.double() - 127).repeat_interleave(32, dim=-1)


def _naive_linear(v: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, method: int) -> torch.Tensor:
    """One row ``v`` times ``w^T`` ([rows, K]), as the spec words it."""
    if method == MoeCompMethod.INT8_W8A8:
        q, v_scale = quantize_int8_per_token(v[None])
        dot = (q.long() * w.long()).sum(dim=1)  # the int32 dot, exactly
        return dot.float() * (v_scale * scale)
    return (v[None] * w).sum(dim=1)


Linear = Callable[[torch.Tensor, int], torch.Tensor]


def _naive_linears(a: dict[str, Any]) -> tuple[Linear, Linear]:
    """``(v, e) -> v @ W[e]^T`` for w1 and w2 of the problem's method."""
    method = a["moe_comp_method"]
    w1, w2, s1, s2 = a["w1"], a["w2"], a["w1_scale"], a["w2_scale"]
    if method == MoeCompMethod.INT4_W4A8:
        z1, z2 = a["w1_zero"], a["w2_zero"]
        return (
            lambda v, e: _naive_int4_linear(v, w1[e], s1[e], None if z1 is None else z1[e]),
            lambda v, e: _naive_int4_linear(v, w2[e], s2[e], None if z2 is None else z2[e]),
        )
    if method == MoeCompMethod.FP8_W8A16:
        w1 = dequantize_fp8_block(w1, s1, a["block_size"])
        w2 = dequantize_fp8_block(w2, s2, a["block_size"])
    elif method == MoeCompMethod.MXFP4:
        w1, w2 = _naive_mxfp4_weight(w1, s1).float(), _naive_mxfp4_weight(w2, s2).float()
    elif method == MoeCompMethod.UNQUANT:
        w1, w2 = w1.float(), w2.float()
    if method != MoeCompMethod.INT8_W8A8:
        s1 = s2 = None
    return (
        lambda v, e: _naive_linear(v, w1[e], None if s1 is None else s1[e], method),
        lambda v, e: _naive_linear(v, w2[e], None if s2 is None else s2[e], method),
    )


def _naive_fused_experts(a: dict[str, Any]) -> torch.Tensor:
    first, second = _naive_linears(a)
    x = a["hidden_states"].float()
    alpha, limit = a["alpha"], a["limit"]
    out = torch.zeros_like(x)
    for m in range(x.shape[0]):
        for t in range(a["topk_ids"].shape[1]):
            e = int(a["topk_ids"][m, t])
            if e < 0:
                continue
            h = first(x[m], e)
            if a["w1_bias"] is not None:
                h += a["w1_bias"][e].float()
            if alpha is None:
                n = h.shape[0] // 2
                gate, up = h[:n], h[n:]
                act = gate / (1 + torch.exp(-gate)) * up
            else:
                gate, up = h[0::2], h[1::2]
                if limit is not None:
                    gate, up = torch.minimum(gate, torch.tensor(limit)), up.clamp(-limit, limit)
                act = gate * torch.sigmoid(alpha * gate) * (up + 1)
            y = second(act, e)
            if a["w2_bias"] is not None:
                y += a["w2_bias"][e].float()
            out[m] += float(a["topk_weights"][m, t]) * y
    return out


@METHODS
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_reference_matches_naive_loop(method: MoeCompMethod, activation: str, bias: bool) -> None:
    problem = make_moe_problem(6, *SHAPE[method], 4, 3, torch.float32, method, bias, activation, seed=5)
    expected = _naive_fused_experts(problem.kwargs())
    actual = problem.run(reference.fused_experts)
    assert_matches_reference(actual, expected, method, torch.float32)


@pytest.mark.parametrize("group_size", [32, 64])
@pytest.mark.parametrize("zero_points", [True, False], ids=["zeros", "no-zeros"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_int4_reference_matches_naive_loop(group_size: int, zero_points: bool, dtype: torch.dtype) -> None:
    problem = make_moe_problem(5, 128, 64, 3, 2, dtype, MoeCompMethod.INT4_W4A8, bias=True, activation="swiglu_limit",
                               seed=6, group_size=group_size, zero_points=zero_points)
    assert (problem.arguments["w1_zero"] is None) == (not zero_points)
    expected = _naive_fused_experts(problem.kwargs()).to(dtype)
    assert_matches_reference(problem.run(reference.fused_experts), expected, MoeCompMethod.INT4_W4A8, dtype)


@pytest.mark.parametrize("method", FOUR_BIT, ids=lambda m: m.name)
def test_4bit_reference_is_the_float_math_of_the_dequantized_weights(method: MoeCompMethod) -> None:
    """The 4-bit methods compute with the weights their quantizer's dequantizer
    gives: MXFP4 equals UNQUANT on them, INT4_W4A8 equals INT8_W8A8-style math
    with those float weights (matching UNQUANT within the int8 tolerance)."""
    problem = make_moe_problem(7, 128, 64, 4, 2, torch.float32, method, bias=True, activation="swiglu", seed=7)
    a = problem.arguments
    if method == MoeCompMethod.MXFP4:
        dense = [dequantize_mxfp4(a[w], a[f"{w}_scale"]) for w in ("w1", "w2")]
    else:
        dense = [dequantize_int4(a[w], a[f"{w}_scale"], a[f"{w}_zero"]) for w in ("w1", "w2")]
    as_unquant = {"moe_comp_method": MoeCompMethod.UNQUANT, "w1": dense[0], "w2": dense[1],
                  "w1_scale": None, "w2_scale": None, "w1_zero": None, "w2_zero": None}
    expected = problem.run(reference.fused_experts, **as_unquant)
    assert_matches_reference(problem.run(reference.fused_experts), expected, method, torch.float32)


@METHODS
def test_output_is_cast_once_at_the_end(method: MoeCompMethod) -> None:
    """bf16 in, bf16 out equals the float32 computation on the same values, rounded."""
    K, N = SHAPE[method]
    problem = make_moe_problem(8, K, N, 4, 2, torch.bfloat16, method, bias=True, seed=6)
    as_float32 = {"hidden_states": problem.arguments["hidden_states"].float()}
    if method == MoeCompMethod.UNQUANT:
        as_float32.update(w1=problem.arguments["w1"].float(), w2=problem.arguments["w2"].float())
    in_float32 = problem.run(reference.fused_experts, **as_float32)
    in_bf16 = problem.run(reference.fused_experts)
    assert in_bf16.dtype == torch.bfloat16
    assert torch.equal(in_bf16, in_float32.to(torch.bfloat16))


@METHODS
def test_negative_ids_contribute_nothing(method: MoeCompMethod) -> None:
    K, N = SHAPE[method]
    problem = make_moe_problem(3, K, N, 4, 2, torch.float32, method, bias=True, seed=7)
    topk_ids = problem.arguments["topk_ids"].clone()
    topk_ids[0] = -1
    out = problem.run(reference.fused_experts, topk_ids=topk_ids)
    assert torch.equal(out[0], torch.zeros(K))
    assert out[1:].abs().sum() > 0


@METHODS
def test_inplace_overwrites_hidden_states(method: MoeCompMethod) -> None:
    problem = make_moe_problem(4, *SHAPE[method], 4, 2, torch.float16, method, seed=8)
    out_of_place = problem.run(reference.fused_experts)
    kwargs = problem.kwargs(inplace=True)
    result = reference.fused_experts(**kwargs)
    assert result is kwargs["hidden_states"]
    assert torch.equal(result, out_of_place)


@pytest.mark.parametrize(
    "method, overrides, names",
    [
        (MoeCompMethod.UNQUANT, {"is_vnni": True}, "is_vnni"),
        (MoeCompMethod.UNQUANT, {"moe_comp_method": 5}, "moe_comp_method"),
        (MoeCompMethod.UNQUANT, {"limit": 1.0}, "limit"),
        (MoeCompMethod.UNQUANT, {"w1_zero": torch.zeros(1)}, "w1_zero"),
        (MoeCompMethod.INT8_W8A8, {"w2_scale": None}, "w2_scale"),
        (MoeCompMethod.FP8_W8A16, {"block_size": None}, "block_size"),
        (MoeCompMethod.INT4_W4A8, {"w1_scale": None}, "w1_scale"),
        (MoeCompMethod.INT4_W4A8, {"block_size": [1, 64]}, "block_size"),
        (MoeCompMethod.MXFP4, {"w2_scale": None}, "w2_scale"),
        (MoeCompMethod.MXFP4, {"w2_zero": torch.zeros(1)}, "w2_zero"),
    ],
    ids=["packed", "method-5", "limit-without-alpha", "zeros", "int8-no-scale", "fp8-no-block_size",
         "int4-no-scale", "int4-block_size-not-the-group", "mxfp4-no-scale", "mxfp4-zeros"],
)
def test_reference_rejects(method: MoeCompMethod, overrides: dict[str, Any], names: str) -> None:
    problem = make_moe_problem(2, 64, 32, 2, 1, torch.float32, method)
    with pytest.raises(ValueError, match=names):
        problem.run(reference.fused_experts, **overrides)


def test_int4_block_size_of_the_group_is_accepted() -> None:
    problem = make_moe_problem(2, 64, 32, 2, 1, torch.float32, MoeCompMethod.INT4_W4A8)
    expected = problem.run(reference.fused_experts)
    assert torch.equal(problem.run(reference.fused_experts, block_size=[1, 32]), expected)


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_int4_reference_is_the_integer_formula_to_float32_rounding(activation: str) -> None:
    """Tighter than the kernels' tolerance: the oracle's float64 form of the group
    formula leaves only float32 rounding (activations quantized, not as given)."""
    problem = make_moe_problem(9, 128, 64, 4, 2, torch.float32, MoeCompMethod.INT4_W4A8, bias=True,
                               activation=activation, seed=9)
    expected = _naive_fused_experts(problem.kwargs())
    actual = problem.run(reference.fused_experts)
    assert (actual - expected).abs().max() <= 1e-5 * expected.abs().max()
