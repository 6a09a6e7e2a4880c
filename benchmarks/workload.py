"""What the benchmarks run: the MoE shapes, the methods, their weights and routings, and what a call reads and computes.

Every bench draws from one seeded generator in the same order (weights, biases,
then per M the tokens and their routings), so a run's inputs repeat exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from moe_xarch import MoeCompMethod, quant
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
ROUTINGS = 16  # distinct routings cycled through, one per iteration

Routing = tuple[torch.Tensor, torch.Tensor]  # topk_weights, topk_ids


def make_weights(shape: MoeShape, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 expert weights, generated one expert at a time (gpt-oss is 1.6 GB in bf16)."""
    def one(rows: int, cols: int) -> torch.Tensor:
        w = torch.empty(shape.experts, rows, cols, dtype=torch.bfloat16)
        for e in range(shape.experts):
            w[e] = (torch.randn(rows, cols, generator=generator) / cols**0.5).to(torch.bfloat16)
        return w
    return one(2 * shape.inter, shape.hidden), one(shape.hidden, shape.inter)


def make_biases(shape: MoeShape, generator: torch.Generator) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """float32 w1 and w2 biases for a gpt-oss style shape; none otherwise."""
    if not shape.swiglu:
        return None, None
    b1 = torch.randn(shape.experts, 2 * shape.inter, generator=generator)
    return b1, torch.randn(shape.experts, shape.hidden, generator=generator)


def make_routings(shape: MoeShape, tokens: int, generator: torch.Generator,
                  count: int = ROUTINGS, experts: int | None = None) -> list[Routing]:
    experts = experts or shape.experts
    topk = min(shape.topk, experts)
    routings = []
    for _ in range(count):
        scores = torch.rand(tokens, experts, generator=generator)
        weights, ids = scores.topk(topk, dim=1)
        routings.append((weights / weights.sum(1, keepdim=True), ids.to(torch.int32)))
    return routings


def make_tokens(shape: MoeShape, tokens: int, generator: torch.Generator) -> tuple[torch.Tensor, list[Routing]]:
    """M bf16 hidden states and the ROUTINGS routings the iterations cycle through."""
    x = torch.randn(tokens, shape.hidden, generator=generator).to(torch.bfloat16)
    return x, make_routings(shape, tokens, generator)


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


def expert_bytes(shape: MoeShape, method: str) -> int:
    """Bytes of one expert's w1 + w2 in the method's dtype, with the 4-bit methods' scales and zeros
    (8-bit per-channel scales are negligible)."""
    return round(3 * shape.inter * shape.hidden * weight_bytes(shape, method))


def active_experts(topk_ids: torch.Tensor) -> int:
    ids = topk_ids.flatten()
    return int(ids[ids >= 0].unique().numel())


def useful_flops(shape: MoeShape, tokens: int) -> float:
    return 2.0 * tokens * shape.topk * 3 * shape.inter * shape.hidden


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
