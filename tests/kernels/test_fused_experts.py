"""The kernel against the reference oracle, over the spec's whole feature matrix.

The full product of the factors below has 3456 cases, and that of the 4-bit
methods' factors (shapes of their own) 2592: too many for QEMU and for one run
per ISA level. By default each matrix is a greedy covering array of strength 3
(~70 and ~40 cases): every value of every factor meets every combination of
values of any two other factors at least once, which implies the pairwise
coverage the suite promises. MOE_XARCH_TEST_STRENGTH=<t> raises the strength,
MOE_XARCH_TEST_STRENGTH=full runs the full product.
"""

from __future__ import annotations

import importlib.util
import os
import zlib
from pathlib import Path

import pytest
import torch

import moe_xarch
from moe_xarch import MoeCompMethod, reference
from moe_xarch.expected_kernels import TILE_LAYOUTS
from moe_xarch.testing import (
    ACTIVATIONS,
    MoeProblem,
    assert_matches_reference,
    covering_array,
    make_moe_problem,
)

_spec = importlib.util.spec_from_file_location("level_runner", Path(__file__).with_name("level_runner.py"))
level_runner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(level_runner)

METHODS = {
    "unquant": MoeCompMethod.UNQUANT,
    "int8": MoeCompMethod.INT8_W8A8,
    "fp8": MoeCompMethod.FP8_W8A16,
}
# The 4-bit methods need K and N to be multiples of 32: their own shapes and covering array.
FOUR_BIT_METHODS = {"int4": MoeCompMethod.INT4_W4A8, "mxfp4": MoeCompMethod.MXFP4}
ALL_METHODS = {**METHODS, **FOUR_BIT_METHODS}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# (K, N, E, topk). FP8 uses [16, 32] blocks throughout.
SHAPES = {
    "K64N32E4top2": (64, 32, 4, 2),  # whole vectors; FP8 blocks divide every dim
    "K75N37E8top3": (75, 37, 8, 3),  # K and N odd: a tail at every vector width; partial FP8 blocks
    "K12N3E2top2": (12, 3, 2, 2),  # less than one vector or block (N: of every width); topk == E
    "K1160N47E6top1": (1160, 47, 6, 1),  # one expert per token; K longer than the x86 tiles' K blocks
}
# (K, N, E, topk, the largest INT4 group size dividing K and N).
FOUR_BIT_SHAPES = {
    "K128N64E4top2": (128, 64, 4, 2, 64),  # one 128-value vector step of K; two groups of 32
    "K192N96E8top3": (192, 96, 8, 3, 96),  # a K tail of 64 values; groups of 96 straddle vector steps
    "K1152N128E6top1": (1152, 128, 6, 1, 128),  # K over many steps; one expert per token
}
FACTORS = {
    "method": list(METHODS),
    "dtype": list(DTYPES),
    "activation": list(ACTIVATIONS),
    "bias": ["nobias", "bias"],
    "inplace": ["outofplace", "inplace"],
    "weights": ["unpacked", "packed"],
    "M": [1, 3, 16, 67],
    "shape": list(SHAPES),
}
# INT4_W4A8's groups: 32 with zero points, or the shape's largest and none (zero point 8);
# MXFP4 ignores them (its blocks are always 32).
FOUR_BIT_FACTORS = {
    **FACTORS,
    "method": list(FOUR_BIT_METHODS),
    "M": [1, 3, 67],
    "shape": list(FOUR_BIT_SHAPES),
    "groups": ["g32", "gmax-nozero"],
}


def _strength() -> int:
    requested = os.environ.get("MOE_XARCH_TEST_STRENGTH", "3")
    return len(FACTORS) if requested == "full" else int(requested)


def _case_id(case: dict) -> str:
    return "-".join(f"M{v}" if k == "M" else str(v) for k, v in case.items())


def _params(cases: list[dict]) -> list:
    """The cases as params; the first of each (method, dtype) joins the canary stage."""
    seen = set()
    params = []
    for case in cases:
        key = (case["method"], case["dtype"])
        params.append(pytest.param(case, id=_case_id(case), marks=[] if key in seen else [pytest.mark.canary]))
        seen.add(key)
    return params


CASES = _params(covering_array(FACTORS, _strength()) + covering_array(FOUR_BIT_FACTORS, _strength()))


def _problem(case: dict, seed: int):
    """The case's problem, from either covering array."""
    method, dtype = ALL_METHODS[case["method"]], DTYPES[case["dtype"]]
    if case["shape"] in SHAPES:
        K, N, E, topk = SHAPES[case["shape"]]
        four_bit = {}
    else:
        K, N, E, topk, widest = FOUR_BIT_SHAPES[case["shape"]]
        g32 = case["groups"] == "g32"
        four_bit = {"group_size": 32 if g32 else widest, "zero_points": g32}
    return make_moe_problem(case["M"], K, N, E, topk, dtype, method, bias=case["bias"] == "bias",
                            activation=case["activation"], seed=seed, **four_bit)


def _seed(request: pytest.FixtureRequest) -> int:
    """A stable per-test seed (Python's hash() is salted per process)."""
    return zlib.crc32(request.node.name.encode())


@pytest.mark.parametrize("case", CASES)
def test_matches_reference(case: dict, request: pytest.FixtureRequest) -> None:
    method, dtype = ALL_METHODS[case["method"]], DTYPES[case["dtype"]]
    problem = _problem(case, _seed(request))
    expected = problem.run(reference.fused_experts)

    inplace = case["inplace"] == "inplace"
    kwargs = problem.kwargs(packed=case["weights"] == "packed", inplace=inplace)
    actual = moe_xarch.fused_experts(**kwargs)

    assert actual.dtype == dtype and actual.shape == expected.shape
    if inplace:
        assert actual.data_ptr() == kwargs["hidden_states"].data_ptr()
    assert_matches_reference(actual, expected, method, dtype)


BOTH_LAYOUTS = pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
EVERY_METHOD = pytest.mark.parametrize("method", ALL_METHODS.values(), ids=ALL_METHODS.keys())


def _fit(method: int, *dims: int) -> tuple[int, ...]:
    """The dims as they are, or for a 4-bit method rounded up to multiples of 32."""
    if method not in FOUR_BIT_METHODS.values():
        return dims
    return tuple(-(-d // 32) * 32 for d in dims)


@pytest.mark.canary
@EVERY_METHOD
@BOTH_LAYOUTS
def test_row_with_only_negative_ids_is_zero(method: int, packed: bool) -> None:
    # Biases on: an unused slot must not even add w2_bias.
    problem = make_moe_problem(4, 64, 32, 4, 3, torch.bfloat16, method, bias=True, seed=7)
    topk_ids = problem.arguments["topk_ids"].clone()
    topk_ids[1] = -1
    topk_ids[2, 0] = -5  # any negative id marks an unused slot
    expected = problem.run(reference.fused_experts, topk_ids=topk_ids)
    actual = moe_xarch.fused_experts(**problem.kwargs(packed=packed, topk_ids=topk_ids))

    assert torch.equal(actual[1], torch.zeros_like(actual[1]))
    assert_matches_reference(actual, expected, method, torch.bfloat16)


@EVERY_METHOD
@BOTH_LAYOUTS
def test_inplace_equals_out_of_place(method: int, packed: bool) -> None:
    problem = make_moe_problem(16, *_fit(method, 72, 40), 8, 3, torch.bfloat16, method, activation="swiglu", seed=8)
    out_of_place = moe_xarch.fused_experts(**problem.kwargs(packed=packed))
    kwargs = problem.kwargs(packed=packed, inplace=True)
    result = moe_xarch.fused_experts(**kwargs)

    assert result.data_ptr() == kwargs["hidden_states"].data_ptr()
    assert torch.equal(kwargs["hidden_states"], out_of_place)


@pytest.mark.canary
@EVERY_METHOD
def test_routing_and_bias_in_other_dtypes(method: int) -> None:
    """topk_ids may be int64; topk_weights and biases any float dtype (used in float32)."""
    problem = make_moe_problem(
        5, 64, 32, 4, 2, torch.bfloat16, method, bias=True, seed=9,
        ids_dtype=torch.int64, bias_dtype=torch.float32,
    )
    topk_weights = problem.arguments["topk_weights"].to(torch.float16)
    expected = problem.run(reference.fused_experts, topk_weights=topk_weights)
    actual = moe_xarch.fused_experts(**problem.kwargs(topk_weights=topk_weights))
    assert_matches_reference(actual, expected, method, torch.bfloat16)


@BOTH_LAYOUTS
@pytest.mark.parametrize("block_size", [(32, 16), (8, 24), (128, 128)], ids=str)
def test_fp8_block_sizes(block_size: tuple[int, int], packed: bool) -> None:
    """Blocks other than the matrix's [16, 32]: transposed, not a power of two,
    and larger than every dim (one partial block per matrix)."""
    fp8 = METHODS["fp8"]
    problem = make_moe_problem(
        7, 72, 40, 4, 2, torch.float32, fp8, activation="swiglu_limit", seed=10, block_size=block_size
    )
    expected = problem.run(reference.fused_experts)
    actual = moe_xarch.fused_experts(**problem.kwargs(packed=packed))
    assert_matches_reference(actual, expected, fp8, torch.float32)


@BOTH_LAYOUTS
@pytest.mark.parametrize("tokens", [3, 9])
def test_fp8_blocks_of_k_off_the_lines(packed: bool, tokens: int) -> None:
    """bf16 activations with FP8 blocks of K no multiple of 4: the packed line
    layout's groups of 4 values of K straddle blocks (rows of W1 and W2 a
    multiple of 32, so both take that layout where it applies), for few and
    many rows."""
    fp8 = METHODS["fp8"]
    problem = make_moe_problem(tokens, 96, 48, 4, 2, torch.bfloat16, fp8, seed=16, block_size=(8, 18))
    expected = problem.run(reference.fused_experts)
    actual = moe_xarch.fused_experts(**problem.kwargs(packed=packed))
    assert_matches_reference(actual, expected, fp8, torch.bfloat16)


@EVERY_METHOD
@BOTH_LAYOUTS
@pytest.mark.parametrize("tokens", [1, 2])
def test_decode_long_rows(method: int, packed: bool, tokens: int) -> None:
    """Decode-sized inputs with weight rows long enough for the streaming paths
    (one-row tiles over rows a page apart; fp8 widened in registers for experts
    with few rows), FP8 blocks that cut across vectors."""
    problem = make_moe_problem(tokens, 1024, 512, 2, 2, torch.bfloat16, method, activation="swiglu_limit",
                               seed=12, block_size=(8, 24))
    expected = problem.run(reference.fused_experts)
    actual = moe_xarch.fused_experts(**problem.kwargs(packed=packed))
    assert_matches_reference(actual, expected, method, torch.bfloat16)


def _check_on_one_expert(problem: MoeProblem, method: int, packed: bool) -> None:
    """The problem with every token routed to expert 0 alone, against the reference."""
    topk_ids = torch.zeros_like(problem.arguments["topk_ids"])
    expected = problem.run(reference.fused_experts, topk_ids=topk_ids)
    actual = moe_xarch.fused_experts(**problem.kwargs(packed=packed, topk_ids=topk_ids))
    assert_matches_reference(actual, expected, method, torch.bfloat16)


@BOTH_LAYOUTS
@pytest.mark.parametrize("dims", [(224, 160), (192, 96)], ids=["K224N160", "K192N96"])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 12, 13])
def test_mxfp4_rows_per_expert(rows: int, dims: tuple[int, int], packed: bool) -> None:
    """MXFP4 with bf16 activations, every token on one expert: the counts of rows
    of a that the levels' fused GEMMs take (up to 8 at avx512 and avx512_bf16,
    12 at avx2, 1 or 2 on aarch64) and the first they widen for, with strips of
    the fused tiles cut short; K and N end in tails of 32, 64 and 96 values
    past whole vector steps of 128 (and of 32 past steps of 64)."""
    mxfp4 = ALL_METHODS["mxfp4"]
    problem = make_moe_problem(rows, *dims, 2, 1, torch.bfloat16, mxfp4, bias=True, seed=17)
    _check_on_one_expert(problem, mxfp4, packed)


@pytest.mark.parametrize("group_size", [32, 64])
@pytest.mark.parametrize("rows", [2, 3, 5, 6, 7, 9, 11, 13, 15, 23])
def test_int4_rows_per_expert(rows: int, group_size: int) -> None:
    """INT4_W4A8, every token on one expert: row counts around the x86 panel
    kernel's blocks of 8 and 16 lanes, whose last block a level may split into
    blocks of fewer rows, each with its own steps of K a line, or keep whole."""
    int4 = ALL_METHODS["int4"]
    problem = make_moe_problem(rows, 192, 128, 2, 1, torch.bfloat16, int4, seed=19, group_size=group_size)
    _check_on_one_expert(problem, int4, packed=False)


@EVERY_METHOD
@BOTH_LAYOUTS
def test_prefill_rows(method: int, packed: bool) -> None:
    """Enough rows per expert for tile-matrix paths, with partial row and column
    blocks (37 tokens over 2 experts, N = 40)."""
    problem = make_moe_problem(37, *_fit(method, 256, 40), 2, 2, torch.bfloat16, method, seed=13)
    expected = problem.run(reference.fused_experts)
    actual = moe_xarch.fused_experts(**problem.kwargs(packed=packed))
    assert_matches_reference(actual, expected, method, torch.bfloat16)


@EVERY_METHOD
@BOTH_LAYOUTS
@pytest.mark.parametrize("tokens", [1, 16])
def test_each_call_multiplies_its_own_rows(method: int, packed: bool, tokens: int, on_threads) -> None:
    """Kernels prepare rows of activations once for all the work items of a
    thread's share that multiply them (core/scratch.h's prepared rows), never
    across shares. On 2 threads, one expert whose W1 is one work item and W2 is
    four: a thread that takes no W1 item in a later call meets, in its W2
    items, rows at the address where an earlier call's lay. Each call matches
    the reference for its own hidden states, with one row of a (the one-row
    kernels) and 16 (panels and tiles)."""
    problem = make_moe_problem(tokens, *_fit(method, 256, 32), 1, 1, torch.bfloat16, method, seed=15)
    first = problem.arguments["hidden_states"]
    second = torch.randn(first.shape, generator=torch.Generator().manual_seed(16)).to(first.dtype)
    calls = (first, second) * 3  # buffers land where an earlier call's did on some calls, not on all
    actual = on_threads(2, lambda: [moe_xarch.fused_experts(**problem.kwargs(packed=packed, hidden_states=x.clone()))
                                    for x in calls])
    for x, result in zip(calls, actual):
        expected = problem.run(reference.fused_experts, hidden_states=x)
        assert_matches_reference(result, expected, method, torch.bfloat16)


@EVERY_METHOD
@pytest.mark.parametrize("activation", ["silu", "swiglu_limit"])
@pytest.mark.parametrize("tokens", [1, 37])
def test_activation_saturates(method: int, activation: str, tokens: int) -> None:
    """Gate values far past the range where e^-gate over- or underflows (w1
    biases of +-200), through every row loop a level builds: saturated, never
    inf or NaN. w2 is scaled down as much, so the output stays O(1) and the
    usual tolerance applies."""
    problem = make_moe_problem(tokens, *_fit(method, 128, 40), 2, 2, torch.float32, method, bias=True,
                               activation=activation, seed=14)
    signs = torch.randint(0, 2, problem.arguments["w1_bias"].shape, generator=torch.Generator().manual_seed(14))
    w2_factor = "w2" if method == MoeCompMethod.UNQUANT else "w2_scale"
    w2 = problem.arguments[w2_factor]
    # MXFP4's scales are exponents: 2^-8 instead.
    w2 = w2 - 8 if method == MoeCompMethod.MXFP4 else w2 / 200
    overrides = {"w1_bias": 200.0 * (2 * signs - 1).float(), w2_factor: w2}
    expected = problem.run(reference.fused_experts, **overrides)
    actual = moe_xarch.fused_experts(**problem.kwargs(**overrides))
    assert_matches_reference(actual, expected, method, torch.float32)


@EVERY_METHOD
@pytest.mark.parametrize("threads", [2, 3])
def test_parallel_matches_reference(method: int, threads: int, on_threads) -> None:
    """With ATen threads on (the suite otherwise runs single-threaded), work split
    across threads gives the same answer, to the bit: every output value is
    computed by one work item, and slots are summed in a fixed order."""
    problem = make_moe_problem(67, *_fit(method, 72, 40), 8, 3, torch.bfloat16, method, bias=True, seed=11)
    expected = problem.run(reference.fused_experts)
    serial = moe_xarch.fused_experts(**problem.kwargs())
    parallel = on_threads(threads, lambda: moe_xarch.fused_experts(**problem.kwargs()))
    assert_matches_reference(parallel, expected, method, torch.bfloat16)
    assert torch.equal(parallel, serial)


@EVERY_METHOD
def test_experts_add_in_turn(method: int, on_threads) -> None:
    """One block of output columns, so every second-GEMM item adds into the
    same columns: expert 0 has every token and the others a third of them, so
    on 2 threads expert 1's item ends its GEMM while expert 0's still runs. It
    waits for the block's turn of its expert: every call is the same bytes as
    the serial one."""
    tokens, topk = 128, 6
    problem = make_moe_problem(tokens, *_fit(method, 64, 2048), 16, topk, torch.bfloat16, method, bias=True, seed=15)
    ids = [[0] + [(t + j) % 15 + 1 for j in range(0, 15, 3)] for t in range(tokens)]
    overrides = {"topk_ids": torch.tensor(ids, dtype=torch.int32)}
    expected = problem.run(reference.fused_experts, **overrides)
    serial = moe_xarch.fused_experts(**problem.kwargs(**overrides))
    calls = on_threads(2, lambda: [moe_xarch.fused_experts(**problem.kwargs(**overrides)) for _ in range(10)])
    assert_matches_reference(serial, expected, method, torch.bfloat16)
    for parallel in calls:
        assert torch.equal(parallel, serial)


@EVERY_METHOD
@BOTH_LAYOUTS
def test_many_threads_narrow_the_items_alike(method: int, packed: bool, on_threads) -> None:
    """64 threads (whatever the machine has) narrow the work items of both
    phases from 128 columns to 64, so that each thread has more to choose
    from; each output value is still computed as one thread computes it, to
    the bit. Most experts get one row, where the line kernels' order of sums
    depends on how many columns they take at a time (so would a narrower item)."""
    problem = make_moe_problem(16, 512, 512, 32, 2, torch.bfloat16, method, bias=True, seed=12)
    expected = problem.run(reference.fused_experts)
    serial = moe_xarch.fused_experts(**problem.kwargs(packed=packed))
    parallel = on_threads(64, lambda: moe_xarch.fused_experts(**problem.kwargs(packed=packed)))
    assert_matches_reference(parallel, expected, method, torch.bfloat16)
    assert torch.equal(parallel, serial)


@pytest.mark.parametrize("method", METHODS.values(), ids=METHODS.keys())  # 4-bit weights pack as rows
@pytest.mark.parametrize("tokens", [1, 3, 37])
def test_packed_tile_layout(method: int, tokens: int) -> None:
    """Row counts that are multiples of 32, which the levels with a tile layout
    pack in it (avx512_bf16 and amx: read in place by AVX-512, and by AMX tiles
    from 4 rows; i8mm: row pairs, by MMLA from one row), with K padded (200 ->
    256) and both activations' row orders."""
    for activation in ("silu", "swiglu"):
        problem = make_moe_problem(tokens, 224, 48, 4, 2, torch.bfloat16, method, activation=activation,
                                   bias=True, seed=14)
        expected = problem.run(reference.fused_experts)
        actual = moe_xarch.fused_experts(**problem.kwargs(packed=True))
        assert_matches_reference(actual, expected, method, torch.bfloat16)


# The weights' dtype of each of level_runner's packed methods (its activations are bf16),
# as TILE_LAYOUTS names it.
PACKED_WEIGHTS = {"unquant": "bf16", "int8": "int8", "fp8": "fp8", "int4": "int4"}


@pytest.mark.forces_levels
@pytest.mark.parametrize("method", list(level_runner.PACKED_METHODS))
def test_weights_packed_under_one_level_run_or_are_refused_under_another(method: str, forced_levels) -> None:
    """Weights packed under the best level give the reference's answer under every
    level, or are refused by name - never misread. A level with a tile layout
    packs the weights it applies to in it (TILE_LAYOUTS), and levels that read
    another layout must refuse them."""
    levels = moe_xarch.supported_isas()
    weights = PACKED_WEIGHTS[method]
    packed_in = TILE_LAYOUTS.get(levels[-1], {}).get(weights)
    for level in levels:
        run = forced_levels[level]
        assert method in run.outcomes, (level, run.failure())
        outcome = run.outcomes[method]
        if packed_in and TILE_LAYOUTS.get(level, {}).get(weights) != packed_in:
            assert f"was packed in {packed_in}" in outcome, (level, outcome)
        else:
            assert outcome == level_runner.SAME_ANSWER, (level, outcome)


@BOTH_LAYOUTS
@pytest.mark.parametrize("tokens", [1, 37])
def test_fp8_every_value(packed: bool, tokens: int) -> None:
    """Every finite e4m3 value, both zeros and the subnormals among them: each
    16-row block of weights takes one exponent (block i: exponent i % 16) with
    random signs and mantissas, and a scale of 2^(3 - exponent) that brings every
    block to the same magnitude (about 1 / sqrt(K)), so a wrong subnormal shows. Through the
    in-register widening (one token) and the widened tiles (37 tokens)."""
    fp8 = METHODS["fp8"]
    block_size = (16, 64)
    problem = make_moe_problem(tokens, 256, 64, 2, 2, torch.bfloat16, fp8, seed=14, block_size=block_size)
    generator = torch.Generator().manual_seed(14)
    weights = {}
    for name in ("w1", "w2"):
        experts, rows, cols = problem.arguments[name].shape
        exponent = (torch.arange(rows) // block_size[0] % 16).view(1, rows, 1)
        bits = torch.randint(0, 256, (experts, rows, cols), generator=generator) & 0x87 | exponent << 3
        bits = torch.where(bits & 0x7F == 0x7F, bits - 1, bits)  # not the NaN pattern
        weights[name] = bits.to(torch.uint8).view(torch.float8_e4m3fn)
        scale_exponent = torch.arange(problem.arguments[f"{name}_scale"].shape[1]) % 16
        weights[f"{name}_scale"] = torch.exp2(3 - scale_exponent.float()).view(1, -1, 1).expand_as(
            problem.arguments[f"{name}_scale"]).contiguous()
    expected = problem.run(reference.fused_experts, **weights)
    if packed:
        weights.update({name: moe_xarch.convert_weight_packed(weights[name], fp8) for name in ("w1", "w2")})
    actual = moe_xarch.fused_experts(**problem.kwargs(**weights, is_vnni=packed))
    assert_matches_reference(actual, expected, fp8, torch.bfloat16)


@BOTH_LAYOUTS
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("tokens", [1, 4, 37, 300])
def test_fp8_nan_weights(packed: bool, dtype: str, tokens: int) -> None:
    """The e4m3 NaN patterns (0x7f, 0xff; e4m3fn has no inf) read as NaN on every
    path: one in W1 of the last token's expert makes its tokens' rows NaN (every
    column of their intermediate meets it in W2), one in W2 of the first token's
    expert one column of its tokens' rows. Tokens cover the in-register
    widening, the widened tiles, and experts with more rows than one token
    chunk; fp32 inputs widen to fp32."""
    fp8 = METHODS["fp8"]
    problem = make_moe_problem(tokens, 256, 64, 4, 2, DTYPES[dtype], fp8, seed=15, block_size=(16, 64))
    ids = problem.arguments["topk_ids"]
    weights = {name: problem.arguments[name].clone() for name in ("w1", "w2")}
    for name, token, row, col, bits in (("w1", -1, 5, 100, 0x7F), ("w2", 0, 70, 3, 0xFF)):
        expert = int(ids[token][ids[token] >= 0][0])
        weights[name].view(torch.uint8)[expert, row, col] = bits
    expected = problem.run(reference.fused_experts, **weights)
    assert expected.isnan().any()
    if packed:
        weights = {name: moe_xarch.convert_weight_packed(weights[name], fp8) for name in ("w1", "w2")}
    actual = moe_xarch.fused_experts(**problem.kwargs(**weights, is_vnni=packed))
    assert torch.equal(actual.isnan(), expected.isnan())
    finite = ~expected.isnan()
    assert_matches_reference(actual[finite], expected[finite], fp8, DTYPES[dtype])
