"""Each kernel contender checked against moe_xarch.reference before it is timed.

A contender counts as computing the same thing when its output passes the op
contract's comparison (moe_xarch.testing.assert_matches_reference, with the
tolerance moe_xarch.testing owns for the method and output dtype); one that does
not, or fails to run, is reported and not timed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import moe_xarch
from benchmarks import sglang
from benchmarks.contenders import sglang_weights
from benchmarks.workload import METHODS, MethodWeights, MoeShape, activation_kwargs, make_routings
from moe_xarch import reference, testing

VERIFY_EXPERTS = 8
VERIFY_TOKENS = 7


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|: how far off a contender is, in the output's scale."""
    return float((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp(min=1e-30))


def describe(tolerance: testing.Tolerance) -> str:
    scale = " of the output's scale" if tolerance.relative_to_output_scale else ""
    return f"rtol {tolerance.rtol:g}, atol {tolerance.atol:g}{scale}"


def check(out: torch.Tensor, ref: torch.Tensor, method: str) -> dict[str, object]:
    """The verdict on one output: ok, its relative error, and why it is not ok."""
    error = relative_error(out, ref)
    try:
        testing.assert_matches_reference(out, ref, METHODS[method], ref.dtype)
    except AssertionError:
        tolerance = testing.tolerance(METHODS[method], ref.dtype)
        return {"ok": False, "rel_error": error,
                "why": f"computes something else: max error {error:.3g} of the output's scale vs reference "
                       f"(moe_xarch.testing's tolerance: {describe(tolerance)})"}
    return {"ok": True, "rel_error": error, "why": ""}


def verify(shape: MoeShape, method: str, weights: MethodWeights, b1: torch.Tensor | None, b2: torch.Tensor | None,
           sg_ops: object | None, generator: torch.Generator) -> dict[str, dict[str, object]]:
    """Each kernel against moe_xarch.reference on a few experts of this shape (same K, N, activation)."""
    experts = min(shape.experts, VERIFY_EXPERTS)
    x = torch.randn(VERIFY_TOKENS, shape.hidden, generator=generator).to(torch.bfloat16)
    tw, ids = make_routings(shape, VERIFY_TOKENS, generator, count=1, experts=experts)[0]
    w1, w2 = weights.w1[:experts], weights.w2[:experts]
    kwargs = {k: (v[:experts] if isinstance(v, torch.Tensor) else v) for k, v in weights.kwargs.items()}
    bias = {"w1_bias": None if b1 is None else b1[:experts], "w2_bias": None if b2 is None else b2[:experts]}
    act = activation_kwargs(shape)
    ref = reference.fused_experts(x, w1, w2, tw, ids, moe_comp_method=METHODS[method], **kwargs, **bias, **act)
    runs: dict[str, Callable[[], torch.Tensor]] = {
        "moe_xarch": lambda: moe_xarch.fused_experts(
            x, moe_xarch.convert_weight_packed(w1, METHODS[method]),
            moe_xarch.convert_weight_packed(w2, METHODS[method]), tw, ids, moe_comp_method=METHODS[method],
            is_vnni=True, **kwargs, **bias, **act),
    }
    if sg_ops is not None:
        def run_sglang() -> torch.Tensor:
            p1, p2, sg_kwargs = sglang_weights(sg_ops, method, w1, w2, kwargs)
            return sglang.fused_experts(sg_ops, torch.empty_like(x), x, p1, p2, tw, ids, METHODS[method],
                                        **sg_kwargs, **bias, **act)
        runs["sglang"] = run_sglang
    checks = {}
    for name, run in runs.items():
        try:
            checks[name] = check(run(), ref, method)
        except Exception as exc:  # noqa: BLE001  (a contender that fails is reported, not fatal)
            checks[name] = {"ok": False, "why": f"fails: {str(exc).strip().splitlines()[0][:200]}"}
    return checks
