"""The test support module: tolerances, problem builder, covering arrays."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from moe_xarch import MoeCompMethod, reference
from moe_xarch.testing import assert_matches_reference, covering_array, make_moe_problem

FACTORS = {"a": [0, 1, 2, 3], "b": "xyz", "c": "uvw", "d": [True, False], "e": [1, 2], "f": "pq"}

pytestmark = pytest.mark.level_independent  # the Python test helpers


@pytest.mark.parametrize("strength", [1, 2, 3])
def test_covering_array_covers_every_combination(strength: int) -> None:
    rows = covering_array(FACTORS, strength)
    for group in itertools.combinations(FACTORS, strength):
        covered = {tuple(row[name] for name in group) for row in rows}
        assert len(covered) == math.prod(len(FACTORS[name]) for name in group), group
    assert len(rows) < math.prod(map(len, FACTORS.values()))


def test_covering_array_of_full_strength_is_the_product() -> None:
    rows = covering_array(FACTORS, len(FACTORS))
    assert len(rows) == len({tuple(row.values()) for row in rows}) == math.prod(map(len, FACTORS.values()))


def test_int8_tolerance_scales_with_the_output() -> None:
    expected = torch.tensor([100.0, 0.0])
    assert_matches_reference(torch.tensor([100.0, 2.9]), expected, MoeCompMethod.INT8_W8A8, torch.float32)
    with pytest.raises(AssertionError):
        assert_matches_reference(torch.tensor([100.0, 3.1]), expected, MoeCompMethod.INT8_W8A8, torch.float32)


@pytest.mark.parametrize("method", list(reference.IMPLEMENTED_METHODS), ids=lambda m: m.name)
def test_problem_routing_and_weights(method: MoeCompMethod) -> None:
    M, K, N, E, topk = 200, 64, 32, 6, 3
    problem = make_moe_problem(M, K, N, E, topk, torch.float16, method, bias=True)
    a = problem.arguments
    ids = a["topk_ids"]
    assert ids.dtype == torch.int32 and ids.shape == (M, topk)
    assert (ids < E).all() and (ids >= -1).all() and (ids == -1).any()
    assert (ids >= 0).any(dim=1).all(), "every token keeps at least one expert"
    for row in ids.tolist():
        used = [e for e in row if e >= 0]
        assert len(used) == len(set(used))
    assert torch.allclose(a["topk_weights"].sum(dim=1), torch.ones(M))
    weight_dtype = {
        MoeCompMethod.UNQUANT: torch.float16,
        MoeCompMethod.INT8_W8A8: torch.int8,
        MoeCompMethod.FP8_W8A16: torch.float8_e4m3fn,
        MoeCompMethod.INT4_W4A8: torch.uint8,
        MoeCompMethod.MXFP4: torch.uint8,
    }[method]
    assert a["w1"].dtype == a["w2"].dtype == weight_dtype
    per_byte = 2 if weight_dtype == torch.uint8 else 1
    assert a["w1"].shape == (E, 2 * N, K // per_byte) and a["w2"].shape == (E, K, N // per_byte)
    assert a["w1_bias"].shape == (E, 2 * N) and a["w2_bias"].shape == (E, K)


def test_problem_is_reproducible_and_kwargs_are_fresh() -> None:
    first, second = (make_moe_problem(4, 32, 16, 4, 2, seed=1) for _ in range(2))
    assert all(torch.equal(first.arguments[k], second.arguments[k]) for k in ("hidden_states", "w1", "topk_ids"))
    assert first.kwargs()["hidden_states"] is not first.kwargs()["hidden_states"]
