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
    phases = ["moe_xarch::route", "moe_xarch::gather", "moe_xarch::w1_activation",
              "moe_xarch::w2_combine", "moe_xarch::cast_output"]
    calls = 2
    # acc_events: without it, torch 2.10 warns on start that each cycle clears its events.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], acc_events=True) as profile:
        for _ in range(calls):
            moe_xarch.fused_experts(**problem.kwargs())
    counts = {event.key: event.count for event in profile.key_averages()}
    assert {phase: counts.get(phase, 0) for phase in phases} == {phase: calls for phase in phases}
