"""A contender's output checked with moe_xarch.testing's tolerance, and pure torch against the reference."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("moe_xarch")

from moe_xarch import MoeCompMethod, reference, testing  # noqa: E402

from benchmarks import contenders, verify, workload  # noqa: E402


@pytest.mark.parametrize("method", ["bf16", "int8"])
@pytest.mark.parametrize("factor, ok", [(0.99, True), (1.01, False)])
def test_an_error_just_over_moe_xarch_testings_tolerance_fails(method: str, factor: float, ok: bool) -> None:
    ref = torch.tensor([1.0, -2.0, 0.5, 0.25])
    tolerance = testing.tolerance(workload.METHODS[method], ref.dtype)
    allowed = tolerance.atol_for(ref) + tolerance.rtol * ref.abs()
    out = ref.clone()
    out[2] += factor * allowed[2]
    check = verify.check(out, ref, method)
    assert check["ok"] is ok
    assert check["rel_error"] == pytest.approx(float(factor * allowed[2] / 2.0), rel=1e-3)
    assert check["why"] == ("" if ok else f"computes something else: max error {check['rel_error']:.3g} of the "
                            f"output's scale vs reference (moe_xarch.testing's tolerance: "
                            f"{verify.describe(tolerance)})")


def test_the_tolerance_is_described_as_moe_xarch_testing_defines_it() -> None:
    assert verify.describe(testing.tolerance(MoeCompMethod.INT8_W8A8, torch.bfloat16)) == \
        f"rtol {testing.INT8_ACTIVATION_TOLERANCE:g}, atol {testing.INT8_ACTIVATION_TOLERANCE:g} of the output's scale"
    bf16 = testing.DTYPE_TOLERANCE[torch.bfloat16]
    assert verify.describe(testing.tolerance(MoeCompMethod.UNQUANT, torch.bfloat16)) == f"rtol {bf16:g}, atol {bf16:g}"


def test_a_contender_that_raises_is_reported_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    shape = workload.MoeShape("tiny", experts=4, topk=2, hidden=64, inter=32)
    generator = torch.Generator().manual_seed(0)
    weights = workload.prepare_method("bf16", *workload.make_weights(shape, generator))
    checks = verify.verify(shape, "bf16", weights, None, None, None, generator)
    assert checks["moe_xarch"]["ok"], checks

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no kernel here\nsecond line")

    monkeypatch.setattr(verify.moe_xarch, "fused_experts", boom)
    assert verify.verify(shape, "bf16", weights, None, None, None, generator) == {
        "moe_xarch": {"ok": False, "why": "fails: no kernel here"}}


@pytest.mark.parametrize("swiglu", [False, True])
def test_pure_torch_computes_what_the_reference_does(swiglu: bool) -> None:
    shape = workload.MoeShape("tiny", experts=4, topk=2, hidden=64, inter=32, swiglu=swiglu)
    generator = torch.Generator().manual_seed(0)
    w1, w2 = (w.float() for w in workload.make_weights(shape, generator))
    b1, b2 = workload.make_biases(shape, generator)
    x = torch.randn(5, shape.hidden, generator=generator)
    topk_weights, topk_ids = workload.make_routings(shape, 5, generator, count=1)[0]
    act = workload.activation_kwargs(shape)
    out = contenders.torch_baseline(x, w1, w2, topk_weights, topk_ids, b1, b2, **act)
    ref = reference.fused_experts(x, w1, w2, topk_weights, topk_ids, w1_bias=b1, w2_bias=b2, **act)
    testing.assert_matches_reference(out, ref, MoeCompMethod.UNQUANT, torch.float32)
