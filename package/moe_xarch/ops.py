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
            the rest of the spec's bad inputs. 4-bit scale and zero-point values
            are checked in the experts the call's tokens are routed to (the ones
            it reads).
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


def isa_levels() -> list[str]:
    """Every kernel path this build carries, lowest first, whether this CPU runs it or not."""
    return list(torch.ops.moe_xarch.isa_levels())


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


# The one-byte dtypes the C++ op names 4-bit weights by in packed headers (they
# arrive as uint8, two values a byte).
_FOUR_BIT_DTYPES = {MoeCompMethod.INT4_W4A8: torch.quint4x2, MoeCompMethod.MXFP4: torch.float4_e2m1fn_x2}
# INT4_W4A8's group size is a multiple of it; MXFP4's blocks are this long.
_BLOCK = 32


def _fail(*message: object) -> None:
    raise RuntimeError("fused_experts_cpu: " + "".join(map(str, message)))


def _check_int4_groups(scale: object, zero: object, weight: str, rows: int, cols: int, dim: str,
                       experts: int, block_size: object) -> None:
    name = f"{weight}_scale"
    if not isinstance(scale, Tensor):
        _fail(name, " is required for INT4_W4A8 (float32 [E, ", rows, ", ", dim, " / G], G the group size)")
    if scale.dtype != torch.float32:
        _fail(name, " must be float32, got ", scale.dtype)
    if scale.dim() != 3 or scale.shape[0] != experts or scale.shape[1] != rows or scale.shape[2] <= 0:
        _fail(name, " must have shape [E, ", rows, ", ", dim, " / G] = [", experts, ", ", rows, ", ", dim,
              " / G], got ", list(scale.shape))
    groups = scale.shape[2]
    if cols % groups:
        _fail(name, " has ", groups, " groups a row, which do not divide ", dim, " = ", cols, " (the group size G = ",
              dim, " / ", name, ".shape[-1] must divide ", dim, ")")
    group = cols // groups
    if group % _BLOCK:
        _fail(name, " gives a group size G = ", dim, " / ", groups, " = ", group, ", which is not a multiple of ",
              _BLOCK)
    if block_size is not None and list(block_size) != [1, group]:
        _fail("block_size must be None or [1, G] = [1, ", group, "] for INT4_W4A8 (G from ", name, "), got ",
              list(block_size))
    if zero is None:
        return
    if not isinstance(zero, Tensor) or zero.dtype != torch.uint8:
        _fail(f"{weight}_zero must be uint8 (zero points in [0, 15]), got ", getattr(zero, "dtype", zero))
    if zero.shape != scale.shape:
        _fail(f"{weight}_zero must have shape ", list(scale.shape), ", got ", list(zero.shape))


def _check_mx_scale(scale: object, weight: str, rows: int, cols: int, dim: str, experts: int) -> None:
    name = f"{weight}_scale"
    if cols % _BLOCK:
        _fail("MXFP4 needs the reduction dimension of ", weight, " (", dim, ") to be a multiple of ", _BLOCK,
              " (its blocks), got ", dim, " = ", cols)
    if not isinstance(scale, Tensor):
        _fail(name, " is required for MXFP4 (uint8 E8M0 scales [E, ", rows, ", ", dim, " / ", _BLOCK, "])")
    if scale.dtype != torch.uint8:
        _fail(name, " must be uint8 (E8M0 scales), got ", scale.dtype)
    if list(scale.shape) != [experts, rows, cols // _BLOCK]:
        _fail(name, " must have shape ", [experts, rows, cols // _BLOCK], ", got ", list(scale.shape))


def _check_four_bit(method: MoeCompMethod, a: Mapping[str, object]) -> None:
    """The shape and dtype checks of the CPU op for 4-bit weights, on fake tensors:
    what needs values (zeros in [0, 15], no scale byte 255) is the CPU op's alone."""
    x, w1, w2 = a["hidden_states"], a["w1"], a["w2"]
    if method != MoeCompMethod.INT4_W4A8:
        for name in ("w1_zero", "w2_zero"):
            if a[name] is not None:
                _fail(name, " is only used by INT4_W4A8, not ", method.name)
    if x.dim() != 2:
        _fail("hidden_states must be 2-D [M, K], got ", x.dim(), "-D")
    K = x.shape[1]
    if K % 2:
        _fail("hidden_states must have an even K for ", method.name, " (two 4-bit values a byte), got K = ", K)
    experts = w1.shape[0]
    if a["is_vnni"]:
        # Packed weights keep their shapes in their headers; the scales give N.
        scale = a["w1_scale"]
        if not isinstance(scale, Tensor) or scale.dim() != 3:
            _fail("w1_scale is required for ", method.name, " (3-D [E, 2N, K / G])")
        N = scale.shape[1] // 2
    else:
        for name, w in (("w1", w1), ("w2", w2)):
            if w.dtype != torch.uint8:
                _fail(name, " must be uint8 (two 4-bit values a byte) for ", method.name, ", got ", w.dtype)
            if w.dim() != 3:
                _fail(name, " must be 3-D [E, rows, cols / 2], got ", w.dim(), "-D")
        if w1.shape[2] * 2 != K or w1.shape[1] % 4:
            _fail("w1 must be [E, 2N, K / 2] with K = ", K, " and an even N, got ", list(w1.shape))
        N = w1.shape[1] // 2
        if list(w2.shape) != [experts, K, N // 2]:
            _fail("w2 must be [E, K, N / 2] = ", [experts, K, N // 2], " to match w1 and hidden_states, got ",
                  list(w2.shape))
    if method == MoeCompMethod.INT4_W4A8:
        _check_int4_groups(a["w1_scale"], a["w1_zero"], "w1", 2 * N, K, "K", experts, a["block_size"])
        _check_int4_groups(a["w2_scale"], a["w2_zero"], "w2", K, N, "N", experts, a["block_size"])
    else:
        if a["block_size"] is not None and list(a["block_size"]) != [1, _BLOCK]:
            _fail("block_size must be None or [1, ", _BLOCK, "] for MXFP4 (blocks of ", _BLOCK,
                  " along the reduction dimension), got ", list(a["block_size"]))
        _check_mx_scale(a["w1_scale"], "w1", 2 * N, K, "K", experts)
        _check_mx_scale(a["w2_scale"], "w2", K, N, "N", experts)


@torch.library.register_fake("moe_xarch::fused_experts_cpu")
def _fused_experts_cpu_fake(hidden_states: Tensor, *args: object) -> Tensor:
    # The dispatcher picks this kernel when any argument is on the meta device,
    # whatever the others are on: a mixed call must fail here, as on the CPU.
    arguments = torch.ops.moe_xarch.fused_experts_cpu.default._schema.arguments
    for argument, value in zip(arguments[1:], args):
        if isinstance(value, Tensor) and value.device != hidden_states.device:
            raise RuntimeError(
                f"fused_experts_cpu: {argument.name} must be on hidden_states' device "
                f"({hidden_states.device}), got a tensor on {value.device}"
            )
    named = {argument.name: value for argument, value in zip(arguments, (hidden_states, *args))}
    method = named["moe_comp_method"]
    if method in _FOUR_BIT_DTYPES:
        _check_four_bit(MoeCompMethod(method), named)
    return torch.empty_like(hidden_states)


@torch.library.register_fake("moe_xarch::convert_weight_packed")
def _convert_weight_packed_fake(weight: Tensor, moe_comp_method: int) -> Tensor:
    experts, rows, cols = weight.shape
    nbytes = torch.ops.moe_xarch.packed_nbytes(rows, cols, weight.dtype, moe_comp_method)
    return weight.new_empty((experts, nbytes), dtype=torch.uint8)
