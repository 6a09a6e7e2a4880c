"""The bench's output: the table and summary it prints, and the JSON, Markdown and PNG it writes."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import torch

import moe_xarch
from benchmarks.results import Result


def _fmt(value: float | None, spec: str = ".3f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def format_table(results: list[Result]) -> str:
    header = ("| shape | method | M | thr | moe_xarch ms | sglang ms | torch ms | vs sglang | vs torch "
              "| GB/s | mem roofline GB/s | of roofline |")
    lines = [header, "|" + "---|" * 12]
    for r in results:
        ms = r.median_ms
        lines.append(
            f"| {r.shape} | {r.method} | {r.tokens} | {r.threads} | {ms['moe_xarch']:.3f} | "
            f"{_fmt(ms.get('sglang'))} | {ms['torch']:.3f} | {_fmt(r.speedup_vs_sglang, '.2f', 'x')} | "
            f"{r.speedup_vs_torch:.2f}x | {r.achieved_gbs:.1f} | {r.roofline_gbs:.1f} | "
            f"{100 * r.achieved_gbs / r.roofline_gbs:.0f}% |")
    return "\n".join(lines)


def format_summary(derived: dict[str, list[dict[str, object]]], goals: list[dict[str, object]]) -> str:
    lines = ["int8 decode vs bf16 decode (moe_xarch, bf16 ms / int8 ms):"]
    lines += [f"  {d['shape']} M={d['tokens']} threads={d['threads']}: {d['ratio']:.2f}x"
              for d in derived["int8_vs_bf16_decode"]]
    lines.append("4-bit decode vs int8 decode (moe_xarch, int8 ms / 4-bit ms):")
    lines += [f"  {d['shape']} {d['method']} M={d['tokens']} threads={d['threads']}: {d['ratio']:.2f}x"
              for d in derived["four_bit_vs_int8_decode"]]
    lines.append("threads scaling (1-thread ms / N-thread ms):")
    lines += [f"  {d['shape']} {d['method']} M={d['tokens']}: moe_xarch {d['moe_xarch']:.2f}x"
              + (f", sglang {d['sglang']:.2f}x" if "sglang" in d else "")
              + f", memory read {d['memory_roofline']:.2f}x" for d in derived["threads_scaling"]]
    lines.append(f"goals (worst case, at {goals[0]['threads'] if goals else '-'} threads):")
    for g in goals:
        state = {True: "met", False: "NOT met", None: "not measured"}[g["met"]]
        lines.append(f"  {g['target']}: goal >= {g['goal']}x, worst {_fmt(g['worst'], '.2f', 'x')}"
                     f" ({g['where']}) - {state}")
    return "\n".join(lines)


def machine_info() -> dict[str, object]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"machine": platform.machine(), "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "moe_xarch_isa": moe_xarch.isa()}


def write(document: dict[str, object], table: str, summary: str, out: Path) -> None:
    """moe_bench.json, moe_bench.md and, where matplotlib is installed, moe_bench.png into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "moe_bench.json").write_text(json.dumps(document, indent=2))
    (out / "moe_bench.md").write_text(table + "\n\n" + summary + "\n")
    print(f"wrote {out / 'moe_bench.json'} and {out / 'moe_bench.md'}")
    try:
        from benchmarks import plot
    except ImportError as error:  # matplotlib absent: the numbers still stand
        print(f"no plot: {error}")
    else:
        path = plot.plot(document, out / "moe_bench.png")
        print(f"wrote {path}")
