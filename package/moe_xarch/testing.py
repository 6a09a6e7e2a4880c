"""Test support for ``fused_experts_cpu``: the contract's tolerances and input builders, and
where its packed weights lie in memory.

The tolerances live here and nowhere else. ``make_moe_problem`` builds inputs for
any method whose keyword arguments go unchanged to the wrapper
(``moe_xarch.fused_experts``), the reference (``moe_xarch.reference``) and,
through ``schema_args``, the raw op.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

import moe_xarch
from moe_xarch.ops import MoeCompMethod
from moe_xarch.quant import quantize_fp8_block, quantize_int4, quantize_int8_per_channel, quantize_mxfp4
from moe_xarch.reference import INT8_ACTIVATION_METHODS

__all__ = [
    "ACTIVATIONS",
    "DTYPE_TOLERANCE",
    "HUGE_PAGE",
    "INT8_ACTIVATION_TOLERANCE",
    "MoeProblem",
    "Tolerance",
    "applied_tolerances",
    "assert_matches_reference",
    "covering_array",
    "make_moe_problem",
    "sample_problems",
    "schema_args",
    "tolerance",
    "tolerance_key",
    "vm_flags",
    "whole_huge_page",
]

# Max abs and rel error against the reference, from the op contract: of UNQUANT
# and of the methods with activations as given (FP8_W8A16, MXFP4).
DTYPE_TOLERANCE: Mapping[torch.dtype, float] = {
    torch.float32: 1e-4,
    torch.bfloat16: 2e-2,
    torch.float16: 5e-3,
}
# The methods quantizing activations to int8 (INT8_W8A8, INT4_W4A8): relative to
# the output's scale, max|reference|.
INT8_ACTIVATION_TOLERANCE = 3e-2

# The activation variants by name: the alpha/limit keyword arguments they take.
# The limit is small enough to clamp a good share of O(1) pre-activations.
ACTIVATIONS: Mapping[str, Mapping[str, float]] = {
    "silu": {},
    "swiglu": {"alpha": 1.702},
    "swiglu_limit": {"alpha": 1.702, "limit": 1.0},
}


@dataclass(frozen=True)
class Tolerance:
    """``|actual - expected| <= atol + rtol * |expected|``, elementwise.

    With ``relative_to_output_scale`` the atol is ``atol * max|expected|``.
    """

    rtol: float
    atol: float
    relative_to_output_scale: bool = False

    def atol_for(self, expected: torch.Tensor) -> float:
        if not self.relative_to_output_scale or expected.numel() == 0:
            return self.atol
        return self.atol * expected.float().abs().max().item()


def tolerance(moe_comp_method: int, dtype: torch.dtype) -> Tolerance:
    """The contract's tolerance for a method and output dtype."""
    if int(moe_comp_method) in INT8_ACTIVATION_METHODS:
        return Tolerance(rtol=INT8_ACTIVATION_TOLERANCE, atol=INT8_ACTIVATION_TOLERANCE, relative_to_output_scale=True)
    return Tolerance(rtol=DTYPE_TOLERANCE[dtype], atol=DTYPE_TOLERANCE[dtype])


def tolerance_key(moe_comp_method: int, dtype: torch.dtype) -> str:
    """``"INT8_W8A8/bfloat16"``: how the run's record names a (method, dtype)."""
    return f"{MoeCompMethod(int(moe_comp_method)).name}/{str(dtype).removeprefix('torch.')}"


# What assert_matches_reference applied in this process, by tolerance_key: the suite
# writes it into the run's record, and the matrix's verdict proves that every run
# compared each (method, dtype) alike (the contract promises one tolerance everywhere).
_applied: dict[str, dict[str, Any]] = {}


def applied_tolerances() -> dict[str, dict[str, Any]]:
    """Each (method, dtype) compared so far, by tolerance_key: its Tolerance's fields."""
    return {key: dict(fields) for key, fields in _applied.items()}


def assert_matches_reference(
    actual: torch.Tensor, expected: torch.Tensor, moe_comp_method: int, dtype: torch.dtype
) -> None:
    """Assert ``actual`` equals the reference output within the contract's tolerance."""
    tol = tolerance(moe_comp_method, dtype)
    _applied[tolerance_key(moe_comp_method, dtype)] = dataclasses.asdict(tol)
    torch.testing.assert_close(
        actual, expected, rtol=tol.rtol, atol=tol.atol_for(expected), check_device=False
    )


@dataclass(frozen=True)
class MoeProblem:
    """One set of op inputs, with unpacked weights; ``kwargs()`` hands them out."""

    arguments: Mapping[str, Any]

    @property
    def dtype(self) -> torch.dtype:
        return self.arguments["hidden_states"].dtype

    @property
    def moe_comp_method(self) -> int:
        return self.arguments["moe_comp_method"]

    @functools.cached_property
    def _packed_weights(self) -> dict[str, torch.Tensor]:
        method = self.moe_comp_method
        return {
            name: moe_xarch.convert_weight_packed(self.arguments[name], method)
            for name in ("w1", "w2")
        }

    def kwargs(self, *, packed: bool = False, **overrides: Any) -> dict[str, Any]:
        """Every argument by name, with a fresh copy of hidden_states (inplace may
        overwrite it). ``packed`` swaps in convert_weight_packed weights and sets
        is_vnni; ``overrides`` replace or add arguments."""
        kwargs = dict(self.arguments, hidden_states=self.arguments["hidden_states"].clone())
        if packed:
            kwargs.update(self._packed_weights, is_vnni=True)
        kwargs.update(overrides)
        return kwargs

    def run(self, fn: Callable[..., torch.Tensor], **kwargs: Any) -> torch.Tensor:
        """``fn(**self.kwargs(**kwargs))``."""
        return fn(**self.kwargs(**kwargs))


def make_moe_problem(
    M: int,
    K: int,
    N: int,
    E: int,
    topk: int,
    dtype: torch.dtype = torch.bfloat16,
    moe_comp_method: int = MoeCompMethod.UNQUANT,
    bias: bool = False,
    activation: str = "silu",
    seed: int = 0,
    *,
    block_size: Sequence[int] = (16, 32),
    group_size: int = 32,
    zero_points: bool = True,
    ids_dtype: torch.dtype = torch.int32,
    bias_dtype: torch.dtype | None = None,
    unused_slot_fraction: float = 0.125,
) -> MoeProblem:
    """Random inputs for ``M`` tokens, hidden size ``K``, intermediate size ``N``,
    ``E`` experts and ``topk`` slots per token.

    Weights are scaled by 1/sqrt(fan-in) so every stage is O(1). Quantized methods
    quantize the same float weights with ``moe_xarch.quant``; FP8 uses
    ``block_size``, INT4_W4A8 ``group_size`` (dividing K and N) and, unless
    ``zero_points`` is False, zero points (else None: zero point 8). The 4-bit
    methods need K and N to be multiples of 32. Each token has ``topk`` distinct experts; about
    ``unused_slot_fraction`` of the slots are -1, but never all of a row's.
    Biases, when asked for, are in ``bias_dtype`` (default: ``dtype``).
    """
    if topk > E:
        raise ValueError(f"topk: {topk} distinct experts per token need E >= topk, got E={E}")
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    w1 = randn(E, 2 * N, K, scale=1 / math.sqrt(K))
    w2 = randn(E, K, N, scale=1 / math.sqrt(N))
    arguments: dict[str, Any] = {
        "hidden_states": randn(M, K).to(dtype),
        "moe_comp_method": int(moe_comp_method),
        "w1_scale": None,
        "w2_scale": None,
        "w1_zero": None,
        "w2_zero": None,
        "block_size": None,
        "w1_bias": None,
        "w2_bias": None,
        "alpha": None,
        "limit": None,
    }
    if moe_comp_method == MoeCompMethod.UNQUANT:
        w1, w2 = w1.to(dtype), w2.to(dtype)
    elif moe_comp_method == MoeCompMethod.INT8_W8A8:
        (w1, arguments["w1_scale"]), (w2, arguments["w2_scale"]) = map(
            quantize_int8_per_channel, (w1, w2)
        )
    elif moe_comp_method == MoeCompMethod.FP8_W8A16:
        arguments["block_size"] = list(block_size)
        (w1, arguments["w1_scale"]), (w2, arguments["w2_scale"]) = (
            quantize_fp8_block(w, block_size) for w in (w1, w2)
        )
    elif moe_comp_method == MoeCompMethod.INT4_W4A8:
        (w1, arguments["w1_scale"], arguments["w1_zero"]), (w2, arguments["w2_scale"], arguments["w2_zero"]) = (
            quantize_int4(w, group_size, symmetric=not zero_points) for w in (w1, w2)
        )
    elif moe_comp_method == MoeCompMethod.MXFP4:
        (w1, arguments["w1_scale"]), (w2, arguments["w2_scale"]) = map(quantize_mxfp4, (w1, w2))
    else:
        raise ValueError(f"moe_comp_method: no problem builder for {moe_comp_method}")

    # topk distinct experts per token: the first topk of a random permutation.
    topk_ids = torch.rand(M, E, generator=gen).argsort(dim=1)[:, :topk]
    unused = torch.rand(M, topk, generator=gen) < unused_slot_fraction
    unused[torch.arange(M), torch.randint(topk, (M,), generator=gen)] = False
    topk_ids = topk_ids.masked_fill(unused, -1).to(ids_dtype)
    topk_weights = torch.rand(M, topk, generator=gen) + 0.1
    topk_weights /= topk_weights.sum(dim=1, keepdim=True)

    if bias:
        arguments["w1_bias"] = randn(E, 2 * N, scale=0.5).to(bias_dtype or dtype)
        arguments["w2_bias"] = randn(E, K, scale=0.5).to(bias_dtype or dtype)
    arguments.update(ACTIVATIONS[activation])
    arguments.update(w1=w1, w2=w2, topk_weights=topk_weights, topk_ids=topk_ids)
    return MoeProblem(arguments)


def sample_problems() -> Iterator[tuple[str, MoeProblem]]:
    """A few small, named problems that together touch every method (for opcheck)."""
    yield "unquant-bf16-silu", make_moe_problem(5, 32, 16, 4, 2, torch.bfloat16)
    yield "int8-fp32-swiglu-bias", make_moe_problem(
        3, 48, 24, 3, 2, torch.float32, MoeCompMethod.INT8_W8A8, bias=True, activation="swiglu", seed=1
    )
    yield "fp8-fp16-swiglu_limit", make_moe_problem(
        4, 64, 32, 4, 3, torch.float16, MoeCompMethod.FP8_W8A16, activation="swiglu_limit", seed=2
    )
    yield "int4-zeros", make_moe_problem(3, 64, 32, 4, 2, torch.bfloat16, MoeCompMethod.INT4_W4A8)
    yield "int4-no-zeros-g64", make_moe_problem(
        3, 128, 64, 4, 2, torch.float16, MoeCompMethod.INT4_W4A8, group_size=64, zero_points=False
    )
    yield "mxfp4", make_moe_problem(3, 64, 32, 4, 2, torch.float32, MoeCompMethod.MXFP4, bias=True)


# Values of the op's arguments that the wrapper and the reference default.
_SCHEMA_DEFAULTS = {"inplace": False, "moe_comp_method": int(MoeCompMethod.UNQUANT), "is_vnni": False}


def schema_args(op: torch._ops.OpOverload, kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """The positional arguments of ``op`` (in schema order) from keyword ones.

    Raises KeyError for a keyword the schema does not have, so a drifted schema
    shows up as a test error rather than a silently dropped argument.
    """
    names = [arg.name for arg in op._schema.arguments]
    unknown = set(kwargs) - set(names)
    if unknown:
        raise KeyError(f"not arguments of {op._schema.name}: {sorted(unknown)}")
    return tuple(kwargs.get(name, _SCHEMA_DEFAULTS.get(name)) for name in names)


def covering_array(factors: Mapping[str, Sequence[Any]], strength: int) -> list[dict[str, Any]]:
    """Rows (one value per factor) such that every combination of values of any
    ``strength`` factors appears in at least one row.

    Greedy and deterministic: each step takes the first row of the full product
    that covers the most combinations not yet covered. ``strength`` >= the number
    of factors gives the full product.
    """
    names = list(factors)
    sizes = [len(factors[name]) for name in names]
    candidates = torch.tensor(list(itertools.product(*map(range, sizes))), dtype=torch.long)
    # For each group of `strength` factors: which of its combinations each candidate covers.
    combination_of, uncovered = [], []
    for group in itertools.combinations(range(len(names)), min(strength, len(names))):
        index = torch.zeros(len(candidates), dtype=torch.long)
        for f in group:
            index = index * sizes[f] + candidates[:, f]
        combination_of.append(index)
        uncovered.append(torch.ones(math.prod(sizes[f] for f in group), dtype=torch.bool))
    rows = []
    while any(u.any() for u in uncovered):
        gain = sum(u[index].int() for u, index in zip(uncovered, combination_of))
        best = int(gain.argmax())
        rows.append(best)
        for u, index in zip(uncovered, combination_of):
            u[index[best]] = False
    return [
        {name: factors[name][int(candidates[row, f])] for f, name in enumerate(names)}
        for row in rows
    ]


HUGE_PAGE = 2 << 20  # a transparent huge page, as csrc/core/packing.cpp advises them


def whole_huge_page(tensor: torch.Tensor) -> int:
    """The address of the first whole 2 MiB page inside the tensor's bytes."""
    start = tensor.data_ptr()
    first = -(-start // HUGE_PAGE) * HUGE_PAGE
    if first + HUGE_PAGE > start + tensor.numel() * tensor.element_size():
        raise ValueError(f"a tensor of {tensor.numel() * tensor.element_size()} bytes at {start:#x} holds no whole "
                         "2 MiB page")
    return first


def vm_flags(address: int) -> set[str]:
    """The VmFlags of this process's mapping that holds ``address`` (/proc/self/smaps): "hg" where it
    is advised onto transparent huge pages. No flags where no mapping holds it (an emulator's smaps may be
    its own, with the guest's memory elsewhere)."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
            if head:
                inside = int(head[1], 16) <= address < int(head[2], 16)
            elif inside and line.startswith("VmFlags:"):
                return set(line.split()[1:])
    return set()
