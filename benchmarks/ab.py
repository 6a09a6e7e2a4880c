"""A/B of this build's fused_experts_cpu against another build of this project, in ONE process.

The other build is its compiled op library (the `_ops.so` of an installed or
built tree), loaded next to this one: each build registers its ops under its
own namespace, which is found by what the library adds (a build of the same
namespace as this one cannot be told apart and is refused). Both builds get
the same inputs, each packs its own weights, and their calls are interleaved
call by call, which goes first alternating (timing.time_pairs). Reported per (shape, method, M,
threads): the median ms of each, the ratio of medians (baseline / this build:
above 1 is faster) and the spread of the ratios of paired calls (25th-75th
percentile); and whether both builds' outputs are the same bytes. Both builds
must run at one ISA level (refused otherwise).

An A/A (the same source against itself) gives the method's own spread: build a
copy with the op and C++ namespaces renamed, both, since the project's inline
variables (counting::kKindNames) are process-wide unique symbols; apart from
those and torch's header code, two builds of different namespaces share no symbol.

    python -m benchmarks.moe_bench --baseline /path/to/other/_ops.so --methods bf16 int8 fp8 --tokens 1 128
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

import moe_xarch  # noqa: F401  (registers this build's ops)
from benchmarks.contenders import FUSED, Inputs, build_call
from benchmarks.timing import quartiles, time_pairs
from benchmarks.workload import (
    METHODS, MoeShape, activation_kwargs, make_biases, make_tokens, make_weights, prepare_method)


def namespaces_with(op: str) -> set[str]:
    """The op namespaces that register `op`."""
    return {name.split("::")[0] for name in torch._C._dispatch_get_all_op_names() if name.split("::")[-1] == op}


def load_baseline(library: Path) -> str:
    """Loads the other build's library; returns its op namespace."""
    if not library.is_file():
        raise SystemExit(f"--baseline: {library} is not a file (expected the other build's compiled op library)")
    before = namespaces_with(FUSED)
    torch.ops.load_library(str(library))
    added = namespaces_with(FUSED) - before
    if len(added) != 1:
        raise SystemExit(f"--baseline: {library} registered {len(added)} new namespaces with {FUSED} "
                         f"({sorted(added)}); it must add exactly one, other than this build's {sorted(before)}")
    return added.pop()


def own_namespace() -> str:
    """This build's namespace: the one its package registers (loaded on import)."""
    (name,) = namespaces_with(FUSED)
    return name


def same_level(isas: dict[str, str]) -> None:
    """Refuses builds at different levels: their ratio would measure the levels, not the change. Each
    build is forced by its own name's variable; builds before the rename read MOE_KERNELS_ISA."""
    if isas["this"] != isas["baseline"]:
        raise SystemExit(f"--baseline: this build runs at {isas['this']}, the baseline at {isas['baseline']}; "
                         "force both to one level (MOE_XARCH_ISA, and MOE_KERNELS_ISA for builds before the rename)")


@dataclass
class AbResult:
    shape: str
    method: str
    tokens: int
    threads: int
    iterations: int
    this_ms: float
    baseline_ms: float
    ratio: float  # baseline median / this median: > 1 means this build is faster
    paired_p25: float  # spread of baseline_i / this_i over the iterations
    paired_p75: float
    same_bytes: bool


def run_shape(shape: MoeShape, methods: list[str], tokens_list: list[int], threads_list: list[int],
              spaces: dict[str, str], budget_s: float, min_iterations: int, max_iterations: int) -> list[AbResult]:
    generator = torch.Generator().manual_seed(0)
    w1, w2 = make_weights(shape, generator)
    b1, b2 = make_biases(shape, generator)
    ops = {build: getattr(torch.ops, ns) for build, ns in spaces.items()}
    packed: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor, dict[str, object]]] = {}
    for method in methods:
        weights = prepare_method(method, w1, w2)
        for build, op in ops.items():
            packed[(build, method)] = (op.convert_weight_packed(weights.w1, METHODS[method]),
                                       op.convert_weight_packed(weights.w2, METHODS[method]), weights.kwargs)
    results = []
    for tokens in tokens_list:
        inputs = Inputs(*make_tokens(shape, tokens, generator), b1, b2, activation_kwargs(shape))
        for threads in threads_list:
            torch.set_num_threads(threads)
            calls = {method: tuple(build_call(ops[build], inputs, method, packed[(build, method)])
                                   for build in ("this", "baseline")) for method in methods}
            same = {method: all(torch.equal(this(r), base(r)) for r in range(len(inputs.routings)))
                    for method, (this, base) in calls.items()}
            began = time.perf_counter()
            samples, iterations = time_pairs(calls, budget_s, min_iterations, max_iterations)
            for method in methods:
                a, b = samples[method]
                p25, p75 = quartiles([bi / ai for ai, bi in zip(a, b)])
                results.append(AbResult(shape.name, method, tokens, threads, iterations, statistics.median(a),
                                        statistics.median(b), statistics.median(b) / statistics.median(a), p25, p75,
                                        same[method]))
            print(f"[{shape.name}] M={tokens}, {threads} thread(s): {iterations} iterations of {2 * len(calls)} "
                  f"interleaved calls in {time.perf_counter() - began:.0f} s, load {os.getloadavg()[0]:.1f}",
                  flush=True)
    return results


def format_table(results: list[AbResult], spaces: dict[str, str]) -> str:
    lines = [f"| shape | method | M | thr | this ({spaces['this']}) ms | baseline ({spaces['baseline']}) ms "
             "| baseline / this | paired p25-p75 | same bytes |", "|" + "---|" * 9]
    for r in results:
        lines.append(f"| {r.shape} | {r.method} | {r.tokens} | {r.threads} | {r.this_ms:.3f} | {r.baseline_ms:.3f} "
                     f"| {r.ratio:.3f} | {r.paired_p25:.3f}-{r.paired_p75:.3f} | {'yes' if r.same_bytes else 'NO'} |")
    ratios = [r.ratio for r in results]
    lines.append(f"\nratios of medians: min {min(ratios):.3f}, median {statistics.median(ratios):.3f}, "
                 f"max {max(ratios):.3f}; outputs the same bytes in {sum(r.same_bytes for r in results)} "
                 f"of {len(results)}")
    return "\n".join(lines)


def main(args, shapes: dict[str, MoeShape]) -> int:
    spaces = {"this": own_namespace(), "baseline": load_baseline(args.baseline)}
    isas = {build: getattr(torch.ops, ns).isa() for build, ns in spaces.items()}
    same_level(isas)
    print(f"A/B: this build torch.ops.{spaces['this']} (isa {isas['this']}) against "
          f"torch.ops.{spaces['baseline']} (isa {isas['baseline']}) from {args.baseline}", flush=True)
    results: list[AbResult] = []
    for name in args.shapes:
        results += run_shape(shapes[name], args.methods, args.tokens, args.threads, spaces, args.budget,
                             args.min_iterations, args.max_iterations)
    table = format_table(results, spaces)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    document = {"baseline": str(args.baseline), "namespaces": spaces, "isa": isas,
                "results": [asdict(r) for r in results]}
    (args.out / "ab.json").write_text(json.dumps(document, indent=2))
    (args.out / "ab.md").write_text(table + "\n")
    print(f"wrote {args.out / 'ab.json'} and {args.out / 'ab.md'}")
    return 0 if all(r.same_bytes for r in results) else 1
