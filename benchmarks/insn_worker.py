"""The emulated side of benchmarks/insn_count.py: op calls between marker syscalls.

Runs under QEMU with docker/qemu-plugin/insn_regions.c loaded, which writes the
guest's instruction count at every marker syscall. After one warm-up call, each
(shape, method, M) gets three marks: two in a row (what a region costs besides
its calls), then one call before the third; the difference is one call's instructions,
without the start-up of the process. Writes one JSON document: the marks of
each region and what the figures need (active experts, weight bytes, MACs, the
library's kernel path).

Only the experts the routing picks get weights (their ids renumbered 0..a-1),
and all of them are copies of one random expert, quantized and packed once: the
op does the same work as with the shape's own experts (its kernels take the
same path whatever the values), and the emulated process makes the weights in
seconds, not the many minutes of quantizing every expert under QEMU.

Besides the bench's methods, the 4-bit ones (FOUR_BIT), quantized here with
moe_xarch.quant: INT4_W4A8 in workload.int4_group's groups with zero points,
MXFP4.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

import torch

import moe_xarch
from benchmarks import workload
from moe_xarch import MoeCompMethod, quant

MARK_SYSCALL = 0x4D4F45  # docker/qemu-plugin/insn_regions.c's marker
LIBC = ctypes.CDLL(None)
FOUR_BIT = {"int4": MoeCompMethod.INT4_W4A8, "mxfp4": MoeCompMethod.MXFP4}
METHODS = {**workload.METHODS, **FOUR_BIT}


def mark(identifier: int) -> None:
    LIBC.syscall(MARK_SYSCALL, ctypes.c_uint64(identifier))


def compact_routing(topk_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The ids renumbered onto 0..a-1 (a = the active experts), order kept."""
    active, renumbered = topk_ids.long().unique(return_inverse=True)
    return renumbered.to(torch.int32), int(active.numel())


def replicated(tensor: torch.Tensor, experts: int) -> torch.Tensor:
    return tensor.expand(experts, *tensor.shape[1:]).contiguous()


def prepare(method: str, shape: workload.MoeShape, w1: torch.Tensor,
            w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, object]]:
    """The method's w1, w2 and their fused_experts kwargs (scales, zero points, block size)."""
    if method == "int4":
        group = workload.int4_group(shape.hidden, shape.inter)
        (q1, s1, z1), (q2, s2, z2) = (quant.quantize_int4(w.float(), group) for w in (w1, w2))
        return q1, q2, {"w1_scale": s1, "w2_scale": s2, "w1_zero": z1, "w2_zero": z2}
    if method == "mxfp4":
        (q1, s1), (q2, s2) = (quant.quantize_mxfp4(w.float()) for w in (w1, w2))
        return q1, q2, {"w1_scale": s1, "w2_scale": s2}
    prepared = workload.prepare_method(method, w1, w2)
    return prepared.w1, prepared.w2, prepared.kwargs


def weight_bytes(shape: workload.MoeShape, method: str) -> int:
    """One expert's w1 + w2 as the method stores them (scales are negligible)."""
    return 3 * shape.inter * shape.hidden // 2 if method in FOUR_BIT else workload.expert_bytes(shape, method)


def measure(shape: workload.MoeShape, methods: list[str], tokens_list: list[int], decode_only: list[str],
            next_mark: list[int]) -> list[dict[str, object]]:
    generator = torch.Generator().manual_seed(0)
    routings = {}
    for tokens in tokens_list:
        weights, ids = workload.make_routings(shape, tokens, generator, count=1)[0]
        routings[tokens] = (weights, *compact_routing(ids))
    experts = max(active for _, _, active in routings.values())
    w1, w2 = workload.make_weights(
        workload.MoeShape(shape.name, 1, shape.topk, shape.hidden, shape.inter, shape.swiglu), generator)
    b1 = torch.randn(experts, 2 * shape.inter, generator=generator) if shape.swiglu else None
    b2 = torch.randn(experts, shape.hidden, generator=generator) if shape.swiglu else None
    regions = []
    for method in methods:
        q1, q2, method_kwargs = prepare(method, shape, w1, w2)
        code = METHODS[method]
        p1, p2 = (replicated(moe_xarch.convert_weight_packed(w, code), experts) for w in (q1, q2))
        scales = {k: (replicated(v, experts) if isinstance(v, torch.Tensor) else v)
                  for k, v in method_kwargs.items()}
        for tokens in tokens_list[:1] if method in decode_only else tokens_list:
            topk_weights, ids, active = routings[tokens]
            x = torch.randn(tokens, shape.hidden, generator=generator).to(torch.bfloat16)
            kwargs = {k: (v[:active] if isinstance(v, torch.Tensor) else v) for k, v in scales.items()}
            if shape.swiglu:
                kwargs.update(w1_bias=b1[:active], w2_bias=b2[:active], **workload.activation_kwargs(shape))
            w1_active, w2_active = p1[:active], p2[:active]

            def call() -> None:
                moe_xarch.fused_experts(x, w1_active, w2_active, topk_weights, ids, moe_comp_method=code,
                                        is_vnni=True, **kwargs)

            call()
            marks = tuple(range(next_mark[0], next_mark[0] + 3))
            next_mark[0] += 3
            mark(marks[0])
            mark(marks[1])
            call()
            mark(marks[2])
            regions.append({"shape": shape.name, "method": method, "tokens": tokens, "active_experts": active,
                            "weight_bytes": active * weight_bytes(shape, method),
                            "macs": workload.useful_flops(shape, tokens) / 2, "marks": marks})
            print(f"[{shape.name}] {method} M={tokens}: measured", file=sys.stderr, flush=True)
    return regions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(workload.SHAPES), choices=list(workload.SHAPES))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--tokens", nargs="+", type=int, required=True, help="M values, smallest first")
    parser.add_argument("--decode-only", nargs="*", default=[], choices=list(METHODS),
                        help="methods measured at the first M only")
    parser.add_argument("--out", type=Path, required=True, help="where the JSON document goes")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # one guest thread: the count is exact (the plugin's counter is not atomic)
    next_mark = [0]
    regions = []
    for name in args.shapes:
        regions += measure(workload.SHAPES[name], args.methods, args.tokens, args.decode_only, next_mark)
    document = {"isa": moe_xarch.isa(), "torch": torch.__version__, "regions": regions}
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
