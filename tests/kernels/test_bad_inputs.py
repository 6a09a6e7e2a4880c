"""Every bad input of the spec is an error that names the argument, through the
Python wrapper and through the raw op alike (never a crash or a silent number)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import moe_kernels
from moe_kernels import MoeCompMethod
from moe_kernels.testing import make_moe_problem, schema_args

UNQUANT, INT8, FP8 = MoeCompMethod.UNQUANT, MoeCompMethod.INT8_W8A8, MoeCompMethod.FP8_W8A16
M, K, N, E, TOPK = 3, 32, 16, 4, 2
Mutation = Callable[[dict[str, Any]], dict[str, Any]]


def _non_contiguous(t: torch.Tensor) -> torch.Tensor:
    """The same values and shape, last two dims laid out transposed."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def _packed(method: int) -> Mutation:
    return lambda a: {
        "w1": moe_kernels.convert_weight_packed(a["w1"], method),
        "w2": moe_kernels.convert_weight_packed(a["w2"], method),
    }


def _with_format_version(packed: torch.Tensor, version: int, experts: slice = slice(None)) -> torch.Tensor:
    """A copy of packed weights whose headers of ``experts`` (all by default) claim
    another format version (the uint32 after the 8-byte magic)."""
    copy = packed.clone()
    copy[experts, 8:12] = torch.tensor([version], dtype=torch.int32).view(torch.uint8)
    return copy


def _routed_to_experts_1_and_0(a: dict[str, Any]) -> torch.Tensor:
    ids = torch.zeros_like(a["topk_ids"])
    ids[:, 0] = 1
    return ids


def _bad(id: str, names: str, mutation: Mutation, method: int = UNQUANT) -> Any:
    """A case: ``mutation`` of a valid problem's arguments must raise an error whose
    message names one of ``names`` (alternatives separated by |)."""
    return pytest.param(method, mutation, rf"\b({names})\b", id=id)


BAD_INPUTS = [
    # hidden_states
    _bad("hidden_states-float64", "hidden_states", lambda a: {"hidden_states": a["hidden_states"].double()}),
    _bad("hidden_states-int32", "hidden_states", lambda a: {"hidden_states": a["hidden_states"].int()}),
    _bad("hidden_states-rank3", "hidden_states", lambda a: {"hidden_states": a["hidden_states"][None]}),
    _bad("hidden_states-noncontiguous", "hidden_states", lambda a: {"hidden_states": _non_contiguous(a["hidden_states"])}),
    # w1 / w2: dtype, rank, layout, and every E/K/N mismatch
    _bad("w1-dtype", "w1", lambda a: {"w1": a["w1"].half()}),
    _bad("w2-dtype", "w2", lambda a: {"w2": a["w2"].float()}),
    _bad("w1-rank2", "w1", lambda a: {"w1": a["w1"][0]}),
    _bad("w2-rank4", "w2", lambda a: {"w2": a["w2"][None]}),
    _bad("w1-noncontiguous", "w1", lambda a: {"w1": _non_contiguous(a["w1"])}),
    _bad("w1-K-mismatch", "w1|hidden_states", lambda a: {"w1": a["w1"][:, :, 1:].contiguous()}),
    _bad("w1-odd-rows", "w1|w2", lambda a: {"w1": a["w1"][:, 1:].contiguous()}),
    _bad("w2-N-mismatch", "w2|w1", lambda a: {"w2": a["w2"][:, :, 1:].contiguous()}),
    _bad("w2-K-mismatch", "w2|hidden_states", lambda a: {"w2": a["w2"][:, 1:].contiguous()}),
    _bad("w2-E-mismatch", "w2|w1", lambda a: {"w2": a["w2"][1:].contiguous()}),
    # routing
    _bad("topk_weights-int", "topk_weights", lambda a: {"topk_weights": a["topk_weights"].int()}),
    _bad("topk_weights-topk-mismatch", "topk_weights|topk_ids", lambda a: {"topk_weights": a["topk_weights"][:, 1:].contiguous()}),
    _bad("topk_weights-M-mismatch", "topk_weights|hidden_states", lambda a: {"topk_weights": a["topk_weights"][1:].contiguous()}),
    _bad("topk_ids-float", "topk_ids", lambda a: {"topk_ids": a["topk_ids"].float()}),
    _bad("topk_ids-int16", "topk_ids", lambda a: {"topk_ids": a["topk_ids"].short()}),
    _bad("topk_ids-rank1", "topk_ids", lambda a: {"topk_ids": a["topk_ids"].flatten()}),
    _bad("topk_ids-M-mismatch", "topk_ids|topk_weights|hidden_states", lambda a: {"topk_ids": a["topk_ids"][1:].contiguous()}),
    _bad("topk_ids-noncontiguous", "topk_ids", lambda a: {"topk_ids": _non_contiguous(a["topk_ids"])}),
    _bad("topk_ids-equal-E", "topk_ids", lambda a: {"topk_ids": a["topk_ids"].clamp(min=0).index_fill(1, torch.tensor([1]), E)}),
    _bad("topk_ids-huge", "topk_ids", lambda a: {"topk_ids": a["topk_ids"].index_fill(0, torch.tensor([2]), 2**31 - 1)}),
    # biases
    _bad("w1_bias-N-mismatch", "w1_bias", lambda a: {"w1_bias": torch.zeros(E, 2 * N - 2)}),
    _bad("w1_bias-E-mismatch", "w1_bias", lambda a: {"w1_bias": torch.zeros(E + 1, 2 * N)}),
    _bad("w1_bias-int", "w1_bias", lambda a: {"w1_bias": torch.zeros(E, 2 * N, dtype=torch.int32)}),
    _bad("w2_bias-K-mismatch", "w2_bias", lambda a: {"w2_bias": torch.zeros(E, K + 1)}),
    _bad("w2_bias-rank1", "w2_bias", lambda a: {"w2_bias": torch.zeros(E * K)}),
    # method, activation
    _bad("moe_comp_method-7", "moe_comp_method", lambda a: {"moe_comp_method": 7}),
    _bad("moe_comp_method-negative", "moe_comp_method", lambda a: {"moe_comp_method": -1}),
    _bad("limit-without-alpha", "limit", lambda a: {"limit": 1.0}),
    # packed weights
    _bad("is_vnni-unpacked-weights", "w1|is_vnni", lambda a: {"is_vnni": True}),
    _bad("is_vnni-forged-bytes", "w1|is_vnni", lambda a: {
        **{name: torch.zeros_like(packed) for name, packed in _packed(UNQUANT)(a).items()},
        "is_vnni": True,
    }),
    _bad("packed-without-is_vnni", "w1|is_vnni", _packed(UNQUANT)),
    _bad("packed-in-another-format-version", "w1", lambda a: {
        name: _with_format_version(packed, 1) for name, packed in _packed(FP8)(a).items()
    } | {"is_vnni": True}, FP8),
    _bad("packed-expert-in-another-format-version", "w2", lambda a: {
        "w1": _packed(INT8)(a)["w1"],
        "w2": _with_format_version(_packed(INT8)(a)["w2"], 1, experts=slice(1, 2)),
        "topk_ids": _routed_to_experts_1_and_0(a),
        "is_vnni": True,
    }, INT8),
    _bad("packed-w2-other-shape", "w2|w1", lambda a: {
        "w2": moe_kernels.convert_weight_packed(a["w2"][:, 1:].contiguous(), UNQUANT),
        "w1": _packed(UNQUANT)(a)["w1"],
        "is_vnni": True,
    }),
    _bad("packed-for-another-method", "w1|moe_comp_method|is_vnni", lambda a: {
        "w1": moe_kernels.convert_weight_packed(a["w1"].bfloat16(), UNQUANT),
        "w2": moe_kernels.convert_weight_packed(a["w2"].bfloat16(), UNQUANT),
        "is_vnni": True,
    }, INT8),
    # INT8_W8A8 scales
    _bad("int8-w1_scale-missing", "w1_scale", lambda a: {"w1_scale": None}, INT8),
    _bad("int8-w2_scale-missing", "w2_scale", lambda a: {"w2_scale": None}, INT8),
    _bad("int8-w1_scale-shape", "w1_scale", lambda a: {"w1_scale": a["w1_scale"][:, 1:].contiguous()}, INT8),
    _bad("int8-w2_scale-shape", "w2_scale", lambda a: {"w2_scale": torch.ones(E, K + 1)}, INT8),
    _bad("int8-w1_scale-dtype", "w1_scale", lambda a: {"w1_scale": a["w1_scale"].bfloat16()}, INT8),
    _bad("int8-w1-float", "w1", lambda a: {"w1": a["w1"].bfloat16()}, INT8),
    # FP8_W8A16 block scales
    _bad("fp8-block_size-missing", "block_size", lambda a: {"block_size": None}, FP8),
    _bad("fp8-block_size-one-value", "block_size", lambda a: {"block_size": [16]}, FP8),
    _bad("fp8-block_size-zero", "block_size", lambda a: {"block_size": [0, 32]}, FP8),
    _bad("fp8-w1_scale-missing", "w1_scale", lambda a: {"w1_scale": None}, FP8),
    _bad("fp8-w2_scale-missing", "w2_scale", lambda a: {"w2_scale": None}, FP8),
    _bad("fp8-w1_scale-grid", "w1_scale", lambda a: {"w1_scale": a["w1_scale"][:, 1:].contiguous()}, FP8),
    _bad("fp8-w2_scale-grid", "w2_scale", lambda a: {"w2_scale": a["w2_scale"][:, :, 1:].contiguous()}, FP8),
    _bad("fp8-w2-int8", "w2", lambda a: {"w2": torch.zeros(E, K, N, dtype=torch.int8)}, FP8),
]  # fmt: skip


def _call_wrapper(kwargs: dict[str, Any]) -> torch.Tensor:
    return moe_kernels.fused_experts(**kwargs)


def _call_op(kwargs: dict[str, Any]) -> torch.Tensor:
    op = torch.ops.moe_kernels.fused_experts_cpu.default
    return op(*schema_args(op, kwargs))


@pytest.mark.parametrize("call", [_call_wrapper, _call_op], ids=["wrapper", "op"])
@pytest.mark.parametrize("method, mutation, names", BAD_INPUTS)
def test_bad_input_names_the_argument(
    method: int, mutation: Mutation, names: str, call: Callable[..., torch.Tensor]
) -> None:
    problem = make_moe_problem(M, K, N, E, TOPK, torch.bfloat16, method, seed=3)
    kwargs = problem.kwargs()
    kwargs.update(mutation(kwargs))
    with pytest.raises((RuntimeError, ValueError), match=names):
        call(kwargs)


@pytest.mark.parametrize("method", [UNQUANT, INT8, FP8], ids=["unquant", "int8", "fp8"])
def test_valid_base_problem_runs(method: int) -> None:
    """The problems the bad inputs start from are themselves valid."""
    problem = make_moe_problem(M, K, N, E, TOPK, torch.bfloat16, method, seed=3)
    assert moe_kernels.fused_experts(**problem.kwargs()).shape == (M, K)
