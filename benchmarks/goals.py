"""The goals the bench's figures are held to, in one table: each names the figure it bounds and its least value.

A goal is judged at the largest thread count measured, on its worst figure; one
with no figure (e.g. SGLang left out) is "not measured".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.results import Result
from benchmarks.workload import FOUR_BIT

Derived = dict[str, list[dict[str, object]]]


@dataclass(frozen=True)
class Figures:
    """What the goals read: the results at `threads` (the largest thread count measured), and the derived ratios."""

    top: list[Result]
    derived: Derived
    threads: int


Figure = Callable[[Figures], list[tuple[str, float]]]  # (where, value) of each case measured


def label(r: Result) -> str:
    return f"{r.shape} {r.method} M={r.tokens}"


def vs_sglang(*methods: str) -> Figure:
    return lambda f: [(label(r), r.speedup_vs_sglang) for r in f.top if r.method in methods and r.speedup_vs_sglang]


def vs_torch(max_tokens: float = float("inf")) -> Figure:
    return lambda f: [(label(r), r.speedup_vs_torch) for r in f.top if r.tokens <= max_tokens]


def of_memory_roofline(methods: tuple[str, ...], max_tokens: int) -> Figure:
    return lambda f: [(label(r), r.achieved_gbs / r.roofline_gbs) for r in f.top
                      if r.method in methods and r.tokens <= max_tokens]


def int8_vs_bf16_at_m1(f: Figures) -> list[tuple[str, float]]:
    return [(f"{d['shape']} M=1", d["ratio"]) for d in f.derived["int8_vs_bf16_decode"]
            if d["tokens"] == 1 and d["threads"] == f.threads]


def four_bit_vs_int8(f: Figures) -> list[tuple[str, float]]:
    return [(f"{d['shape']} {d['method']} M={d['tokens']}", d["ratio"]) for d in f.derived["four_bit_vs_int8_decode"]
            if d["threads"] == f.threads]


def threads_vs_one(f: Figures) -> list[tuple[str, float]]:
    return [(f"{d['shape']} {d['method']} M={d['tokens']}", d["moe_xarch"]) for d in f.derived["threads_scaling"]]


@dataclass(frozen=True)
class Goal:
    name: str
    at_least: float
    figures: Figure

    def judge(self, figures: Figures) -> dict[str, object]:
        """The worst figure and whether it is at least the goal (the JSON's "targets" entry)."""
        cases = self.figures(figures)
        if not cases:
            return {"target": self.name, "goal": self.at_least, "threads": figures.threads, "met": None,
                    "worst": None, "where": "not measured"}
        where, value = min(cases, key=lambda case: case[1])
        return {"target": self.name, "goal": self.at_least, "threads": figures.threads, "met": value >= self.at_least,
                "worst": value, "where": where}


GOALS = (
    Goal("vs SGLang, bf16 and int8, every M", 1.10, vs_sglang("bf16", "int8")),
    Goal("vs SGLang, fp8 where it runs", 1.0, vs_sglang("fp8")),
    Goal("vs torch at M <= 16", 2.0, vs_torch(max_tokens=16)),
    Goal("vs torch, never slower", 1.0, vs_torch()),
    Goal("vs SGLang, int4 and mxfp4 where it runs", 1.10, vs_sglang(*FOUR_BIT)),
    Goal("int8 decode vs bf16 decode (M=1)", 1.7, int8_vs_bf16_at_m1),
    Goal("4-bit decode vs int8 decode (M <= 4)", 1.8, four_bit_vs_int8),
    Goal("4-bit decode of the streaming roofline (M <= 4)", 0.9, of_memory_roofline(FOUR_BIT, max_tokens=4)),
    Goal("2 threads vs 1 thread at M >= 16", 1.8, threads_vs_one),
)


def judge(results: list[Result], derived: Derived) -> list[dict[str, object]]:
    """Every goal of GOALS, in order, at the largest thread count measured."""
    most = max((r.threads for r in results), default=1)
    figures = Figures([r for r in results if r.threads == most], derived, most)
    return [goal.judge(figures) for goal in GOALS]
