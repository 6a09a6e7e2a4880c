"""The interleaved timing loops, on calls that only record what they were asked: order, routings, threads, counts."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("moe_xarch")

from benchmarks import timing  # noqa: E402
from benchmarks.workload import ROUTINGS  # noqa: E402


@pytest.fixture(autouse=True)
def threads_back() -> None:
    yield
    torch.set_num_threads(1)


def test_iterations_fill_the_budget_within_the_bounds() -> None:
    assert timing.iterations_for(0.5, budget_s=10, min_iterations=5, max_iterations=100) == 20
    assert timing.iterations_for(0.5, budget_s=0, min_iterations=5, max_iterations=100) == 5
    assert timing.iterations_for(0.0, budget_s=10, min_iterations=5, max_iterations=100) == 100


def test_every_contender_takes_its_turn_each_iteration_at_its_thread_count() -> None:
    seen = []

    def recorder(name: str):
        return lambda r: seen.append((name, r, torch.get_num_threads()))

    keys = [timing.Key("moe_xarch", "int8", 1), timing.Key("torch", "bf16", 1), timing.Key("moe_xarch", "int8", 2)]
    samples, iterations = timing.time_interleaved({key: recorder(key.impl + str(key.threads)) for key in keys},
                                                  budget_s=0, min_iterations=ROUTINGS + 1, max_iterations=100)
    assert iterations == ROUTINGS + 1
    assert {key: len(values) for key, values in samples.items()} == dict.fromkeys(keys, iterations)
    assert all(value >= 0 for values in samples.values() for value in values)
    names = ["moe_xarch1", "torch1", "moe_xarch2"]
    # The untimed warm-up takes the last routing; then routing r = iteration % ROUTINGS, every contender in turn.
    expected = [(name, ROUTINGS - 1) for name in names]
    expected += [(name, i % ROUTINGS) for i in range(iterations) for name in names]
    assert [(name, r) for name, r, _ in seen] == expected
    assert {(name, threads) for name, _, threads in seen} == {("moe_xarch1", 1), ("torch1", 1), ("moe_xarch2", 2)}


def test_the_build_that_goes_first_alternates() -> None:
    order = []
    calls = {"int8": (lambda r: order.append(("this", r)), lambda r: order.append(("baseline", r)))}
    samples, iterations = timing.time_pairs(calls, budget_s=0, min_iterations=3, max_iterations=10)
    assert iterations == 3 and [len(s) for s in samples["int8"]] == [3, 3]
    assert order == [("this", ROUTINGS - 1), ("baseline", ROUTINGS - 1),  # the warm-up
                     ("this", 0), ("baseline", 0), ("baseline", 1), ("this", 1), ("this", 2), ("baseline", 2)]


def test_medians_and_quartiles() -> None:
    key = timing.Key("torch", "bf16", 1)
    assert timing.medians({key: [3.0, 1.0, 2.0]}) == {key: 2.0}
    assert timing.quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (1.5, 4.5)
