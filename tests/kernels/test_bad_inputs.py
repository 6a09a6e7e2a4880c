"""Every bad input of the spec is an error that names the argument, through the
Python wrapper and through the raw op alike (never a crash or a silent number)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch

import moe_xarch
from moe_xarch import MoeCompMethod, reference
from moe_xarch.testing import assert_matches_reference, make_moe_problem, schema_args

UNQUANT, INT8, FP8 = MoeCompMethod.UNQUANT, MoeCompMethod.INT8_W8A8, MoeCompMethod.FP8_W8A16
INT4, MXFP4 = MoeCompMethod.INT4_W4A8, MoeCompMethod.MXFP4
M, K, N, E, TOPK = 3, 32, 16, 4, 2
# The 4-bit methods' problems: K and N multiples of 32, INT4 groups of 32 with zero points.
K4, N4 = 64, 32
Mutation = Callable[[dict[str, Any]], dict[str, Any]]


def _non_contiguous(t: torch.Tensor) -> torch.Tensor:
    """The same values and shape, last two dims laid out transposed."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def _packed(method: int) -> Mutation:
    return lambda a: {
        "w1": moe_xarch.convert_weight_packed(a["w1"], method),
        "w2": moe_xarch.convert_weight_packed(a["w2"], method),
    }


def _with_format_version(packed: torch.Tensor, version: int, experts: slice = slice(None)) -> torch.Tensor:
    """A copy of packed weights whose headers of ``experts`` (all by default) claim
    another format version (the uint32 after the 8-byte magic)."""
    copy = packed.clone()
    copy[experts, 8:12] = torch.tensor([version], dtype=torch.int32).view(torch.uint8)
    return copy


def _with_rows(packed: torch.Tensor, rows: int) -> torch.Tensor:
    """A copy of packed weights whose headers claim ``rows`` rows (the int64 at byte 24),
    checksum and all: 2**58 rows of 64 bytes take 2**64 bytes, 0 once wrapped."""
    copy = packed.clone()
    copy[:, 24:32] = torch.tensor([rows], dtype=torch.int64).view(torch.uint8)
    copy[:, 56:64] = torch.tensor([_header_checksum(copy[0, :56])], dtype=torch.int64).view(torch.uint8)
    return copy


def _header_checksum(fields: torch.Tensor) -> int:
    """The packed header's checksum (FNV-1a 64 of its fields), as an int64."""
    value = 0xCBF29CE484222325
    for byte in fields.tolist():
        value = ((value ^ byte) * 0x100000001B3) % 2**64
    return value - 2**64 if value >= 2**63 else value


def _at_byte_offset(t: torch.Tensor, offset: int) -> torch.Tensor:
    """The same values, contiguous, at ``offset`` bytes past a 64-byte boundary (as
    views into a mapped file or a safetensors buffer can be)."""
    nbytes = t.numel() * t.element_size()
    buffer = torch.empty(nbytes + 128, dtype=torch.uint8)
    start = (-buffer.data_ptr()) % 64 + offset
    view = torch.frombuffer(memoryview(buffer.numpy()), dtype=t.dtype, count=t.numel(), offset=start)
    view = view.view(t.shape)
    view.copy_(t)
    assert view.data_ptr() % 64 == offset
    return view


def _routed_to_experts_1_and_0(a: dict[str, Any]) -> torch.Tensor:
    ids = torch.zeros_like(a["topk_ids"])
    ids[:, 0] = 1
    return ids


def _in_expert(name: str, expert: int, value: int) -> Mutation:
    """``name`` (uint8 scales or zero points) with ``value`` in the last row of
    ``expert`` only, and the tokens routed to experts 1 and 0."""
    def change(a: dict[str, Any]) -> dict[str, Any]:
        t = a[name].clone()
        t[expert, -1, -1] = value
        return {name: t, "topk_ids": _routed_to_experts_1_and_0(a)}
    return change


def _bad(id: str, names: str, mutation: Mutation, method: int = UNQUANT, *, packs: bool = False) -> Any:
    """A case: ``mutation`` of a valid problem's arguments must raise an error whose
    message names one of ``names`` (alternatives separated by |). ``packs``: the
    mutation packs weights, which runs the level's packing: every level runs it."""
    return pytest.param(method, mutation, rf"\b({names})\b", id=id,
                        marks=[] if packs else [pytest.mark.level_independent])


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
    }, packs=True),
    _bad("packed-without-is_vnni", "w1|is_vnni", _packed(UNQUANT), packs=True),
    _bad("packed-in-another-format-version", "w1", lambda a: {
        name: _with_format_version(packed, 1) for name, packed in _packed(FP8)(a).items()
    } | {"is_vnni": True}, FP8, packs=True),
    _bad("packed-expert-in-another-format-version", "w2", lambda a: {
        "w1": _packed(INT8)(a)["w1"],
        "w2": _with_format_version(_packed(INT8)(a)["w2"], 1, experts=slice(1, 2)),
        "topk_ids": _routed_to_experts_1_and_0(a),
        "is_vnni": True,
    }, INT8, packs=True),
    _bad("packed-w2-other-shape", "w2|w1", lambda a: {
        "w2": moe_xarch.convert_weight_packed(a["w2"][:, 1:].contiguous(), UNQUANT),
        "w1": _packed(UNQUANT)(a)["w1"],
        "is_vnni": True,
    }, packs=True),
    _bad("packed-for-another-method", "w1|moe_comp_method|is_vnni", lambda a: {
        "w1": moe_xarch.convert_weight_packed(a["w1"].bfloat16(), UNQUANT),
        "w2": moe_xarch.convert_weight_packed(a["w2"].bfloat16(), UNQUANT),
        "is_vnni": True,
    }, INT8, packs=True),
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
    _bad("fp8-block_size-overflows-the-block-count", "w1_scale", lambda a: {
        "block_size": [2**63 - 1, 2**63 - 1], "w1_scale": torch.ones(E, 0, 0), "w2_scale": torch.ones(E, 0, 0),
    }, FP8),
    # 4-bit weights (the spec's "4-bit weights"): odd or unblocked dims, groups, scales and zeros
    _bad("int4-K-odd", "hidden_states", lambda a: {"hidden_states": a["hidden_states"][:, 1:].contiguous()}, INT4),
    _bad("int4-N-odd", "w1", lambda a: {"w1": a["w1"][:, 2:].contiguous(), "w1_scale": a["w1_scale"][:, 2:].contiguous(),
                                        "w1_zero": a["w1_zero"][:, 2:].contiguous()}, INT4),
    _bad("int4-w1-int8", "w1", lambda a: {"w1": a["w1"].view(torch.int8)}, INT4),
    _bad("int4-w2-unpacked-values", "w2", lambda a: {"w2": torch.zeros(E, K4, N4, dtype=torch.uint8)}, INT4),
    _bad("int4-w1_scale-missing", "w1_scale", lambda a: {"w1_scale": None}, INT4),
    _bad("int4-w2_scale-dtype", "w2_scale", lambda a: {"w2_scale": a["w2_scale"].bfloat16()}, INT4),
    _bad("int4-w1_scale-rank2", "w1_scale", lambda a: {"w1_scale": a["w1_scale"][:, :, 0].contiguous()}, INT4),
    _bad("int4-w1_scale-rows", "w1_scale", lambda a: {"w1_scale": a["w1_scale"][:, 1:].contiguous()}, INT4),
    _bad("int4-group-not-dividing-K", "w1_scale", lambda a: {"w1_scale": torch.ones(E, 2 * N4, 3)}, INT4),
    _bad("int4-group-not-a-multiple-of-32", "w1_scale", lambda a: {"w1_scale": torch.ones(E, 2 * N4, 4),
                                                                   "w1_zero": None}, INT4),
    _bad("int4-block_size-not-the-group", "block_size", lambda a: {"block_size": [1, 64]}, INT4),
    _bad("int4-w1_zero-16", "w1_zero", lambda a: {"w1_zero": a["w1_zero"].index_fill(2, torch.tensor([1]), 16)}, INT4),
    _bad("int4-w2_zero-16-in-one-expert", "w2_zero", _in_expert("w2_zero", 1, 16), INT4),
    _bad("int4-w2_zero-dtype", "w2_zero", lambda a: {"w2_zero": a["w2_zero"].int()}, INT4),
    _bad("int4-w2_zero-shape", "w2_zero", lambda a: {"w2_zero": a["w2_zero"][:, 1:].contiguous()}, INT4),
    _bad("int4-packed-as-mxfp4", "w1", lambda a: {
        name: moe_xarch.convert_weight_packed(a[name], MXFP4) for name in ("w1", "w2")} | {"is_vnni": True}, INT4),
    _bad("mxfp4-K-not-a-multiple-of-32", "w1|hidden_states", lambda a: {
        "hidden_states": a["hidden_states"][:, :48].contiguous(), "w1": a["w1"][:, :, :24].contiguous(),
        "w2": a["w2"][:, :48].contiguous(), "w2_scale": a["w2_scale"][:, :48].contiguous(),
        "w2_bias": None}, MXFP4),
    _bad("mxfp4-w1_scale-255", "w1_scale", lambda a: {"w1_scale": a["w1_scale"].index_fill(1, torch.tensor([3]), 255)},
         MXFP4),
    _bad("mxfp4-w2_scale-255-in-one-expert", "w2_scale", _in_expert("w2_scale", 1, 255), MXFP4),
    _bad("mxfp4-w2_scale-float", "w2_scale", lambda a: {"w2_scale": a["w2_scale"].float()}, MXFP4),
    _bad("mxfp4-w2_scale-shape", "w2_scale", lambda a: {"w2_scale": a["w2_scale"][:, :, :0].contiguous()}, MXFP4),
    _bad("mxfp4-w1_zero-given", "w1_zero", lambda a: {"w1_zero": torch.zeros_like(a["w1_scale"])}, MXFP4),
    _bad("mxfp4-block_size", "block_size", lambda a: {"block_size": [1, 16]}, MXFP4),
    # alpha and limit, as float32 numbers
    _bad("alpha-nan", "alpha", lambda a: {"alpha": float("nan")}),
    _bad("alpha-inf", "alpha", lambda a: {"alpha": float("inf")}),
    _bad("alpha-inf-in-float32", "alpha", lambda a: {"alpha": 1e39}),
    _bad("limit-nan", "limit", lambda a: {"alpha": 1.702, "limit": float("nan")}),
    _bad("limit-zero", "limit", lambda a: {"alpha": 1.702, "limit": 0.0}),
    _bad("limit-negative", "limit", lambda a: {"alpha": 1.702, "limit": -7.0}),
    # devices: a meta argument sends the call to the fake kernel, which must refuse it too
    *(_bad(f"{name}-on-meta", name, lambda a, name=name: {name: a[name].to("meta")})
      for name in ("w1", "w2", "topk_weights", "topk_ids")),
    _bad("w1_bias-on-meta", "w1_bias", lambda a: {"w1_bias": torch.zeros(E, 2 * N, device="meta")}),
    _bad("w2_bias-on-meta", "w2_bias", lambda a: {"w2_bias": torch.zeros(E, K, device="meta")}),
    _bad("int8-w1_scale-on-meta", "w1_scale", lambda a: {"w1_scale": a["w1_scale"].to("meta")}, INT8),
    _bad("fp8-w2_scale-on-meta", "w2_scale", lambda a: {"w2_scale": a["w2_scale"].to("meta")}, FP8),
    # addresses: views at byte offsets their values cannot be read at
    _bad("topk_weights-misaligned", "topk_weights", lambda a: {"topk_weights": _at_byte_offset(a["topk_weights"], 1)}),
    _bad("w2-misaligned", "w2", lambda a: {"w2": _at_byte_offset(a["w2"], 1)}),
    _bad("packed-w1-misaligned", "w1", lambda a: {
        "w1": _at_byte_offset(_packed(INT8)(a)["w1"], 2), "w2": _packed(INT8)(a)["w2"], "is_vnni": True,
    }, INT8, packs=True),
    # forged packed headers
    _bad("packed-rows-wrap-the-size", "w1 has a corrupt packed header", lambda a: {
        "w1": _with_rows(_packed(FP8)(a)["w1"][:, :64].contiguous(), 2**58), "w2": _packed(FP8)(a)["w2"], "is_vnni": True,
    }, FP8, packs=True),
    _bad("packed-truncated", "w1 has 4096 bytes per expert", lambda a: {
        "w1": _packed(UNQUANT)(a)["w1"][:, :-64].contiguous(), "w2": _packed(UNQUANT)(a)["w2"], "is_vnni": True,
    }, packs=True),
]  # fmt: skip


def _dims(method: int) -> tuple[int, int]:
    return (K4, N4) if method in (INT4, MXFP4) else (K, N)


def _call_wrapper(kwargs: dict[str, Any]) -> torch.Tensor:
    return moe_xarch.fused_experts(**kwargs)


def _call_op(kwargs: dict[str, Any]) -> torch.Tensor:
    op = torch.ops.moe_xarch.fused_experts_cpu.default
    return op(*schema_args(op, kwargs))


@pytest.mark.parametrize("call", [_call_wrapper, _call_op], ids=["wrapper", "op"])
@pytest.mark.parametrize("method, mutation, names", BAD_INPUTS)
def test_bad_input_names_the_argument(
    method: int, mutation: Mutation, names: str, call: Callable[..., torch.Tensor]
) -> None:
    problem = make_moe_problem(M, *_dims(method), E, TOPK, torch.bfloat16, method, seed=3)
    kwargs = problem.kwargs()
    kwargs.update(mutation(kwargs))
    with pytest.raises((RuntimeError, ValueError), match=names):
        call(kwargs)


@pytest.mark.parametrize("method", [UNQUANT, INT8, FP8, INT4, MXFP4], ids=["unquant", "int8", "fp8", "int4", "mxfp4"])
def test_valid_base_problem_runs(method: int) -> None:
    """The problems the bad inputs start from are themselves valid."""
    problem = make_moe_problem(M, *_dims(method), E, TOPK, torch.bfloat16, method, seed=3)
    assert moe_xarch.fused_experts(**problem.kwargs()).shape == (M, _dims(method)[0])


@pytest.mark.parametrize("method, name, value", [(INT4, "w1_zero", 16), (MXFP4, "w2_scale", 255)],
                         ids=["int4-w1_zero-16", "mxfp4-w2_scale-255"])
def test_values_of_an_expert_no_token_reads_are_not_read(method: int, name: str, value: int) -> None:
    """Scales and zero points are checked where the call reads them, in the
    experts its tokens are routed to (over every expert, the check would read
    as many bytes as decode reads of weights): a bad value elsewhere changes
    nothing, and an error at the first call that reads it."""
    problem = make_moe_problem(M, *_dims(method), E, TOPK, torch.bfloat16, method, seed=3)
    kwargs = problem.kwargs() | {"topk_ids": _routed_to_experts_1_and_0(problem.kwargs())}
    expected = moe_xarch.fused_experts(**kwargs)
    unread = kwargs | _in_expert(name, 3, value)(kwargs)
    assert torch.equal(moe_xarch.fused_experts(**unread), expected)
    read = unread | {"topk_ids": torch.full_like(unread["topk_ids"], 3)}
    with pytest.raises(RuntimeError, match=rf"\b{name}\b.*\(expert 3\)"):
        moe_xarch.fused_experts(**read)


@pytest.mark.level_independent
@pytest.mark.parametrize("name", ["w1", "w2", "topk_ids", "w2_bias"])
def test_cpu_kernel_refuses_a_tensor_on_another_device(name: str) -> None:
    """The CPU kernel itself checks every tensor's device (here called past the
    dispatcher, which would send a meta argument to the fake kernel)."""
    problem = make_moe_problem(M, K, N, E, TOPK, torch.bfloat16, UNQUANT, bias=True, seed=3)
    kwargs = problem.kwargs() | {name: problem.kwargs()[name].to("meta")}
    op = torch.ops.moe_xarch.fused_experts_cpu.default
    cpu = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    with pytest.raises(RuntimeError, match=rf"\b{name}\b.*CPU"):
        op.redispatch(cpu, *schema_args(op, kwargs))


@pytest.mark.level_independent
def test_inplace_call_with_a_meta_weight_leaves_hidden_states_unchanged() -> None:
    problem = make_moe_problem(M, K, N, E, TOPK, torch.bfloat16, UNQUANT, seed=3)
    kwargs = problem.kwargs() | {"w1": problem.kwargs()["w1"].to("meta"), "inplace": True}
    before = kwargs["hidden_states"].clone()
    with pytest.raises(RuntimeError, match=r"\bw1\b"):
        moe_xarch.fused_experts(**kwargs)
    assert torch.equal(kwargs["hidden_states"], before)


@pytest.mark.level_independent
def test_all_meta_arguments_still_give_the_output_shape() -> None:
    """The fake kernel's device check refuses mixed devices only."""
    kwargs = make_moe_problem(M, K, N, E, TOPK, torch.bfloat16, UNQUANT, seed=3).kwargs()
    meta = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    out = moe_xarch.fused_experts(**meta)
    assert out.device.type == "meta" and out.shape == (M, K)


@pytest.mark.level_independent
@pytest.mark.parametrize(
    "name, value",
    [
        ("moe_comp_method", 0.7),
        ("moe_comp_method", "1"),
        ("moe_comp_method", True),
        ("block_size", [16.0, 32.0]),
        ("block_size", [True, 32]),
        ("block_size", "16"),
        ("alpha", "1.702"),
        ("alpha", True),
        ("limit", "7"),
        ("inplace", None),
        ("inplace", 1),
        ("is_vnni", 1),
        ("is_vnni", None),
    ],
)
def test_wrapper_takes_each_argument_in_its_own_type(name: str, value: object) -> None:
    kwargs = make_moe_problem(M, K, N, E, TOPK, torch.bfloat16, FP8, seed=3).kwargs()
    kwargs.update({name: value} | ({"alpha": 1.702} if name == "limit" else {}))
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        moe_xarch.fused_experts(**kwargs)


def test_wrapper_takes_an_int_alpha_a_tuple_block_size_and_the_method_enum() -> None:
    kwargs = make_moe_problem(M, K, N, E, TOPK, torch.float32, FP8, activation="swiglu", seed=3).kwargs()
    expected = moe_xarch.fused_experts(**kwargs | {"alpha": 2.0})
    other_types = {"alpha": 2, "block_size": tuple(kwargs["block_size"]), "moe_comp_method": FP8}
    assert torch.equal(moe_xarch.fused_experts(**kwargs | other_types), expected)


def test_infinite_limit_clamps_nothing() -> None:
    problem = make_moe_problem(M, K, N, E, TOPK, torch.float32, UNQUANT, activation="swiglu", seed=3)
    kwargs = problem.kwargs()
    expected = reference.fused_experts(**kwargs | {"limit": float("inf")})
    assert_matches_reference(moe_xarch.fused_experts(**kwargs | {"limit": float("inf")}), expected, UNQUANT, torch.float32)
    torch.testing.assert_close(expected, reference.fused_experts(**kwargs))


def test_packed_header_is_checked_bit_for_bit() -> None:
    """One flipped bit anywhere in a packed header (its layout byte included) is an
    error naming the weight, never weights read another way."""
    kwargs = make_moe_problem(2, 64, 32, 2, 1, torch.bfloat16, UNQUANT, seed=3).kwargs()
    w1 = moe_xarch.convert_weight_packed(kwargs["w1"], UNQUANT)
    w2 = moe_xarch.convert_weight_packed(kwargs["w2"], UNQUANT)
    kwargs.update(w2=w2, is_vnni=True)
    moe_xarch.fused_experts(**kwargs | {"w1": w1})
    for byte in range(64):
        for bit in range(8):
            flipped = w1.clone()
            flipped[:, byte] ^= 1 << bit
            with pytest.raises(RuntimeError, match=r"\bw1\b"):
                moe_xarch.fused_experts(**kwargs | {"w1": flipped})


def _fnv1a(data: bytes) -> int:
    hash = 0xCBF29CE484222325
    for byte in data:
        hash = ((hash ^ byte) * 0x100000001B3) % 2**64
    return hash


def test_weights_packed_on_another_architecture_are_refused() -> None:
    """A whole, self-consistent header (its checksum recomputed) that says another
    architecture packed it, for each the header can name (PackArch in csrc/core/packing.h)
    and a value none names: refused by that name, since each architecture lays packs out
    its own way."""
    kwargs = make_moe_problem(2, 64, 32, 2, 1, torch.bfloat16, UNQUANT, seed=3).kwargs()
    w1 = moe_xarch.convert_weight_packed(kwargs["w1"], UNQUANT)
    kwargs.update(w2=moe_xarch.convert_weight_packed(kwargs["w2"], UNQUANT), is_vnni=True)
    arch_offset, checksum_offset = 12, 56  # PackedHeader in csrc/core/packing.h
    header = w1[0, :64].numpy().tobytes()
    this_arch = int.from_bytes(header[arch_offset:arch_offset + 4], "little")
    names = {0: "generic", 1: "x86_64", 2: "aarch64", 7: "unknown"}
    for other_arch, name in names.items():
        if other_arch == this_arch:
            continue
        forged = bytearray(header)
        forged[arch_offset:arch_offset + 4] = other_arch.to_bytes(4, "little")
        forged[checksum_offset:] = _fnv1a(bytes(forged[:checksum_offset])).to_bytes(8, "little")
        moved = w1.clone()
        moved[:, :64] = torch.frombuffer(forged, dtype=torch.uint8)
        with pytest.raises(RuntimeError, match=rf"\bw1 was packed on {name}; repack it on this machine"):
            moe_xarch.fused_experts(**kwargs | {"w1": moved})


@pytest.mark.level_independent
def test_packed_nbytes_does_not_wrap() -> None:
    with pytest.raises(RuntimeError, match=r"\brows\b.*\bcols\b"):
        torch.ops.moe_xarch.packed_nbytes(2**62, 64, torch.float8_e4m3fn, FP8)
    with pytest.raises(RuntimeError, match=r"\brows\b.*\bcols\b"):
        torch.ops.moe_xarch.packed_nbytes(64, 2**63 - 1, torch.bfloat16, UNQUANT)


@pytest.mark.level_independent
@pytest.mark.parametrize("shape", [(2, 0, 32), (2, 32, 0)])
def test_convert_weight_packed_of_an_empty_dimension_names_weight(shape: tuple[int, ...]) -> None:
    with pytest.raises(RuntimeError, match=r"\bweight\b.*\[E, rows, cols\]"):
        moe_xarch.convert_weight_packed(torch.zeros(shape, dtype=torch.bfloat16), UNQUANT)


# Cases whose regression would crash the process (a signal, not an exception): each
# runs in a child process, all of them in one (importing torch under QEMU is slow),
# and reports back; the tests below assert on what each reported.
_CRASH_PRONE: dict[str, Callable[[], None]] = {}


def _crash_prone(case: Callable[[], None]) -> Callable[[], None]:
    _CRASH_PRONE[case.__name__] = case
    return case


def _n_zero_expected(kwargs: dict[str, Any]) -> torch.Tensor:
    """With N = 0 the math leaves sum_t w * w2_bias[e]: zeros without a bias."""
    ids, weights = kwargs["topk_ids"].long(), kwargs["topk_weights"].float()
    bias = kwargs["w2_bias"]
    out = torch.zeros(kwargs["hidden_states"].shape)
    if bias is not None:
        used = ids >= 0
        out = (weights[:, :, None] * bias.float()[ids.clamp(min=0)] * used[:, :, None]).sum(dim=1)
    return out.to(kwargs["hidden_states"].dtype)


@_crash_prone
def n_zero_is_the_bias_alone() -> None:
    """w1 [E, 0, K], w2 [E, K, 0] (an expert getting one row and several): every
    method gives sum_t w * w2_bias[e], as the reference does."""
    base = make_moe_problem(4, K, N, E, 1, torch.bfloat16, UNQUANT, bias=True, seed=3).kwargs()
    base["topk_ids"] = torch.tensor([[0], [1], [1], [-1]], dtype=torch.int32)
    weights = {
        UNQUANT: (torch.zeros(E, 0, K, dtype=torch.bfloat16), torch.zeros(E, K, 0, dtype=torch.bfloat16), {}),
        INT8: (torch.zeros(E, 0, K, dtype=torch.int8), torch.zeros(E, K, 0, dtype=torch.int8),
               {"w1_scale": torch.ones(E, 0), "w2_scale": torch.ones(E, K)}),
        FP8: (torch.zeros(E, 0, K, dtype=torch.float8_e4m3fn), torch.zeros(E, K, 0, dtype=torch.float8_e4m3fn),
              {"w1_scale": torch.ones(E, 0, 1), "w2_scale": torch.ones(E, 2, 0), "block_size": [16, 32]}),
    }  # fmt: skip
    for method, (w1, w2, scales) in weights.items():
        for bias in (True, False):
            kwargs = base | {"w1": w1, "w2": w2, "moe_comp_method": method, "w1_bias": torch.zeros(E, 0)} | scales
            if not bias:
                kwargs.update(w1_bias=None, w2_bias=None)
            out = moe_xarch.fused_experts(**kwargs)
            assert_matches_reference(out, _n_zero_expected(kwargs), method, torch.bfloat16)
            if method == UNQUANT:
                assert_matches_reference(out, reference.fused_experts(**kwargs), method, torch.bfloat16)


@_crash_prone
def huge_routed_copy_is_a_memory_error() -> None:
    """topk = 2**22 slots (duplicates: legal) of a K = 2**20 row ask for 8 TiB of
    routed rows from 40 MB of inputs: an error that names the buffer and its arguments."""
    topk, k = 2**22, 2**20
    with pytest.raises(RuntimeError, match=r"hidden_states.*topk.*memory"):
        moe_xarch.fused_experts(
            torch.zeros(1, k, dtype=torch.bfloat16),
            torch.zeros(1, 2, k, dtype=torch.bfloat16),
            torch.zeros(1, k, 1, dtype=torch.bfloat16),
            torch.zeros(1, topk),
            torch.zeros(1, topk, dtype=torch.int32),
        )


@_crash_prone
def fp8_huge_block_size_is_one_block() -> None:
    """block_size near 2**63 blocks each dimension once: scales [E, 1, 1] and the
    result of blocks that cover the dimensions (K = 2N = 32)."""
    problem = make_moe_problem(M, K, N, E, TOPK, torch.bfloat16, FP8, block_size=(32, 32), seed=3)
    one_block = moe_xarch.fused_experts(**problem.kwargs())
    assert_matches_reference(one_block, reference.fused_experts(**problem.kwargs()), FP8, torch.bfloat16)
    huge = moe_xarch.fused_experts(**problem.kwargs(block_size=[2**63 - 1, 2**63 - 2]))
    assert torch.equal(huge, one_block)


@_crash_prone
def packed_view_off_a_64_byte_boundary_runs() -> None:
    """Packed weights at 8 bytes past a 64-byte boundary (views into a mapped file)
    give the result of the aligned ones, for every method and layout."""
    for method in (UNQUANT, INT8, FP8):
        kwargs = make_moe_problem(4, 64, 32, 2, 1, torch.bfloat16, method, block_size=(32, 32), seed=3).kwargs()
        packed = _packed(method)(kwargs)
        aligned = moe_xarch.fused_experts(**kwargs | packed | {"is_vnni": True})
        views = {name: _at_byte_offset(w, 8) for name, w in packed.items()}
        assert torch.equal(moe_xarch.fused_experts(**kwargs | views | {"is_vnni": True}), aligned)


@pytest.fixture(scope="module")
def crash_prone_reports() -> dict[str, str]:
    """What each crash-prone case reported from the child: "passed" or its failure."""
    child = subprocess.run(
        [sys.executable, __file__, *_CRASH_PRONE], capture_output=True, text=True, timeout=1800, check=False
    )
    reports = dict(line.split(" ", 1)[1].split(": ", 1) for line in child.stdout.splitlines() if line.startswith("REPORT "))
    started = [line.split(" ", 1)[1] for line in child.stdout.splitlines() if line.startswith("START ")]
    for name in _CRASH_PRONE:
        if name not in reports:
            died = f"the child process ended with {child.returncode} ({_signal_name(child.returncode)})"
            reports[name] = f"{died} while running it" if started and started[-1] == name else f"not run: {died}"
            reports[name] += "\n" + child.stderr[-2000:]
    return reports


def _signal_name(returncode: int) -> str:
    return signal.Signals(-returncode).name if returncode < 0 else "no signal"


@pytest.mark.parametrize("case", list(_CRASH_PRONE))
def test_crash_prone_input(case: str, crash_prone_reports: dict[str, str]) -> None:
    assert crash_prone_reports[case] == "passed", crash_prone_reports[case]


def _run_cases(names: list[str]) -> None:
    torch.set_num_threads(1)
    for name in names:
        print("START", name, flush=True)
        try:
            _CRASH_PRONE[name]()
            outcome = "passed"
        except Exception as error:  # noqa: BLE001 - reported to the parent test
            outcome = f"{type(error).__name__}: {error}".replace("\n", " ")
        print("REPORT", f"{name}: {outcome}", flush=True)


if __name__ == "__main__":
    _run_cases(sys.argv[1:])
