"""The pure-torch oracle of ``fused_experts_cpu``: the op contract, written as code.

Per token m and slot t (expert ``e = topk_ids[m, t]``, weight ``w = topk_weights[m, t]``):

    h = x[m] @ W1[e]^T (+ w1_bias[e])        2N values, float32
    a = activation(h)                        N values
    y = a @ W2[e]^T (+ w2_bias[e])           K values, float32
    out[m] = sum_t w * y                     float32, cast to the output dtype once

Tokens are grouped per expert so each expert costs two matmuls. Slots with a
negative id contribute nothing. The reference takes unpacked weights only.

Methods whose activations are quantized (INT8_W8A8, INT4_W4A8) quantize each
matrix's rows per token to int8, the intermediate again before the second
matmul. INT4_W4A8's per-group formula
``scale_a * scale[g] * (sum q_w * q_a - zero[g] * sum q_a)`` summed over the
groups equals ``scale_a * (q_a @ ((q_w - zero) * scale)^T)``, which the reference
computes in float64: every dequantized weight and every product is exact there.
MXFP4 dequantizes its weights to float32 (exactly) and multiplies the
activations as given.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from moe_xarch.ops import MoeCompMethod
from moe_xarch.quant import dequantize_fp8_block, dequantize_int4, dequantize_mxfp4, quantize_int8_per_token

__all__ = ["IMPLEMENTED_METHODS", "INT8_ACTIVATION_METHODS", "fused_experts"]

IMPLEMENTED_METHODS = tuple(MoeCompMethod)
# The methods that quantize activations per token to int8 at run time.
INT8_ACTIVATION_METHODS = (MoeCompMethod.INT8_W8A8, MoeCompMethod.INT4_W4A8)


class _ExpertWeights:
    """One weight tensor (w1 or w2) of a method, applied per expert in float32."""

    def __init__(
        self,
        name: str,
        weight: torch.Tensor,
        scale: torch.Tensor | None,
        zero: torch.Tensor | None,
        method: MoeCompMethod,
        block_size: Sequence[int] | None,
    ) -> None:
        self.method = method
        self.scale = None
        if method != MoeCompMethod.UNQUANT and scale is None:
            raise ValueError(f"{name}_scale is required by {method.name}")
        if zero is not None and method != MoeCompMethod.INT4_W4A8:
            raise ValueError(f"{name}_zero: unused by {method.name}")
        if method == MoeCompMethod.INT8_W8A8:
            # float64 holds every int8 x int8 dot of these sizes exactly, like int32 does.
            self.weight = weight.double()
            self.scale = scale.float()
        elif method == MoeCompMethod.FP8_W8A16:
            if block_size is None:
                raise ValueError("block_size is required by FP8_W8A16")
            self.weight = dequantize_fp8_block(weight, scale, block_size)
        elif method == MoeCompMethod.INT4_W4A8:
            self.weight = dequantize_int4(weight, scale, zero, torch.float64)
            group = self.weight.shape[-1] // scale.shape[-1]
            if block_size is not None and list(block_size) != [1, group]:
                raise ValueError(f"block_size: None or [1, {group}] (the group size of {name}_scale), got {list(block_size)}")
        elif method == MoeCompMethod.MXFP4:
            self.weight = dequantize_mxfp4(weight, scale)
        else:
            self.weight = weight.float()

    def apply(self, a: torch.Tensor, expert: int) -> torch.Tensor:
        """``a @ W[expert]^T`` in float32; INT8 and INT4 quantize ``a`` per row first."""
        if self.method not in INT8_ACTIVATION_METHODS:
            return a @ self.weight[expert].T
        q, a_scale = quantize_int8_per_token(a)
        dot = q.double() @ self.weight[expert].T
        if self.scale is None:  # INT4: the group scales are in the float64 weights
            return (dot * a_scale.double()[:, None]).float()
        return dot.float() * (a_scale[:, None] * self.scale[expert][None, :])


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
    every method - 0 (UNQUANT), 1 (INT8_W8A8), 2 (FP8_W8A16), 3 (INT4_W4A8), 4
    (MXFP4) - with unpacked weights. Checks only what the math needs; validating
    inputs is the kernel's job.

    Returns:
        ``[M, K]`` in ``hidden_states.dtype``; ``hidden_states`` itself, overwritten,
        when ``inplace``.

    Raises:
        ValueError: packed weights (``is_vnni=True``), an unknown method, zero
            points for a method other than INT4_W4A8, missing scales, a missing
            FP8 block_size or an INT4 one other than [1, G], scales whose shape
            does not fit the weights, or ``limit`` without ``alpha``.
    """
    if is_vnni:
        raise ValueError("is_vnni: the reference takes unpacked weights only")
    if int(moe_comp_method) not in IMPLEMENTED_METHODS:
        raise ValueError(
            f"moe_comp_method: the reference implements {[int(m) for m in IMPLEMENTED_METHODS]}, "
            f"got {moe_comp_method}"
        )
    method = MoeCompMethod(moe_comp_method)
    if limit is not None and alpha is None:
        raise ValueError("limit: given without alpha")

    first = _ExpertWeights("w1", w1, w1_scale, w1_zero, method, block_size)
    second = _ExpertWeights("w2", w2, w2_scale, w2_zero, method, block_size)
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
