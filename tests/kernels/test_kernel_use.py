"""The kernels of the level under test did the work: not only the level isa() selected.

For every method and layout, one call with enough rows of a per expert to reach
each level's own kernels and one decode call (one token); around each, the
library's counters (moe_xarch.kernel_use) say which level's code ran each kernel
kind. moe_xarch.expected_kernels declares, independently of the build, which
level's code must: a level that hands out a lower level's kernel fails here, with
the kind, the level expected, the level that ran and isa().
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Mapping

import pytest
import torch

import moe_xarch
from moe_xarch import MoeCompMethod
from moe_xarch.expected_kernels import ARCHITECTURE_LEVELS, EXPECTED_KERNELS, TILE_LAYOUTS
from moe_xarch.testing import make_moe_problem

# method, activation dtype, its weights' dtype as TILE_LAYOUTS names it (None: a dtype no
# level packs in tiles), and the tile GEMM a level that packs it so then runs, if any.
CASES = {
    "unquant-bf16": (MoeCompMethod.UNQUANT, torch.bfloat16, "bf16", "gemm_bf16_tiles"),
    "unquant-fp16": (MoeCompMethod.UNQUANT, torch.float16, None, None),
    "unquant-fp32": (MoeCompMethod.UNQUANT, torch.float32, None, None),
    "int8-bf16": (MoeCompMethod.INT8_W8A8, torch.bfloat16, "int8", "gemm_s8_tiles"),
    "fp8-bf16": (MoeCompMethod.FP8_W8A16, torch.bfloat16, "fp8", "gemm_bf16_fp8_tiles"),
    "fp8-fp32": (MoeCompMethod.FP8_W8A16, torch.float32, "fp8", None),  # fp32 GEMM on widened rows
    "int4-bf16": (MoeCompMethod.INT4_W4A8, torch.bfloat16, None, None),
    "mxfp4-bf16": (MoeCompMethod.MXFP4, torch.bfloat16, None, None),  # widened rows, or fused for few
    "mxfp4-fp32": (MoeCompMethod.MXFP4, torch.float32, None, None),
}
# The 4-bit kernel each 4-bit case must run, by activation dtype.
FOUR_BIT_KIND = {MoeCompMethod.INT4_W4A8: {torch.bfloat16: "gemm_w4a8"},
                 MoeCompMethod.MXFP4: {torch.bfloat16: "mxfp4_to_bf16", torch.float32: "mxfp4_to_f32"}}
# Where a level has it, the fused MXFP4 GEMM takes experts with few rows of a (a decode call's
# one), and the rows are widened for experts with more (a prefill call's at least 16), but at a
# level that widens them in the GEMM (amx: onto tiles), which takes all.
FUSED_KIND = {(MoeCompMethod.MXFP4, torch.bfloat16): "gemm_bf16_mxfp4"}
ACTIVATION_KIND = {"silu": "silu_and_mul", "swiglu": "swiglu"}
# 32 tokens on 2 experts, one each: at least 16 rows of a for one of them, enough
# for every level's own kernels (amx's tiles take 4). K and 2N
# are multiples of 64 (whole vectors and tiles, and every tile layout's blocks apply).
TOKENS, K, N, EXPERTS, TOPK = 32, 64, 32, 2, 1


def measured(work: Callable[[], object]) -> moe_xarch.KernelUse:
    before = moe_xarch.kernel_use()
    work()
    return moe_xarch.kernel_use(since=before)


def owners(levels) -> str:
    return ", ".join(f"{level}'s" for level in levels)


def wrong_kernels(use: Mapping[str, Mapping[str, int]], level: str, *, reaches_own: bool) -> list[str]:
    """What in `use` the level's table forbids; with `reaches_own`, the level's own
    kernel must also have run for every kind that ran."""
    expected = EXPECTED_KERNELS[level]
    wrong = []
    for kind, levels in sorted(use.items()):
        ran = owners(levels)
        if kind not in expected:
            wrong.append(f"{kind}: the {level} level runs no {kind} kernel, but {ran} ran")
            continue
        own = expected[kind].level
        lower = [lv for lv in levels if lv != own and lv not in expected[kind].fallbacks]
        if lower:
            wrong.append(f"{kind}: expected {own}'s kernel, but {owners(lower)} ran")
        elif reaches_own and own not in levels:
            wrong.append(f"{kind}: expected {own}'s kernel, but only {ran} ran")
    return wrong


def assert_level_did_the_work(use: moe_xarch.KernelUse, *, reaches_own: bool, required: set[str],
                              what: str) -> None:
    level = moe_xarch.isa()
    wrong = wrong_kernels(use, level, reaches_own=reaches_own)
    wrong += [f"{kind}: expected {EXPECTED_KERNELS[level][kind].level}'s kernel, but none ran"
              for kind in sorted(required - set(use))]
    assert not wrong, f"{what} under isa() = {level}: " + "; ".join(wrong) + f" (kernels that ran: {use})"


@pytest.mark.parametrize("activation", list(ACTIVATION_KIND))
@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_level_runs_its_own_kernels(case: str, packed: bool, activation: str) -> None:
    method, dtype, weights, tile_gemm = CASES[case]
    expected = EXPECTED_KERNELS[moe_xarch.isa()]
    in_tiles = weights in TILE_LAYOUTS.get(moe_xarch.isa(), {})
    problem = make_moe_problem(TOKENS, K, N, EXPERTS, TOPK, dtype, method, activation=activation)
    pack_kind = "pack_tiles" if in_tiles else "pack_rows"
    packing = measured(lambda: problem.kwargs(packed=packed))
    if packed:
        assert_level_did_the_work(packing, reaches_own=True, required={pack_kind}, what=f"packing {case}")
        assert packing[pack_kind] == {"core": 2}  # one call for w1, one for w2
    else:
        assert packing == {}

    required = {ACTIVATION_KIND[activation], "add_weighted"}
    if method in (MoeCompMethod.INT8_W8A8, MoeCompMethod.INT4_W4A8):
        required.add("quantize_row_s8")
    if method in FOUR_BIT_KIND:
        widening = FOUR_BIT_KIND[method][dtype]
        # A level that never widens MXFP4 into rows takes every row count in its fused GEMM.
        required.add(widening if widening in expected else FUSED_KIND[(method, dtype)])
    if packed and in_tiles and tile_gemm in expected:
        required.add(tile_gemm)
    prefill = measured(lambda: problem.run(moe_xarch.fused_experts, packed=packed))
    assert any(kind.startswith("gemm_") for kind in prefill), f"no GEMM counted: {prefill}"
    assert_level_did_the_work(prefill, reaches_own=True, required=required,
                              what=f"{case} {'packed' if packed else 'unpacked'} {activation}, {TOKENS} tokens")

    one_token = {"hidden_states": problem.arguments["hidden_states"][:1].clone(),
                 "topk_ids": problem.arguments["topk_ids"][:1], "topk_weights": problem.arguments["topk_weights"][:1]}
    decode = measured(lambda: problem.run(moe_xarch.fused_experts, packed=packed, **one_token))
    fused = FUSED_KIND.get((method, dtype))
    if fused in expected:
        required = required - {FOUR_BIT_KIND[method][dtype]} | {fused}
    assert_level_did_the_work(decode, reaches_own=False, required=required,
                              what=f"{case} {'packed' if packed else 'unpacked'} {activation}, 1 token")


def test_the_table_has_every_level_of_this_architecture() -> None:
    ladder = ARCHITECTURE_LEVELS.get(platform.machine(), ("generic",))
    # What the build says it carries (the publish gate counts these) is the declared ladder.
    assert moe_xarch.isa_levels() == list(ladder)
    supported = moe_xarch.supported_isas()
    assert [lv for lv in ladder if lv in supported] == supported, (
        f"the CPU's levels {supported} are not in the declared ladder {ladder}")
    assert set(ladder) <= set(EXPECTED_KERNELS)


@pytest.mark.level_independent
def test_a_wrong_level_is_named() -> None:
    """The check itself: a level's kernel kind run by a lower level, or missing, is reported."""
    use = {"gemm_s8": {"dotprod": 3}, "gemm_f32": {"neon": 1}}
    assert wrong_kernels(use, "i8mm", reaches_own=True) == [
        "gemm_s8: expected i8mm's kernel, but only dotprod's ran"]
    assert wrong_kernels(use, "i8mm", reaches_own=False) == []
    assert wrong_kernels({"gemm_bf16": {"avx512": 2}}, "avx512_bf16", reaches_own=False) == [
        "gemm_bf16: expected avx512_bf16's kernel, but avx512's ran"]
    assert wrong_kernels({"gemm_s8_tiles": {"avx512_bf16": 1}}, "avx2", reaches_own=False) == [
        "gemm_s8_tiles: the avx2 level runs no gemm_s8_tiles kernel, but avx512_bf16's ran"]


def test_counts_come_from_every_thread(on_threads) -> None:
    """The calls of the ATen worker threads count as the calling thread's do: the same
    calls whatever the thread count (at 1 and 2 threads, these widths give each
    phase the same work items: 4 a thread and more)."""
    problem = make_moe_problem(TOKENS, 1024, 1024, EXPERTS, TOPK, torch.bfloat16)
    one = on_threads(1, lambda: measured(lambda: problem.run(moe_xarch.fused_experts)))
    two = on_threads(2, lambda: measured(lambda: problem.run(moe_xarch.fused_experts)))
    assert one and two == one


def test_counters_only_grow() -> None:
    problem = make_moe_problem(2, K, N, EXPERTS, TOPK, torch.float32)
    first = moe_xarch.kernel_use()
    problem.run(moe_xarch.fused_experts)
    second = moe_xarch.kernel_use()
    assert all(second[kind][lv] >= n for kind, levels in first.items() for lv, n in levels.items())
    assert moe_xarch.kernel_use(since=second) == {}
    assert moe_xarch.kernel_use(since=first)
