"""The op inside PyTorch's machinery: opcheck (schema, fake tensor, autograd
registration, AOT dispatch) and torch.compile."""

from __future__ import annotations

import pytest
import torch

import moe_xarch
from moe_xarch import reference
from moe_xarch.testing import (
    assert_matches_reference,
    make_moe_problem,
    sample_problems,
    schema_args,
)

PROBLEMS = dict(sample_problems())
OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _opcheck(op: torch._ops.OpOverload, args: tuple) -> None:
    # test_schema compares inputs before and after with allclose, which float8
    # lacks on CPU; the other checks run on every sample.
    has_fp8 = any(isinstance(a, torch.Tensor) and a.dtype == torch.float8_e4m3fn for a in args)
    torch.library.opcheck(op, args, test_utils=OPCHECK_TESTS[1:] if has_fp8 else OPCHECK_TESTS)


# inplace=True writes into an argument the schema does not mark as mutated, which
# opcheck's schema test rightly flags; the contract's schema is what it is.
@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
@pytest.mark.parametrize("name", PROBLEMS)
def test_opcheck_fused_experts(name: str, packed: bool) -> None:
    op = torch.ops.moe_xarch.fused_experts_cpu.default
    kwargs = PROBLEMS[name].kwargs(packed=packed, inplace=False)
    _opcheck(op, schema_args(op, kwargs))


@pytest.mark.parametrize("name", PROBLEMS)
def test_opcheck_convert_weight_packed(name: str) -> None:
    problem = PROBLEMS[name]
    _opcheck(
        torch.ops.moe_xarch.convert_weight_packed.default,
        (problem.arguments["w1"], problem.moe_comp_method),
    )


def test_torch_compile_fullgraph() -> None:
    problem = make_moe_problem(5, 64, 32, 4, 2, torch.bfloat16, bias=True, activation="swiglu")

    @torch.compile(fullgraph=True, backend="eager")
    def moe_layer(**kwargs) -> torch.Tensor:
        return moe_xarch.fused_experts(**kwargs) * 2

    actual = moe_layer(**problem.kwargs())
    expected = problem.run(reference.fused_experts) * 2
    assert_matches_reference(actual, expected, moe_xarch.MoeCompMethod.UNQUANT, torch.bfloat16)


def test_profiler_names_each_phase_once_per_call() -> None:
    problem = make_moe_problem(5, 64, 32, 4, 2, torch.bfloat16)
    phases = ["moe_xarch::route", "moe_xarch::gather", "moe_xarch::experts", "moe_xarch::cast_output"]
    calls = 2
    # acc_events: without it, torch 2.10 warns on start that each cycle clears its events.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], acc_events=True) as profile:
        for _ in range(calls):
            moe_xarch.fused_experts(**problem.kwargs())
    counts = {event.key: event.count for event in profile.key_averages()}
    assert {phase: counts.get(phase, 0) for phase in phases} == {phase: calls for phase in phases}


def _on_meta(kwargs: dict) -> dict:
    return {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


FOUR_BIT_PROBLEMS = {name: problem for name, problem in PROBLEMS.items()
                     if problem.moe_comp_method in (moe_xarch.MoeCompMethod.INT4_W4A8, moe_xarch.MoeCompMethod.MXFP4)}


@pytest.mark.level_independent  # meta tensors: the fake kernel, Python
@pytest.mark.parametrize("name", FOUR_BIT_PROBLEMS)
def test_fake_kernel_of_4bit_methods_gives_the_output_under_torch_compile(name: str) -> None:
    """The wrapper and the fake kernel trace the 4-bit methods whole (fullgraph),
    given meta tensors as torch.compile's fake tensors are."""
    kwargs = _on_meta(FOUR_BIT_PROBLEMS[name].kwargs(block_size=None))

    @torch.compile(fullgraph=True, backend="eager")
    def moe_layer(**kwargs) -> torch.Tensor:
        return moe_xarch.fused_experts(**kwargs) * 2

    out = moe_layer(**kwargs)
    assert out.device.type == "meta" and out.shape == kwargs["hidden_states"].shape
    assert out.dtype == kwargs["hidden_states"].dtype


def _meta_u8(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.uint8, device="meta")


INT4, MXFP4 = moe_xarch.MoeCompMethod.INT4_W4A8, moe_xarch.MoeCompMethod.MXFP4
E, K, N = 4, 64, 32
# The CPU op's 4-bit shape and dtype checks, as the fake kernel must make them too.
FAKE_BAD_INPUTS = [
    ("odd-K", INT4, {"hidden_states": torch.zeros(3, 63, dtype=torch.bfloat16, device="meta")}, "hidden_states"),
    ("w1-int8", INT4, {"w1": torch.zeros(E, 2 * N, K // 2, dtype=torch.int8, device="meta")}, "w1"),
    ("w1-unpacked-K", MXFP4, {"w1": _meta_u8(E, 2 * N, K)}, "w1"),
    ("w2-shape", INT4, {"w2": _meta_u8(E, K, N)}, "w2"),
    ("int4-scale-missing", INT4, {"w1_scale": None}, "w1_scale"),
    ("int4-scale-bf16", INT4, {"w2_scale": torch.ones(E, K, 1, dtype=torch.bfloat16, device="meta")}, "w2_scale"),
    ("int4-scale-rows", INT4, {"w1_scale": torch.ones(E, N, 2, device="meta")}, "w1_scale"),
    ("int4-groups-not-dividing", INT4, {"w1_scale": torch.ones(E, 2 * N, 3, device="meta")}, "w1_scale"),
    ("int4-group-16", INT4, {"w1_scale": torch.ones(E, 2 * N, 4, device="meta"),
                             "w1_zero": _meta_u8(E, 2 * N, 4)}, "w1_scale"),
    ("int4-zero-int32", INT4, {"w2_zero": torch.zeros(E, K, 1, dtype=torch.int32, device="meta")}, "w2_zero"),
    ("int4-zero-shape", INT4, {"w1_zero": _meta_u8(E, 2 * N, 1)}, "w1_zero"),
    ("int4-block_size", INT4, {"block_size": [1, 64]}, "block_size"),
    ("mxfp4-scale-float", MXFP4, {"w1_scale": torch.ones(E, 2 * N, 2, device="meta")}, "w1_scale"),
    ("mxfp4-scale-shape", MXFP4, {"w2_scale": _meta_u8(E, K, 2)}, "w2_scale"),
    ("mxfp4-K-48", MXFP4, {"hidden_states": torch.zeros(3, 48, device="meta"), "w1": _meta_u8(E, 2 * N, 24),
                           "w1_scale": _meta_u8(E, 2 * N, 1), "w2": _meta_u8(E, 48, N // 2)}, "w1"),
    ("mxfp4-zero", MXFP4, {"w1_zero": _meta_u8(E, 2 * N, 2)}, "w1_zero"),
    ("mxfp4-block_size", MXFP4, {"block_size": [32, 32]}, "block_size"),
]


@pytest.mark.level_independent
@pytest.mark.parametrize("method, overrides, names", [case[1:] for case in FAKE_BAD_INPUTS],
                         ids=[case[0] for case in FAKE_BAD_INPUTS])
def test_fake_kernel_refuses_bad_4bit_inputs_by_name(method: int, overrides: dict, names: str) -> None:
    dtype = torch.float32 if method == MXFP4 else torch.bfloat16
    kwargs = _on_meta(make_moe_problem(3, K, N, E, 2, dtype, method).kwargs()) | overrides
    with pytest.raises(RuntimeError, match=rf"^fused_experts_cpu: .*\b{names}\b"):
        moe_xarch.fused_experts(**kwargs)


@pytest.mark.level_independent
@pytest.mark.parametrize("method", [INT4, MXFP4], ids=lambda m: m.name)
def test_fake_kernel_of_packed_4bit_weights_reads_n_from_the_scales(method: int) -> None:
    kwargs = _on_meta(make_moe_problem(3, K, N, E, 2, torch.float32, method).kwargs())
    packed = {"w1": _meta_u8(E, 4096), "w2": _meta_u8(E, 4096), "is_vnni": True}
    assert moe_xarch.fused_experts(**kwargs | packed).shape == (3, K)
    short = kwargs["w2_scale"][:, :, :0]
    with pytest.raises(RuntimeError, match=r"\bw2_scale\b"):
        moe_xarch.fused_experts(**kwargs | packed | {"w2_scale": short})
