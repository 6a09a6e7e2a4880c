"""The pure-torch oracle of ``fused_experts_cpu``: the op contract, written as code.

Per token m and slot t (expert ``e = topk_ids[m, t]``, weight ``w = topk_weights[m, t]``):

    h = x[m] @ W1[e]^T (+ w1_bias[e])        2N values, float32
    a = activation(h)                        N values
    y = a @ W2[e]^T (+ w2_bias[e])           K values, float32
    out[m] = sum_t w * y                     float32, cast to the output dtype once

Tokens are grouped per expert so each expert costs two matmuls. Slots with a
negative id contribute nothing. The reference takes unpacked weights only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from moe_xarch.ops import MoeCompMethod
from moe_xarch.quant import dequantize_fp8_block, quantize_int8_per_token

__all__ = ["IMPLEMENTED_METHODS", "fused_experts"]

IMPLEMENTED_METHODS = (MoeCompMethod.UNQUANT, MoeCompMethod.INT8_W8A8, MoeCompMethod.FP8_W8A16)


class _ExpertWeights:
    """One weight tensor (w1 or w2) of a method, applied per expert in float32."""

    def __init__(
        self,
        name: str,
        weight: torch.Tensor,
        scale: torch.Tensor | None,
        method: MoeCompMethod,
        block_size: Sequence[int] | None,
    ) -> None:
        self.method = method
        if method != MoeCompMethod.UNQUANT and scale is None:
            raise ValueError(f"{name}_scale is required by {method.name}")
        if method == MoeCompMethod.INT8_W8A8:
            # float64 holds every int8 x int8 dot of these sizes exactly, like int32 does.
            self.weight = weight.double()
            self.scale = scale.float()
        elif method == MoeCompMethod.FP8_W8A16:
            if block_size is None:
                raise ValueError("block_size is required by FP8_W8A16")
            self.weight = dequantize_fp8_block(weight, scale, block_size)
        else:
            self.weight = weight.float()

    def apply(self, a: torch.Tensor, expert: int) -> torch.Tensor:
        """``a @ W[expert]^T`` in float32; INT8 quantizes ``a`` per row first."""
        if self.method != MoeCompMethod.INT8_W8A8:
            return a @ self.weight[expert].T
        q, a_scale = quantize_int8_per_token(a)
        dot = (q.double() @ self.weight[expert].T).float()
        return dot * (a_scale[:, None] * self.scale[expert][None, :])


def _activation(h: torch.Tensor, alpha: float | None, limit: float | None) -> torch.Tensor:
    """SiLU-and-mul on halves, or the gpt-oss swiglu on interleaved rows."""
    if alpha is None:
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up
    gate, up = h[:, 0::2], h[:, 1::2]
    if limit is not None:
        gate = gate.clamp(max=limit)
        up = up.clamp(-limit, limit)
    return gate * torch.sigmoid(alpha * gate) * (up + 1)


def fused_experts(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    inplace: bool = False,
    moe_comp_method: int = MoeCompMethod.UNQUANT,
    w1_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    w1_zero: torch.Tensor | None = None,
    w2_zero: torch.Tensor | None = None,
    block_size: Sequence[int] | None = None,
    w1_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    alpha: float | None = None,
    limit: float | None = None,
    is_vnni: bool = False,
) -> torch.Tensor:
    """Compute what ``torch.ops.moe_xarch.fused_experts_cpu`` must return.

    Same arguments as ``moe_xarch.fused_experts`` (see the op contract) for
    methods 0 (UNQUANT), 1 (INT8_W8A8) and 2 (FP8_W8A16), with unpacked weights.
    Checks only what the math needs; validating inputs is the kernel's job.

    Returns:
        ``[M, K]`` in ``hidden_states.dtype``; ``hidden_states`` itself, overwritten,
        when ``inplace``.

    Raises:
        ValueError: packed weights (``is_vnni=True``), a method other than 0-2,
            zero points, missing scales or block_size, or ``limit`` without ``alpha``.
    """
    if is_vnni:
        raise ValueError("is_vnni: the reference takes unpacked weights only")
    if int(moe_comp_method) not in IMPLEMENTED_METHODS:
        raise ValueError(
            f"moe_comp_method: the reference implements {[int(m) for m in IMPLEMENTED_METHODS]}, "
            f"got {moe_comp_method}"
        )
    method = MoeCompMethod(moe_comp_method)
    if w1_zero is not None or w2_zero is not None:
        raise ValueError(f"w1_zero/w2_zero: unused by {method.name}")
    if limit is not None and alpha is None:
        raise ValueError("limit: given without alpha")

    first = _ExpertWeights("w1", w1, w1_scale, method, block_size)
    second = _ExpertWeights("w2", w2, w2_scale, method, block_size)
    x = hidden_states.float()
    out = torch.zeros_like(x)

    topk = topk_ids.shape[1]
    slot_expert = topk_ids.reshape(-1).long()
    slot_token = torch.arange(x.shape[0]).repeat_interleave(topk)
    slot_weight = topk_weights.reshape(-1).float()
    for expert in slot_expert[slot_expert >= 0].unique().tolist():
        slots = (slot_expert == expert).nonzero().squeeze(1)
        tokens = slot_token[slots]
        h = first.apply(x[tokens], expert)
        if w1_bias is not None:
            h = h + w1_bias[expert].float()
        y = second.apply(_activation(h, alpha, limit), expert)
        if w2_bias is not None:
            y = y + w2_bias[expert].float()
        out.index_add_(0, tokens, slot_weight[slots, None] * y)

    if inplace:
        return hidden_states.copy_(out)
    return out.to(hidden_states.dtype)
