"""What is timed: moe_xarch's fused op, another build's (the A/B's baseline), SGLang's kernel and pure torch.

Each contender is a call of the routing index r (iteration % ROUTINGS) on the
inputs of one (shape, M), made once; a call does nothing else that could be timed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import moe_xarch
from benchmarks import sglang
from benchmarks.workload import METHODS, MethodWeights, Routing

FUSED = "fused_experts_cpu"

Call = Callable[[int], object]


@dataclass
class Inputs:
    """One (shape, M)'s hidden states, routings, biases and activation arguments, shared by every contender."""

    x: torch.Tensor
    routings: list[Routing]
    b1: torch.Tensor | None
    b2: torch.Tensor | None
    act: dict[str, float]
    out: torch.Tensor = field(init=False)  # SGLang's kernel writes into it

    def __post_init__(self) -> None:
        self.out = torch.empty_like(self.x)

    @property
    def bias(self) -> dict[str, torch.Tensor | None]:
        return {"w1_bias": self.b1, "w2_bias": self.b2}


def moe_xarch_call(inputs: Inputs, method: str, weights: MethodWeights) -> Call:
    """This build's wrapper on its packed weights."""
    x, routings, bias, act = inputs.x, inputs.routings, inputs.bias, inputs.act
    p1, p2 = weights.packed["moe_xarch"]
    return lambda r: moe_xarch.fused_experts(x, p1, p2, *routings[r], moe_comp_method=METHODS[method],
                                               is_vnni=True, **weights.kwargs, **bias, **act)


def build_call(op: object, inputs: Inputs, method: str,
               packed: tuple[torch.Tensor, torch.Tensor, dict[str, object]]) -> Callable[[int], torch.Tensor]:
    """A build's raw op by its namespace (`torch.ops.<ns>`), on weights that build packed, with their kwargs."""
    x, routings, b1, b2, act = inputs.x, inputs.routings, inputs.b1, inputs.b2, inputs.act
    p1, p2, kw = packed
    args = lambda r: (x, p1, p2, *routings[r], False, int(METHODS[method]), kw.get("w1_scale"),  # noqa: E731
                      kw.get("w2_scale"), kw.get("w1_zero"), kw.get("w2_zero"), kw.get("block_size"),
                      b1, b2, act.get("alpha"), act.get("limit"), True)
    return lambda r: getattr(op, FUSED)(*args(r))


def sglang_weights(sg_ops: object, method: str, w1: torch.Tensor, w2: torch.Tensor,
                   kwargs: dict[str, object]) -> tuple[torch.Tensor, torch.Tensor, dict[str, object]]:
    """SGLang's packed w1 and w2 with the scales and zeros in its layouts (benchmarks/sglang.py says which)."""
    code = METHODS[method]
    p1, s1, z1 = sglang.pack(sg_ops, code, w1, kwargs.get("w1_scale"), kwargs.get("w1_zero"))
    p2, s2, z2 = sglang.pack(sg_ops, code, w2, kwargs.get("w2_scale"), kwargs.get("w2_zero"))
    # Its INT4_W4A8 takes the group size from the scales' shape, and no block_size.
    block_size = kwargs.get("block_size") if method == "fp8" else None
    return p1, p2, {"w1_scale": s1, "w2_scale": s2, "w1_zero": z1, "w2_zero": z2, "block_size": block_size}


def sglang_call(sg_ops: object, inputs: Inputs, method: str, weights: MethodWeights) -> Call:
    """SGLang's kernel on the weights it packed (weights.packed["sglang"], weights.sglang_kwargs)."""
    x, out, routings, bias, act = inputs.x, inputs.out, inputs.routings, inputs.bias, inputs.act
    p1, p2 = weights.packed["sglang"]
    return lambda r: sglang.fused_experts(sg_ops, out, x, p1, p2, *routings[r], METHODS[method],
                                          **weights.sglang_kwargs, **bias, **act)


def torch_call(inputs: Inputs, w1: torch.Tensor, w2: torch.Tensor) -> Call:
    """Pure torch on w1 and w2 in the dtype it computes in; the hidden states are converted inside the call."""
    x, routings, b1, b2, act = inputs.x, inputs.routings, inputs.b1, inputs.b2, inputs.act
    return lambda r: torch_baseline(x.to(w1.dtype), w1, w2, *routings[r], b1, b2, **act)


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
