from __future__ import annotations

import os

from harness.plan import runners
from harness.plan.targets import RUNNERS


def test_every_runner_of_the_table_has_a_back_end():
    assert set(runners.BACKENDS) == set(RUNNERS)
    assert all(name == backend.name for name, backend in runners.BACKENDS.items())


def test_a_target_finds_its_back_end_by_the_table_runner(x86, arm):
    assert runners.runner_for(x86) is runners.NATIVE and not runners.NATIVE.emulated
    assert runners.runner_for(arm) is runners.QEMU and runners.QEMU.emulated


def test_emulated_runs_share_the_cores_and_native_runs_use_them_all():
    assert runners.QEMU.side_by_side and runners.QEMU.workers() == ["-n", "1"]
    assert not runners.NATIVE.side_by_side and runners.NATIVE.workers() == ["-n", str(os.cpu_count() or 1)]


def test_instrumented_emulated_runs_keep_the_tests_in_pytests_own_process():
    assert runners.QEMU.coverage_workers() == ["-n", "0"]
    assert runners.NATIVE.coverage_workers() == ["-n", str(os.cpu_count() or 1)]


def test_the_native_back_end_forces_and_asserts_the_level():
    assert dict(runners.NATIVE.env("avx2")) == {"MOE_XARCH_ISA": "avx2", "MOE_XARCH_EXPECT_ISA": "avx2"}


def test_a_canary_selection_adds_the_plan_markers_to_the_canary_marker(x86):
    runs = runners.planned_runs(x86, ["generic", "avx2"])
    assert runners.selections(runs, "cross", "canary") == {
        "x86_64-host-generic": ["-m", "canary"],
        "x86_64-host-avx2": ["-m", "canary and not forces_levels and not level_independent"],
    }
