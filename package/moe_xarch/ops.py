"""Typed wrappers over torch.ops.moe_xarch and their fake (meta) implementations."""

from __future__ import annotations

import json
import numbers
from collections.abc import Mapping, Sequence
from enum import IntEnum

import torch
from torch import Tensor


class MoeCompMethod(IntEnum):
    """The spec's moe_comp_method values."""

    UNQUANT = 0
    INT8_W8A8 = 1
    FP8_W8A16 = 2
    INT4_W4A8 = 3
    MXFP4 = 4


def fused_experts(
    hidden_states: Tensor,
    w1: Tensor,
    w2: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    *,
    inplace: bool = False,
    moe_comp_method: int = MoeCompMethod.UNQUANT,
    w1_scale: Tensor | None = None,
    w2_scale: Tensor | None = None,
    w1_zero: Tensor | None = None,
    w2_zero: Tensor | None = None,
    block_size: Sequence[int] | None = None,
    w1_bias: Tensor | None = None,
    w2_bias: Tensor | None = None,
    alpha: float | None = None,
    limit: float | None = None,
    is_vnni: bool = False,
) -> Tensor:
    """The fused MoE layer: for each token, sum over its top-k experts of
    weight * (act(x @ W1[e]^T + b1) @ W2[e]^T + b2). See the op spec for shapes,
    methods and activations; arguments map one to one onto the op's schema.

    Raises:
        ValueError: an argument of the wrong Python type (a bool is not an int,
            a string is not a number), naming it; the op raises RuntimeError for
            the rest of the spec's bad inputs.
    """
    return torch.ops.moe_xarch.fused_experts_cpu(
        hidden_states,
        w1,
        w2,
        topk_weights,
        topk_ids,
        _strict_bool("inplace", inplace),
        _strict_int("moe_comp_method", moe_comp_method),
        w1_scale,
        w2_scale,
        w1_zero,
        w2_zero,
        None if block_size is None else _strict_ints("block_size", block_size),
        w1_bias,
        w2_bias,
        None if alpha is None else _strict_float("alpha", alpha),
        None if limit is None else _strict_float("limit", limit),
        _strict_bool("is_vnni", is_vnni),
    )


# The op's schema converts what it can (an int for a bool, a float for an int
# in some paths); the wrapper takes each argument only in its own type.
def _strict_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")
    return value


def _strict_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    return int(value)


def _strict_ints(name: str, values: object) -> list[int]:
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"{name} must be a list or tuple of ints, got {values!r} ({type(values).__name__})")
    return [_strict_int(f"{name}[{i}]", v) for i, v in enumerate(values)]


def _strict_float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a float, got {value!r} ({type(value).__name__})")
    return float(value)


def convert_weight_packed(weight: Tensor, moe_comp_method: int) -> Tensor:
    """Packs [E, rows, cols] weights for this machine's kernels (pass is_vnni=True)."""
    return torch.ops.moe_xarch.convert_weight_packed(weight, _strict_int("moe_comp_method", moe_comp_method))


def isa() -> str:
    """The kernel path in use, e.g. "avx512_bf16" or "neon" (MOE_XARCH_ISA forces a lower one)."""
    return torch.ops.moe_xarch.isa()


def supported_isas() -> list[str]:
    """Every kernel path this CPU can run, lowest first."""
    return list(torch.ops.moe_xarch.supported_isas())


KernelUse = dict[str, dict[str, int]]
"""Calls per kernel kind and per level whose code ran: {"gemm_s8": {"i8mm": 12, "dotprod": 3}}."""


def kernel_use(since: Mapping[str, Mapping[str, int]] | None = None) -> KernelUse:
    """The kernels that ran in this process since the library loaded, by kind and by the
    level whose code ran ("core": the driver's own, e.g. packing) - not the selected level.

    The counters only grow, so nothing another caller does can lose counts: for the
    calls of a stretch of work, pass an earlier reading as ``since``.
    """
    totals: KernelUse = json.loads(torch.ops.moe_xarch.kernel_use())
    if since is None:
        return totals
    calls: KernelUse = {}
    for kind, levels in totals.items():
        before = since.get(kind, {})
        ran = {level: n - before.get(level, 0) for level, n in levels.items() if n > before.get(level, 0)}
        if ran:
            calls[kind] = ran
    return calls


@torch.library.register_fake("moe_xarch::fused_experts_cpu")
def _fused_experts_cpu_fake(hidden_states: Tensor, *args: object) -> Tensor:
    # The dispatcher picks this kernel when any argument is on the meta device,
    # whatever the others are on: a mixed call must fail here, as on the CPU.
    arguments = torch.ops.moe_xarch.fused_experts_cpu.default._schema.arguments[1:]
    for argument, value in zip(arguments, args):
        if isinstance(value, Tensor) and value.device != hidden_states.device:
            raise RuntimeError(
                f"fused_experts_cpu: {argument.name} must be on hidden_states' device "
                f"({hidden_states.device}), got a tensor on {value.device}"
            )
    return torch.empty_like(hidden_states)


@torch.library.register_fake("moe_xarch::convert_weight_packed")
def _convert_weight_packed_fake(weight: Tensor, moe_comp_method: int) -> Tensor:
    experts, rows, cols = weight.shape
    nbytes = torch.ops.moe_xarch.packed_nbytes(rows, cols, weight.dtype)
    return weight.new_empty((experts, nbytes), dtype=torch.uint8)
