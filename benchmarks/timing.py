"""How calls are timed: interleaved call by call in one process, routing r = iteration % ROUTINGS.

The machine is shared and noisy, so every contender of one (shape, M) takes its
turn in every iteration, and a comparison is a ratio of medians.
One warm-up iteration (untimed) sizes a run: as many iterations as fit the
budget, within [min_iterations, max_iterations].
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from benchmarks.workload import ROUTINGS


@dataclass(frozen=True)
class Key:
    impl: str  # moe_xarch, sglang, torch, memory
    method: str  # for torch: the dtype it computes in; for memory: the method whose bytes are read
    threads: int


def iterations_for(per_iteration_s: float, budget_s: float, min_iterations: int, max_iterations: int) -> int:
    return int(min(max_iterations, max(min_iterations, budget_s / max(per_iteration_s, 1e-6))))


def time_interleaved(contenders: dict[Key, Callable[[int], object]], budget_s: float, min_iterations: int,
                     max_iterations: int) -> tuple[dict[Key, list[float]], int]:
    """Milliseconds per call of each contender, in the dict's order every iteration, each at its key's thread
    count (switched between calls)."""
    def one_iteration(iteration: int, samples: dict[Key, list[float]] | None) -> None:
        for key, fn in contenders.items():
            if torch.get_num_threads() != key.threads:
                torch.set_num_threads(key.threads)
            start = time.perf_counter()
            fn(iteration % ROUTINGS)
            elapsed = time.perf_counter() - start
            if samples is not None:
                samples[key].append(elapsed * 1e3)

    start = time.perf_counter()
    one_iteration(ROUTINGS - 1, None)
    iterations = iterations_for(time.perf_counter() - start, budget_s, min_iterations, max_iterations)
    samples: dict[Key, list[float]] = {key: [] for key in contenders}
    for iteration in range(iterations):
        one_iteration(iteration, samples)
    return samples, iterations


def time_pairs(calls: dict[str, tuple[Callable[[int], object], Callable[[int], object]]], budget_s: float,
               min_iterations: int, max_iterations: int) -> tuple[dict[str, tuple[list[float], list[float]]], int]:
    """Milliseconds per call of each of two builds, per method; the build that goes first alternates every
    iteration, so neither always runs right after the other's weights."""
    def one(fn: Callable[[int], object], r: int) -> float:
        start = time.perf_counter()
        fn(r)
        return (time.perf_counter() - start) * 1e3

    start = time.perf_counter()
    for this, base in calls.values():
        one(this, ROUTINGS - 1), one(base, ROUTINGS - 1)
    iterations = iterations_for(time.perf_counter() - start, budget_s, min_iterations, max_iterations)
    samples: dict[str, tuple[list[float], list[float]]] = {method: ([], []) for method in calls}
    for iteration in range(iterations):
        r = iteration % ROUTINGS
        for method, (this, base) in calls.items():
            if iteration % 2:
                b = one(base, r)
                a = one(this, r)
            else:
                a = one(this, r)
                b = one(base, r)
            samples[method][0].append(a)
            samples[method][1].append(b)
    return samples, iterations


def medians(samples: dict[Key, list[float]]) -> dict[Key, float]:
    return {key: statistics.median(values) for key, values in samples.items()}


def quartiles(values: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]
