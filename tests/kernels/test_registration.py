"""What the compiled library registers: op schemas, Python signatures, the ISA path."""

from __future__ import annotations

import inspect
import os

import pytest
import torch

import moe_xarch
from moe_xarch import reference

NAMESPACE = "moe_xarch"
# The op contract's seventeen arguments, in order. The last four came last: a
# schema with the older thirteen is exactly the defect this project exists to catch.
SPEC_FUSED_EXPERTS_ARGUMENTS = [
    "hidden_states", "w1", "w2", "topk_weights", "topk_ids", "inplace",
    "moe_comp_method", "w1_scale", "w2_scale", "w1_zero", "w2_zero", "block_size",
    "w1_bias", "w2_bias", "alpha", "limit", "is_vnni",
]  # fmt: skip


def _schema_of(name: str) -> torch._C.FunctionSchema:
    return getattr(torch.ops.moe_xarch, name).default._schema


@pytest.mark.level_independent
def test_registered_ops_are_the_canonical_ones() -> None:
    prefix = f"{NAMESPACE}::"
    registered = {
        name.removeprefix(prefix).split(".")[0]
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith(prefix)
    }
    assert registered == set(moe_xarch.SCHEMAS)


@pytest.mark.level_independent
@pytest.mark.parametrize("name", sorted(moe_xarch.SCHEMAS))
def test_schema_equals_canonical_string(name: str) -> None:
    canonical = torch._C.parse_schema(f"{NAMESPACE}::{moe_xarch.SCHEMAS[name]}")
    assert str(_schema_of(name)) == str(canonical)


@pytest.mark.level_independent
def test_fused_experts_schema_has_the_spec_arguments() -> None:
    names = [arg.name for arg in _schema_of("fused_experts_cpu").arguments]
    assert names == SPEC_FUSED_EXPERTS_ARGUMENTS


@pytest.mark.level_independent
@pytest.mark.parametrize(
    "function", [moe_xarch.fused_experts, reference.fused_experts], ids=["wrapper", "reference"]
)
def test_python_signature_maps_onto_schema(function) -> None:
    assert list(inspect.signature(function).parameters) == SPEC_FUSED_EXPERTS_ARGUMENTS


def test_isa_is_supported_and_generic_comes_first() -> None:
    supported = moe_xarch.supported_isas()
    assert supported[0] == "generic"
    assert moe_xarch.isa() in supported
    assert len(set(supported)) == len(supported)


def test_isa_is_the_one_expected() -> None:
    """The harness names the path this CPU (model) must pick in MOE_XARCH_EXPECT_ISA;
    otherwise the path is the forced one, or the highest this CPU supports."""
    expected = (
        os.environ.get("MOE_XARCH_EXPECT_ISA")
        or os.environ.get("MOE_XARCH_ISA")
        or moe_xarch.supported_isas()[-1]
    )
    assert moe_xarch.isa() == expected


@pytest.mark.forces_levels
def test_every_supported_isa_can_be_forced(forced_levels) -> None:
    for level in moe_xarch.supported_isas():
        run = forced_levels[level]
        assert run.isa == level, (level, run.isa, run.failure())


@pytest.mark.forces_levels
def test_unknown_isa_is_refused_with_the_choices(forced_levels) -> None:
    run = forced_levels["no-such-level"]
    assert run.isa is None and run.exit not in (0, None), (run.isa, run.failure())
    assert "MOE_XARCH_ISA=no-such-level names no kernel path" in run.stderr
    assert "generic" in run.stderr
