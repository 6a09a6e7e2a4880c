"""The bench's figures from made-up medians: rows, derived ratios, the memory read each method shares, the goals."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("moe_xarch")

from benchmarks import goals, rooflines  # noqa: E402
from benchmarks.results import Result, derived_ratios, results_of  # noqa: E402
from benchmarks.timing import Key  # noqa: E402
from benchmarks.workload import MoeShape, expert_bytes, useful_flops  # noqa: E402

SHAPE = MoeShape("s", experts=4, topk=2, hidden=256, inter=128)


def test_methods_of_one_byte_width_share_one_streaming_read_ordered_by_width() -> None:
    read_as = rooflines.read_as(SHAPE, ["bf16", "int8", "fp8", "int4"])
    assert read_as == {"int4": "int4", "int8": "int8", "fp8": "int8", "bf16": "bf16"}
    assert list(read_as) == ["int4", "int8", "fp8", "bf16"]


def test_rows_from_the_medians() -> None:
    medians = {Key("moe_xarch", "int8", 1): 2.0, Key("moe_xarch", "fp8", 1): 4.0, Key("sglang", "int8", 1): 3.0,
               Key("torch", "fp32", 1): 8.0, Key("memory", "int8", 1): 1.0}
    rows = results_of(SHAPE, ["int8", "fp8"], 16, [1], "fp32", {"int8": "int8", "fp8": "int8"}, [2, 4], medians, 7)
    int8, fp8 = rows
    assert (int8.method, int8.tokens, int8.threads, int8.iterations) == ("int8", 16, 1, 7)
    assert int8.median_ms == {"moe_xarch": 2.0, "torch": 8.0, "memory_roofline": 1.0, "sglang": 3.0}
    assert int8.speedup_vs_sglang == 1.5 and int8.speedup_vs_torch == 4.0
    assert int8.active_bytes == 3 * expert_bytes(SHAPE, "int8")  # the mean over the routings' active experts
    assert int8.achieved_gbs == int8.active_bytes / 2.0 / 1e6 and int8.roofline_gbs == int8.active_bytes / 1e6
    assert int8.gflops["torch"] == useful_flops(SHAPE, 16) / 8.0 / 1e6
    assert "sglang" not in fp8.median_ms and fp8.speedup_vs_sglang is None  # not timed: no key
    assert fp8.median_ms["memory_roofline"] == 1.0  # int8's read: the same bytes


def result(method: str, tokens: int, threads: int, ms: float, torch_ms: float = 10.0, sglang_ms: float | None = None,
           shape: str = "s", roofline: float = 0.5) -> Result:
    median = {"moe_xarch": ms, "torch": torch_ms, "memory_roofline": roofline}
    if sglang_ms is not None:
        median["sglang"] = sglang_ms
    return Result(shape, method, tokens, threads, 3, median, sglang_ms / ms if sglang_ms else None, torch_ms / ms,
                  1e6, 1e6 / ms / 1e6, 1e6 / roofline / 1e6, {})


def test_derived_ratios_pair_decode_methods_and_thread_counts() -> None:
    results = [result("bf16", 1, 1, 4.0), result("int8", 1, 1, 2.0), result("int4", 1, 1, 1.0),
               result("int8", 16, 1, 8.0), result("int8", 16, 2, 5.0), result("int8", 128, 1, 9.0)]
    derived = derived_ratios(results)
    assert derived["int8_vs_bf16_decode"] == [{"shape": "s", "method": "int8", "tokens": 1, "threads": 1,
                                               "ratio": 2.0}]
    assert derived["four_bit_vs_int8_decode"] == [{"shape": "s", "method": "int4", "tokens": 1, "threads": 1,
                                                   "ratio": 2.0}]
    assert derived["threads_scaling"] == [{"shape": "s", "method": "int8", "tokens": 16, "threads": 2,
                                           "moe_xarch": 1.6, "memory_roofline": 1.0}]


def test_goals_are_one_table_with_a_name_each() -> None:
    names = [goal.name for goal in goals.GOALS]
    assert len(set(names)) == len(names) == 9
    assert not any("issue" in name.lower() for name in names)


def test_each_goal_judged_on_its_worst_figure_at_the_most_threads() -> None:
    results = [result("bf16", 1, 2, 4.0, sglang_ms=5.0), result("int8", 1, 2, 2.0, sglang_ms=2.0),
               result("int8", 64, 2, 20.0, torch_ms=15.0),
               result("int8", 1, 1, 100.0, torch_ms=1.0)]  # one thread: no goal reads it
    judged = {g["target"]: g for g in goals.judge(results, derived_ratios(results))}
    assert list(judged) == [goal.name for goal in goals.GOALS]
    sglang = judged["vs SGLang, bf16 and int8, every M"]
    assert sglang == {"target": "vs SGLang, bf16 and int8, every M", "goal": 1.10, "threads": 2, "met": False,
                      "worst": 1.0, "where": "s int8 M=1"}
    never_slower, small_m = judged["vs torch, never slower"], judged["vs torch at M <= 16"]
    assert (never_slower["worst"], never_slower["where"], never_slower["met"]) == (0.75, "s int8 M=64", False)
    assert (small_m["worst"], small_m["where"], small_m["met"]) == (2.5, "s bf16 M=1", True)
    decode = judged["int8 decode vs bf16 decode (M=1)"]
    assert (decode["worst"], decode["where"], decode["met"]) == (2.0, "s M=1", True)
    for name in ("vs SGLang, fp8 where it runs", "4-bit decode vs int8 decode (M <= 4)",
                 "2 threads vs 1 thread at M >= 16"):
        assert (judged[name]["met"], judged[name]["worst"], judged[name]["where"]) == (None, None, "not measured")
