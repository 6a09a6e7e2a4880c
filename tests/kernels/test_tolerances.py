"""The comparison every test applies is the contract's, on every run.

The contract promises one tolerance per (method, dtype) on every architecture.
These tests run on every run, unmarked, because the comparison could be loosened
under one architecture, CPU model or level alone (a branch on platform.machine()
or moe_xarch.isa()): on each run, an error just over the contract's tolerance must
fail the comparison and one just under must pass, and the comparison records the
tolerance it applied, which the matrix's verdict (harness/plan/verdict.py) proves the
same on every run.
"""

from __future__ import annotations

import pytest
import torch

from moe_xarch import MoeCompMethod
from moe_xarch.testing import (
    DTYPE_TOLERANCE,
    Tolerance,
    applied_tolerances,
    assert_matches_reference,
    tolerance,
    tolerance_key,
)

# The contract's table (fused_experts_cpu.md, "Every architecture, the same answers"),
# written out here so that a change to moe_xarch.testing's own table fails.
SPEC_DTYPE_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}
SPEC_INT8_ACTIVATION_TOLERANCE = 3e-2  # relative to the output's scale, max|reference|
INT8_ACTIVATION = (MoeCompMethod.INT8_W8A8, MoeCompMethod.INT4_W4A8)
# How far over and under the tolerance the errors are: far beyond float64's rounding,
# far below a loosening worth making.
MARGIN = 0.01
CASES = [pytest.param(method, dtype, id=tolerance_key(method, dtype))
         for method in MoeCompMethod for dtype in SPEC_DTYPE_TOLERANCE]


def spec_tolerance(method: MoeCompMethod, dtype: torch.dtype) -> Tolerance:
    if method in INT8_ACTIVATION:
        return Tolerance(SPEC_INT8_ACTIVATION_TOLERANCE, SPEC_INT8_ACTIVATION_TOLERANCE, relative_to_output_scale=True)
    return Tolerance(SPEC_DTYPE_TOLERANCE[dtype], SPEC_DTYPE_TOLERANCE[dtype])


def test_tolerances_are_the_spec_ones() -> None:
    assert DTYPE_TOLERANCE == SPEC_DTYPE_TOLERANCE
    for method in MoeCompMethod:
        for dtype in SPEC_DTYPE_TOLERANCE:
            assert tolerance(method, dtype) == spec_tolerance(method, dtype), tolerance_key(method, dtype)


@pytest.mark.parametrize("method, dtype", CASES)
@pytest.mark.parametrize("where", ["zero", "largest"])
def test_the_comparison_rejects_just_over_the_tolerance_and_accepts_just_under(
        method: MoeCompMethod, dtype: torch.dtype, where: str) -> None:
    """One output value off by (1 +- MARGIN) times what the contract allows there:
    where the reference is 0 (the absolute part; for the int8-activation methods,
    relative to the output's scale) and at its largest value (plus the relative
    part). float64 tensors: the error is exact; ``dtype`` only picks the tolerance."""
    spec = spec_tolerance(method, dtype)
    expected = torch.tensor([4.0, -1.0, 0.0, 0.5], dtype=torch.float64)
    index = 2 if where == "zero" else 0
    scale = expected.abs().max().item() if spec.relative_to_output_scale else 1.0
    allowed = spec.atol * scale + spec.rtol * expected[index].abs().item()
    for factor, accepted in ((1 - MARGIN, True), (1 + MARGIN, False)):
        actual = expected.clone()
        actual[index] += factor * allowed
        if accepted:
            assert_matches_reference(actual, expected, method, dtype)
        else:
            with pytest.raises(AssertionError):
                assert_matches_reference(actual, expected, method, dtype)


@pytest.mark.parametrize("method, dtype", CASES)
def test_the_comparison_records_the_tolerance_it_applied(method: MoeCompMethod, dtype: torch.dtype) -> None:
    """What the run's record (tolerances-<pid>.json) says of the (method, dtype): the contract's."""
    value = torch.ones(3, dtype=torch.float64)
    assert_matches_reference(value, value, method, dtype)
    spec = spec_tolerance(method, dtype)
    assert applied_tolerances()[tolerance_key(method, dtype)] == {
        "rtol": spec.rtol, "atol": spec.atol, "relative_to_output_scale": spec.relative_to_output_scale}
