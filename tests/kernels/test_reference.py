"""The oracle itself: the vectorized reference against the spec written as a
per-token, per-slot loop, plus its own edge cases."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from moe_xarch import MoeCompMethod, reference
from moe_xarch.quant import dequantize_fp8_block, quantize_int8_per_token
from moe_xarch.testing import ACTIVATIONS, assert_matches_reference, make_moe_problem

pytestmark = pytest.mark.level_independent  # the pure-PyTorch oracle
METHODS = pytest.mark.parametrize("method", list(reference.IMPLEMENTED_METHODS), ids=lambda m: m.name)


def _naive_linear(v: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, method: int) -> torch.Tensor:
    """One row ``v`` times ``w^T`` ([rows, K]), as the spec words it."""
    if method == MoeCompMethod.INT8_W8A8:
        q, v_scale = quantize_int8_per_token(v[None])
        dot = (q.long() * w.long()).sum(dim=1)  # the int32 dot, exactly
        return dot.float() * (v_scale * scale)
    return (v[None] * w).sum(dim=1)


def _naive_fused_experts(a: dict[str, Any]) -> torch.Tensor:
    method = a["moe_comp_method"]
    w1, w2, s1, s2 = a["w1"], a["w2"], a["w1_scale"], a["w2_scale"]
    if method == MoeCompMethod.FP8_W8A16:
        w1 = dequantize_fp8_block(w1, s1, a["block_size"])
        w2 = dequantize_fp8_block(w2, s2, a["block_size"])
    elif method == MoeCompMethod.UNQUANT:
        w1, w2 = w1.float(), w2.float()
    x = a["hidden_states"].float()
    alpha, limit = a["alpha"], a["limit"]
    out = torch.zeros_like(x)
    for m in range(x.shape[0]):
        for t in range(a["topk_ids"].shape[1]):
            e = int(a["topk_ids"][m, t])
            if e < 0:
                continue
            h = _naive_linear(x[m], w1[e], None if s1 is None else s1[e], method)
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
            y = _naive_linear(act, w2[e], None if s2 is None else s2[e], method)
            if a["w2_bias"] is not None:
                y += a["w2_bias"][e].float()
            out[m] += float(a["topk_weights"][m, t]) * y
    return out


@METHODS
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_reference_matches_naive_loop(method: MoeCompMethod, activation: str, bias: bool) -> None:
    problem = make_moe_problem(6, 40, 24, 4, 3, torch.float32, method, bias, activation, seed=5)
    expected = _naive_fused_experts(problem.kwargs())
    actual = problem.run(reference.fused_experts)
    assert_matches_reference(actual, expected, method, torch.float32)


@METHODS
def test_output_is_cast_once_at_the_end(method: MoeCompMethod) -> None:
    """bf16 in, bf16 out equals the float32 computation on the same values, rounded."""
    problem = make_moe_problem(8, 32, 16, 4, 2, torch.bfloat16, method, bias=True, seed=6)
    as_float32 = {"hidden_states": problem.arguments["hidden_states"].float()}
    if method == MoeCompMethod.UNQUANT:
        as_float32.update(w1=problem.arguments["w1"].float(), w2=problem.arguments["w2"].float())
    in_float32 = problem.run(reference.fused_experts, **as_float32)
    in_bf16 = problem.run(reference.fused_experts)
    assert in_bf16.dtype == torch.bfloat16
    assert torch.equal(in_bf16, in_float32.to(torch.bfloat16))


@METHODS
def test_negative_ids_contribute_nothing(method: MoeCompMethod) -> None:
    problem = make_moe_problem(3, 32, 16, 4, 2, torch.float32, method, bias=True, seed=7)
    topk_ids = problem.arguments["topk_ids"].clone()
    topk_ids[0] = -1
    out = problem.run(reference.fused_experts, topk_ids=topk_ids)
    assert torch.equal(out[0], torch.zeros(32))
    assert out[1:].abs().sum() > 0


def test_inplace_overwrites_hidden_states() -> None:
    problem = make_moe_problem(4, 32, 16, 4, 2, torch.float16, seed=8)
    out_of_place = problem.run(reference.fused_experts)
    kwargs = problem.kwargs(inplace=True)
    result = reference.fused_experts(**kwargs)
    assert result is kwargs["hidden_states"]
    assert torch.equal(result, out_of_place)


@pytest.mark.parametrize(
    "method, overrides, names",
    [
        (MoeCompMethod.UNQUANT, {"is_vnni": True}, "is_vnni"),
        (MoeCompMethod.UNQUANT, {"moe_comp_method": MoeCompMethod.INT4_W4A8}, "moe_comp_method"),
        (MoeCompMethod.UNQUANT, {"limit": 1.0}, "limit"),
        (MoeCompMethod.UNQUANT, {"w1_zero": torch.zeros(1)}, "w1_zero"),
        (MoeCompMethod.INT8_W8A8, {"w2_scale": None}, "w2_scale"),
        (MoeCompMethod.FP8_W8A16, {"block_size": None}, "block_size"),
    ],
    ids=["packed", "int4", "limit-without-alpha", "zeros", "int8-no-scale", "fp8-no-block_size"],
)
def test_reference_rejects(method: MoeCompMethod, overrides: dict[str, Any], names: str) -> None:
    problem = make_moe_problem(2, 32, 16, 2, 1, torch.float32, method)
    with pytest.raises(ValueError, match=names):
        problem.run(reference.fused_experts, **overrides)
