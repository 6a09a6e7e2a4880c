"""Side-by-side MoE benchmark: moe_kernels against the best pure-torch baseline.

The machine is shared and noisy, so contenders run in ONE process, interleaved
call by call on the same inputs, with routing that changes every iteration (the
active experts' weights really stream from memory); each comparison is reported
as a ratio of medians. Prints a table and writes JSON.

    python -m benchmarks.moe_bench --shape deepseek-v2-lite --tokens 1 128 --methods bf16 int8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

import moe_kernels
from moe_kernels import MoeCompMethod, quant


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

METHODS = {"bf16": MoeCompMethod.UNQUANT, "int8": MoeCompMethod.INT8_W8A8}
ROUTINGS = 16  # distinct routings cycled through, so weights are not cache-resident


@dataclass
class Result:
    shape: str
    method: str
    tokens: int
    threads: int
    median_ms: dict[str, float] = field(default_factory=dict)
    speedup_vs_torch: float = 0.0
    isa: str = ""


def make_weights(shape: MoeShape, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    w1 = torch.randn(shape.experts, 2 * shape.inter, shape.hidden, generator=generator)
    w1 /= shape.hidden**0.5
    w2 = torch.randn(shape.experts, shape.hidden, shape.inter, generator=generator)
    w2 /= shape.inter**0.5
    return w1.to(torch.bfloat16), w2.to(torch.bfloat16)


def make_routings(shape: MoeShape, tokens: int, generator: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
    routings = []
    for _ in range(ROUTINGS):
        scores = torch.rand(tokens, shape.experts, generator=generator)
        weights, ids = scores.topk(shape.topk, dim=1)
        routings.append((weights / weights.sum(1, keepdim=True), ids.to(torch.int32)))
    return routings


def activation_kwargs(shape: MoeShape) -> dict[str, float]:
    return {"alpha": 1.702, "limit": 7.0} if shape.swiglu else {}


def torch_baseline(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    b1: torch.Tensor | None,
    b2: torch.Tensor | None,
    alpha: float | None = None,
    limit: float | None = None,
) -> torch.Tensor:
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
        rows = token_of[start : start + count]
        # linear() multiplies by the [out, in] weight without materializing its transpose.
        h = torch.nn.functional.linear(x[rows], w1[expert], None if b1 is None else b1[expert].to(x.dtype))
        if alpha is None:
            gate, up = h.chunk(2, dim=1)
            a = torch.nn.functional.silu(gate) * up
        else:
            gate, up = h[:, 0::2], h[:, 1::2]
            if limit is not None:
                gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
            a = gate * torch.sigmoid(alpha * gate) * (up + 1)
        y = torch.nn.functional.linear(a, w2[expert], None if b2 is None else b2[expert].to(x.dtype))
        out.index_add_(0, rows, (y.float() * weight_of[start : start + count, None]))
        start += count
    return out.to(x.dtype)


def time_interleaved(contenders: dict[str, Callable[[int], object]], iterations: int, warmup: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for it in range(warmup + iterations):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn(it % ROUTINGS)
            elapsed = time.perf_counter() - start
            if it >= warmup:
                samples[name].append(elapsed * 1e3)
    return {name: statistics.median(values) for name, values in samples.items()}


def bench_shape(shape: MoeShape, methods: list[str], tokens_list: list[int], threads_list: list[int],
                iterations: int, warmup: int) -> list[Result]:
    generator = torch.Generator().manual_seed(0)
    w1, w2 = make_weights(shape, generator)
    b1 = torch.randn(shape.experts, 2 * shape.inter, generator=generator) if shape.swiglu else None
    b2 = torch.randn(shape.experts, shape.hidden, generator=generator) if shape.swiglu else None
    act = activation_kwargs(shape)
    prepared = {}
    for method in methods:
        if METHODS[method] == MoeCompMethod.INT8_W8A8:
            q1, s1 = quant.quantize_int8_per_channel(w1.float())
            q2, s2 = quant.quantize_int8_per_channel(w2.float())
            prepared[method] = (q1, q2, {"w1_scale": s1, "w2_scale": s2})
        else:
            prepared[method] = (w1, w2, {})
    results = []
    for tokens in tokens_list:
        x = torch.randn(tokens, shape.hidden, generator=generator).to(torch.bfloat16)
        routings = make_routings(shape, tokens, generator)
        for method in methods:
            mw1, mw2, scales = prepared[method]
            p1 = moe_kernels.convert_weight_packed(mw1, METHODS[method])
            p2 = moe_kernels.convert_weight_packed(mw2, METHODS[method])
            contenders = {
                "moe_kernels": lambda r: moe_kernels.fused_experts(
                    x, p1, p2, *routings[r], moe_comp_method=METHODS[method], is_vnni=True,
                    w1_bias=b1, w2_bias=b2, **scales, **act),
                "torch": lambda r: torch_baseline(x, w1, w2, *routings[r], b1, b2, **act),
            }
            for threads in threads_list:
                torch.set_num_threads(threads)
                medians = time_interleaved(contenders, iterations, warmup)
                result = Result(shape.name, method, tokens, threads, medians,
                                medians["torch"] / medians["moe_kernels"], moe_kernels.isa())
                print(f"  {shape.name} {method} M={tokens} threads={threads}: "
                      + ", ".join(f"{k} {v:.3f} ms" for k, v in medians.items())
                      + f", speedup {result.speedup_vs_torch:.2f}x", flush=True)
                results.append(result)
            del p1, p2
    return results


def format_table(results: list[Result]) -> str:
    header = "| shape | method | M | threads | moe_kernels ms | torch ms | speedup vs torch |"
    lines = [header, "|" + "---|" * 7]
    for r in results:
        lines.append(f"| {r.shape} | {r.method} | {r.tokens} | {r.threads} | "
                     f"{r.median_ms['moe_kernels']:.3f} | {r.median_ms['torch']:.3f} | {r.speedup_vs_torch:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", nargs="+", default=["deepseek-v2-lite"], choices=sorted(SHAPES))
    parser.add_argument("--methods", nargs="+", default=["bf16", "int8"], choices=sorted(METHODS))
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 128])
    parser.add_argument("--threads", nargs="+", type=int, default=[2])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", type=Path, default=Path("bench-results/moe_bench.json"))
    args = parser.parse_args(argv)
    print(f"moe_kernels isa={moe_kernels.isa()} torch {torch.__version__}", flush=True)
    results = []
    for name in args.shape:
        print(f"[{name}] building weights", flush=True)
        results += bench_shape(SHAPES[name], args.methods, args.tokens, args.threads, args.iterations, args.warmup)
    print(format_table(results))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
