"""aarch64 drift that only a CPU model shows, proved under QEMU on any host.

A scratch copy of the tree is cross-compiled into an aarch64 wheel (the cross
builder's toolchain, harness/building/cross.py) and a selection of tests/kernels runs on it
in the aarch64 test image under the i8mm level's CPU model, as the harness runs a
suite (harness/running/suite.py): it passes. Then gemm_i8mm.cpp is drifted, the wheel
rebuilt (that file and the link), and the drift's part of the selection must fail,
judged as the summary judges a run: each failing test named, with the arch, the
CPU model and the level.

- i8mm's KernelSet hands out dotprod's int8 GEMM: isa() still says i8mm and the
  numbers are right, so only tests/kernels/test_kernel_use.py can tell.
- i8mm's bf16 GEMM drops its K tail (K not a multiple of 8): a wrong number that
  only a test with such a K, at least two rows of a per expert and unpacked
  weights reaches (packed rows are padded to whole vectors).
- assert_matches_reference (package/moe_xarch/testing.py, in the wheel) loosens
  the bf16 tolerance 20 times on aarch64: every number passes, so only the
  every-run tests/kernels/test_tolerances.py can tell.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.building import cross, versioning
from harness.common import console
from harness.common.paths import IMAGE_CONTEXTS
from harness.plan import runners
from harness.plan.targets import load_targets
from harness.proving.summary import Row, failure_lines, judge
from harness.running import suite
from harness.setup import images
from tests.drift.support import drift_source

# Minutes: a cross build and emulated runs in the aarch64 test image, which the matrix makes.
pytestmark = pytest.mark.emulated_build

LEVEL = "i8mm"
SOURCE = "csrc/arch/arm/gemm_i8mm.cpp"
VERSION = "0.0.0"  # the scratch tree has no git history to tell it


@dataclasses.dataclass(frozen=True)
class Drift:
    name: str  # of its wheel and report dir
    pristine: str  # text of source that the drift replaces
    drifted: str
    selection: str  # pytest -k: the tests that must catch it
    source: str = SOURCE


RUNS_DOTPRODS_INT8_GEMM = Drift(
    name="runs-dotprods-int8-gemm",
    pristine="set.gemm_s8 = gemm_s8;",
    drifted="set.gemm_s8 = dotprod::gemm_s8;",
    selection="test_the_level_runs_its_own_kernels and int8",
)
# The int8 numbers the drift leaves right (test_fused_experts.py's int8 cases).
INT8_NUMBERS = "test_matches_reference and int8-bf16"
# mmla_tile serves both GEMMs; only the bf16 one (2-byte elements) loses its tail.
DROPS_BF16_K_TAIL = Drift(
    name="drops-bf16-k-tail",
    pristine="if (p < k) {",
    drifted="if (p < k && sizeof(T) == 1) {",
    selection="test_matches_reference and unquant-bf16",
)
# Before the tolerance is recorded: the run's record says so too (the verdict's part).
LOOSENED_ON_AARCH64 = Drift(
    name="loosened-comparison",
    source="package/moe_xarch/testing.py",
    pristine="tol = tolerance(moe_comp_method, dtype)\n",
    drifted=("tol = tolerance(moe_comp_method, dtype)\n"
             "    if __import__(\"platform\").machine() == \"aarch64\" and dtype == torch.bfloat16:\n"
             "        tol = Tolerance(tol.rtol * 20, tol.atol * 20, tol.relative_to_output_scale)\n"),
    selection="test_the_comparison_rejects_just_over_the_tolerance_and_accepts_just_under",
)
SHAPE = re.compile(r"-K(\d+)N(\d+)E")


@dataclasses.dataclass
class Scratch:
    tree: Path
    work: Path
    image: str
    run: runners.SuiteRun  # the i8mm level's CPU model, as the test session plans it

    def wheel(self, name: str) -> Path:
        """The tree's aarch64 wheel, built (or brought up to date) in one build dir.

        Unrepaired, as the coverage build's: the test image's torch carries the libraries it links."""
        output = self.work / "wheels" / name
        command = cross.pip_wheel_command(sys.executable, self.tree, output,
                                          ["-C", f"build-dir={self.work / 'build'}"])
        env = {**os.environ, **cross.cross_env(self.tree, self.run.target, cross.torch_dir(self.run.target)),
               versioning.VARIABLE: VERSION}
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        assert result.returncode == 0, f"the {name} tree did not build for aarch64:\n{result.stdout[-6000:]}{result.stderr}"
        (wheel,) = output.glob("*.whl")
        return wheel

    def suite_run(self, name: str, wheel: Path, selection: str) -> Row:
        """The selection of tests/kernels on the wheel under the CPU model, judged."""
        report_dir = self.work / "reports" / name
        report_dir.mkdir(parents=True)
        # One process: the selection is short, and each xdist worker would import torch once more.
        record = suite.run_once(self.run, "cross", test_image=self.image, wheel=wheel, repo=self.tree,
                                report_dir=report_dir, pytest_args=["-n", "0", "-k", selection])
        return judge(record)

    def drifted(self, drift: Drift, selection: str) -> tuple[Row, str]:
        """The selection on the tree with the drift; the tree is restored after."""
        text = drift_source(self.tree, drift.source, drift.pristine, drift.drifted)
        try:
            row = self.suite_run(drift.name, self.wheel(drift.name), selection)
        finally:
            (self.tree / drift.source).write_text(text)
        return row, report(row)


def report(row: Row) -> str:
    """What the summary says of the run: its result, then each failing test and why."""
    return "\n".join(failure_lines([row], {})) or f"{row.run_id}: {row.result}"


def either(*selections: str) -> str:
    return " or ".join(f"({selection})" for selection in selections)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory, scratch_tree) -> Scratch:
    """The pristine tree, built, passing every selection of this module under the CPU model."""
    aarch64 = load_targets()["aarch64"]
    (run,) = [run for run in runners.planned_runs(aarch64) if run.isa == LEVEL]
    cross.ensure_compiler(aarch64)
    image = images.ensure_images(aarch64, IMAGE_CONTEXTS, console.StepLog(), upto="test")["test"].tag
    work = tmp_path_factory.mktemp("emulated-drift")
    scratch = Scratch(scratch_tree(work / "tree"), work, image, run)
    selection = either(RUNS_DOTPRODS_INT8_GEMM.selection, INT8_NUMBERS, DROPS_BF16_K_TAIL.selection,
                       LOOSENED_ON_AARCH64.selection)
    pristine = scratch.suite_run("pristine", scratch.wheel("pristine"), selection)
    assert pristine.ok and pristine.counts.passed, f"the pristine tree fails:\n{report(pristine)}"
    shutil.rmtree(work / "wheels" / "pristine")
    return scratch


def assert_names_the_run(text: str, row: Row, run: runners.SuiteRun) -> None:
    """The arch, the CPU model, the level and the environment, as the summary names a run."""
    named = f"aarch64 (cross) CPU {run.cpu}, ISA {LEVEL}, {row.record.environment}"
    assert f"{named}: FAILED: {len(row.failing)} failed" in text, text


def test_an_i8mm_level_handing_out_dotprods_int8_gemm_fails_the_kernel_use_test_under_its_cpu_model(scratch):
    row, text = scratch.drifted(RUNS_DOTPRODS_INT8_GEMM, either(RUNS_DOTPRODS_INT8_GEMM.selection, INT8_NUMBERS))
    failing = [test for test, _ in row.failing]
    assert failing and all(test.startswith("tests/kernels/test_kernel_use.py::") for test in failing), text
    assert_names_the_run(text, row, scratch.run)
    for test in failing:
        assert f"`{test}` (failed): AssertionError:" in text, text
    assert f"under isa() = {LEVEL}: gemm_s8: expected {LEVEL}'s kernel, but only dotprod's ran" in text, text
    # What the counters caught, nothing else does: the int8 numbers are right.
    numbers = [test for test in row.outcomes if "test_matches_reference" in test]
    assert numbers and all(row.outcomes[test].outcome == "passed" for test in numbers), text


def test_an_i8mm_bf16_gemm_dropping_its_k_tail_fails_the_suite_under_its_cpu_model(scratch):
    row, text = scratch.drifted(DROPS_BF16_K_TAIL, DROPS_BF16_K_TAIL.selection)
    failing = [test for test, _ in row.failing]
    assert failing, f"no test reaches the i8mm bf16 GEMM's K tail: {text}"
    assert_names_the_run(text, row, scratch.run)
    for test in failing:
        k, n = map(int, SHAPE.search(test).groups())  # the second GEMM's K is N
        assert k % 8 or n % 8, f"{test} failed with no K tail: {text}"
        assert f"`{test}` (failed): AssertionError:" in text, text


def test_a_comparison_loosened_on_aarch64_fails_the_every_run_test_under_its_cpu_model(scratch):
    row, text = scratch.drifted(LOOSENED_ON_AARCH64, LOOSENED_ON_AARCH64.selection)
    failing = [test for test, _ in row.failing]
    assert failing and all(test.startswith("tests/kernels/test_tolerances.py::") and test.endswith("/bfloat16]")
                           for test in failing), text
    assert_names_the_run(text, row, scratch.run)
