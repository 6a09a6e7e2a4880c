"""The bench's figures: a Result per (shape, method, M, threads) from the medians, and the ratios between them."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from benchmarks.timing import Key
from benchmarks.workload import FOUR_BIT, MoeShape, expert_bytes, useful_flops


@dataclass
class Result:
    shape: str
    method: str
    tokens: int
    threads: int
    iterations: int
    median_ms: dict[str, float]  # moe_xarch, sglang (when it runs and matches), torch, memory_roofline
    speedup_vs_sglang: float | None
    speedup_vs_torch: float
    active_bytes: float  # mean over the routings
    achieved_gbs: float  # moe_xarch: active bytes / median time
    roofline_gbs: float  # the streaming read of the same bytes
    gflops: dict[str, float]  # useful GFLOP/s per contender, and the memory roofline's in the same units


def results_of(shape: MoeShape, methods: list[str], tokens: int, threads_list: list[int], torch_dtype: str,
               read_as: dict[str, str], active: list[int], medians: dict[Key, float],
               iterations: int) -> list[Result]:
    """The rows of one (shape, M), method-major: `medians` of the moe_xarch, sglang, torch (in `torch_dtype`)
    and memory keys (each method read as `read_as` says), over routings with `active` experts."""
    mean_bytes = {m: statistics.mean(a * expert_bytes(shape, m) for a in active) for m in methods}
    flops = useful_flops(shape, tokens)
    results = []
    for method in methods:
        for threads in threads_list:
            ms = {"moe_xarch": medians[Key("moe_xarch", method, threads)],
                  "torch": medians[Key("torch", torch_dtype, threads)],
                  "memory_roofline": medians[Key("memory", read_as[method], threads)]}
            if Key("sglang", method, threads) in medians:
                ms["sglang"] = medians[Key("sglang", method, threads)]
            results.append(Result(
                shape=shape.name, method=method, tokens=tokens, threads=threads, iterations=iterations,
                median_ms=ms,
                speedup_vs_sglang=ms["sglang"] / ms["moe_xarch"] if "sglang" in ms else None,
                speedup_vs_torch=ms["torch"] / ms["moe_xarch"],
                active_bytes=mean_bytes[method],
                achieved_gbs=mean_bytes[method] / ms["moe_xarch"] / 1e6,
                roofline_gbs=mean_bytes[method] / ms["memory_roofline"] / 1e6,
                gflops={name: flops / value / 1e6 for name, value in ms.items()},
            ))
    return results


def derived_ratios(results: list[Result]) -> dict[str, list[dict[str, object]]]:
    """int8 decode vs bf16 decode, 4-bit decode vs int8 decode, and N threads vs 1 thread at M >= 16
    (ratios of medians)."""
    index = {(r.shape, r.method, r.tokens, r.threads): r for r in results}

    def decode_vs(method: str, base: str) -> list[dict[str, object]]:
        ratios = []
        for r in results:
            if r.method == method and r.tokens <= 4 and (r.shape, base, r.tokens, r.threads) in index:
                other = index[(r.shape, base, r.tokens, r.threads)]
                ratios.append({"shape": r.shape, "method": method, "tokens": r.tokens, "threads": r.threads,
                               "ratio": other.median_ms["moe_xarch"] / r.median_ms["moe_xarch"]})
        return ratios

    decode = decode_vs("int8", "bf16")
    four_bit = [d for method in FOUR_BIT for d in decode_vs(method, "int8")]
    scaling = []
    for r in results:
        if r.threads > 1 and r.tokens >= 16 and (r.shape, r.method, r.tokens, 1) in index:
            one = index[(r.shape, r.method, r.tokens, 1)]
            # The streaming read's own scaling: what the machine's memory allows.
            entry = {"shape": r.shape, "method": r.method, "tokens": r.tokens, "threads": r.threads,
                     "moe_xarch": one.median_ms["moe_xarch"] / r.median_ms["moe_xarch"],
                     "memory_roofline": one.median_ms["memory_roofline"] / r.median_ms["memory_roofline"]}
            if "sglang" in r.median_ms and "sglang" in one.median_ms:
                entry["sglang"] = one.median_ms["sglang"] / r.median_ms["sglang"]
            scaling.append(entry)
    return {"int8_vs_bf16_decode": decode, "four_bit_vs_int8_decode": four_bit, "threads_scaling": scaling}
