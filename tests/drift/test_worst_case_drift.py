"""Two drifts no random input shows, caught on a native build of a scratch tree.

- An integer accumulator allowed past its type: avx2's W4A8 register tiles
  (few rows of a) sum int16 pair sums over 8 steps of 64 values before
  widening, not 4 (30,480 at most; 8 steps reach 60,960), or its panel kernel
  (more rows) over 9 lines, not 8 (30,480; 9 reach 34,290). Their numbers stay
  right for every random input, so the int4 cases of
  tests/kernels/test_fused_experts.py pass, while tests/kernels/test_worst_case.py
  fails at avx2, naming the cases that reach past the span: groups of 320
  values and more (5 steps and up) at one token and three, groups of 256 and
  more (9 lines and up) at seven. On an aarch64 host, the generic level's W4A8 group
  dot in int16 (32 values of 15 * 127 reach 60,960).
- A comparison loosened on one architecture: assert_matches_reference with the
  bf16 tolerance times 20 on this host's architecture. The every-run test
  tests/kernels/test_tolerances.py fails for each bf16 (method, dtype), and the
  summary, judging the drifted run beside a pristine one as the matrix does,
  fails it naming the run and each (method, dtype) compared otherwise.
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass

import pytest

from harness.proving.summary import failure_lines, judge_all
from harness.running.suite import RunRecord
from tests.drift.support import FAILED, this_hosts

pytestmark = pytest.mark.native_build  # nox -s drift-native: the tree built natively


@dataclass(frozen=True)
class Drift:
    level: str
    source: str
    pristine: str  # text of source that the drift replaces
    drifted: str
    caught: str  # the test IDs of test_worst_case.py that must fail, as a pattern


OVERFLOWS = {
    "x86_64": (
        Drift(level="avx2", source="csrc/arch/x86/gemm_avx2.cpp",
              pristine="constexpr int64_t kInt16Steps = 4;", drifted="constexpr int64_t kInt16Steps = 8;",
              caught=r"test_int4_at_its_bounds\[M[13]-(un)?packed-g(320|640-nozero)\]"),
        Drift(level="avx2", source="csrc/arch/x86/gemm_avx2.cpp",
              pristine="static constexpr int kInt16Lines = 8;", drifted="static constexpr int kInt16Lines = 9;",
              caught=r"test_int4_at_its_bounds\[M7-(un)?packed-g(256|320|640-nozero)\]"),
    ),
    "aarch64": (
        Drift(level="generic", source="csrc/generic/gemm_int4_generic.cpp",
              pristine="int32_t dot = 0, sum_a = 0;", drifted="int16_t dot = 0, sum_a = 0;",
              caught=r"test_int4_at_its_bounds\[.*\]"),
    ),
}
WORST_CASE_TEST = "tests/kernels/test_worst_case.py"
TOLERANCE_TEST = "tests/kernels/test_tolerances.py"
TESTING = "package/moe_xarch/testing.py"
# The loosening: the comparison's own call, so the tolerance it records stays the contract's.
COMPARISON = "actual, expected, rtol=tol.rtol, atol=tol.atol_for(expected), check_device=False"
LOOSENED = ("actual, expected, rtol=tol.rtol * loose(dtype), atol=tol.atol_for(expected) * loose(dtype), "
            "check_device=False")
RECORDED = "_applied[tolerance_key(moe_comp_method, dtype)] = dataclasses.asdict(tol)"
# The recorded tolerance loosened as well, as a drift that changes it before the call would.
RECORDED_LOOSENED = ("tol = Tolerance(tol.rtol * loose(dtype), tol.atol * loose(dtype), tol.relative_to_output_scale)\n"
                     "    " + RECORDED)
# The drifted run's level: a second one every host of the architecture has, beside generic's run.
SECOND_LEVEL = {"x86_64": "avx2", "aarch64": "neon"}


def loose_definition() -> str:
    """The drift's helper, added to testing.py: 20 times for bf16 on this host's architecture."""
    return (f"\n\ndef loose(dtype):\n    import platform\n"
            f"    return 20 if platform.machine() == {platform.machine()!r} and dtype == torch.bfloat16 else 1\n")


@pytest.fixture(scope="module")
def overflows() -> tuple[Drift, ...]:
    return this_hosts(OVERFLOWS, "worst-case drift")


def test_an_int16_span_past_its_bound_fails_the_worst_case_tests_alone(native_tree, overflows):
    for overflow in overflows:
        native_tree.build()  # pristine again after the drift before
        pristine = native_tree.run_suite(overflow.level, WORST_CASE_TEST, "-k", "int4")
        assert pristine.returncode == 0, pristine.stdout + pristine.stderr

        with native_tree.drifted(overflow.source, overflow.pristine, overflow.drifted):
            drifted = native_tree.run_suite(overflow.level, WORST_CASE_TEST, "-k", "int4")
            log = drifted.stdout + drifted.stderr
            assert drifted.returncode == 1, log
            failed = FAILED.findall(drifted.stdout)
            assert failed and all(re.search(overflow.caught, test) for test in failed), log
            assert len(failed) >= 4, log  # both layouts, at least two groups
            # What only the worst case shows: random int4 inputs stay within the span.
            numbers = native_tree.run_suite(overflow.level, "tests/kernels/test_fused_experts.py",
                                            "-k", "int4 and test_matches_reference")
            assert numbers.returncode == 0, numbers.stdout + numbers.stderr


def suite_run(native_tree, report_dir, level: str) -> RunRecord:
    """The tolerance tests and bf16 numbers at `level`, recorded as the harness records a run."""
    result = native_tree.run_suite(level, TOLERANCE_TEST, "tests/kernels/test_fused_experts.py",
                                   "-k", "test_tolerances or (test_prefill_rows and unpacked)",
                                   report_dir=report_dir)
    return RunRecord(platform.machine(), "native", "host", level, level, result.returncode, 1.0, str(report_dir))


@pytest.mark.parametrize("where", ["call", "recorded"])
def test_a_comparison_loosened_on_this_architecture_fails_every_run_of_it(native_tree, tmp_path, where):
    """`call`: the loosening in the comparison's call, whose record stays the contract's:
    the every-run test fails. `recorded`: the tolerance loosened before it is recorded
    too: that test fails, and the verdict names each (method, dtype) that differs."""
    native_tree.build()
    pristine = suite_run(native_tree, tmp_path / "pristine", "generic")
    assert pristine.exit_code == 0
    edit = (COMPARISON, LOOSENED) if where == "call" else (RECORDED, RECORDED_LOOSENED)
    text = (native_tree.tree / TESTING).read_text()
    (native_tree.tree / TESTING).write_text(text + loose_definition())
    try:
        with native_tree.drifted(TESTING, *edit):
            drifted = suite_run(native_tree, tmp_path / "drifted", this_hosts(SECOND_LEVEL, "second level"))
    finally:
        (native_tree.tree / TESTING).write_text(text)
    rows, verdict = judge_all([pristine, drifted])
    assert rows[0].ok and not rows[1].ok
    lines = "\n".join(failure_lines(rows, verdict))
    failing = [test for test, _ in rows[1].failing]
    assert failing and all(test.startswith(f"{TOLERANCE_TEST}::") and "bfloat16" in test for test in failing), lines
    assert f"full {rows[1].run_id}: FAILED: {len(failing)} failed" in lines, lines
    differing = {drift.key for drift in rows[1].tolerance_drifts}
    if where == "call":
        assert not differing, lines
    else:
        assert differing and all(key.endswith("/bfloat16") for key in differing), lines
        assert "comparisons not as on the other runs" in lines and f"on full {rows[1].run_id}" in lines, lines
