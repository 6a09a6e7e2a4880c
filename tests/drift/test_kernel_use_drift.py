"""A level that hands out a lower level's kernel, caught by the kernels that ran.

Its numbers stay right and isa() still names it, so only the kernel-use counters
can tell. A scratch copy of the tree is built natively (CMake and Ninja, against
this Python's torch) and tests/kernels/test_kernel_use.py run on it at the level:
it passes. Then the level's KernelSet is edited to take the lower level's int8
GEMM, the build redone (that file and the link), and the same test must fail,
naming the kernel kind, the level expected and the level that ran - while the
numerical tests of the same method still pass.

The level is one every host of its architecture runs (avx2, dotprod): the proof
needs to run the drifted build.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.drift.support import FAILED, this_hosts

# Minutes of native build: its own session (drift-native), after the matrix in the
# test command, so that `nox -s tests` stays quick and the canaries start early.
pytestmark = pytest.mark.native_build


@dataclass(frozen=True)
class Drift:
    level: str
    lower: str
    source: str
    pristine: str  # text of source that the drift replaces
    drifted: str


DRIFTS = {
    "x86_64": Drift(
        level="avx2", lower="generic", source="csrc/arch/x86/gemm_avx2.cpp",
        pristine="set.gemm_s8 = gemm_s8;",
        drifted="set.gemm_s8 = generic::kernels().gemm_s8;",
    ),
    "aarch64": Drift(
        level="dotprod", lower="neon", source="csrc/arch/arm/gemm_dotprod.cpp",
        pristine="set.gemm_s8 = gemm_s8;",
        drifted="set.gemm_s8 = neon::gemm_s8;",
    ),
}
KERNEL_USE_TEST = "tests/kernels/test_kernel_use.py"


@pytest.fixture(scope="module")
def drift() -> Drift:
    return this_hosts(DRIFTS, "kernel-use drift case")


def test_a_level_running_a_lower_levels_kernel_fails_the_kernel_use_test(native_tree, drift):
    native_tree.build()
    pristine = native_tree.run_suite(drift.level, KERNEL_USE_TEST)
    assert pristine.returncode == 0, pristine.stdout + pristine.stderr

    with native_tree.drifted(drift.source, drift.pristine, drift.drifted):
        drifted = native_tree.run_suite(drift.level, KERNEL_USE_TEST)
        log = drifted.stdout + drifted.stderr
        assert drifted.returncode == 1, log
        failed = FAILED.findall(drifted.stdout)
        assert failed and all("int8" in test for test in failed), log
        assert f"under isa() = {drift.level}: gemm_s8: expected {drift.level}'s kernel, but {drift.lower}'s ran" in log

        # What the counters caught, nothing else does: the int8 numbers are right.
        numbers = native_tree.run_suite(drift.level, "tests/kernels/test_fused_experts.py",
                                        "-k", "int8 and (prefill_rows or decode_long_rows)")
        assert numbers.returncode == 0, numbers.stdout + numbers.stderr
