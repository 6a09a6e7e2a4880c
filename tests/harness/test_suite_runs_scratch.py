"""docker/run-kernel-suite.sh on a scratch project, with real pytest and xdist
processes (no Docker: a stub `python` on PATH skips the wheel install), judged
by the summary: the drift and crash kinds the matrix used to report as passed
or hang on."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from harness.common import console
from harness.common.paths import DOCKER
from harness.proving.summary import judge, write_summary
from harness.running.suite import RunRecord

SCRATCH_TESTS = '''
import os
import signal

import pytest


@pytest.mark.skipif(os.environ.get("SCRATCH_ARCH") == "aarch64", reason="aarch64-only skip")
def test_bias_swiglu():
    pass


@pytest.mark.parametrize("case", range(6))
def test_kernel(case):
    if os.environ.get("SCRATCH_CRASH") in (str(case), "every"):
        os.kill(os.getpid(), signal.SIGILL)
'''
# What a test-side writer does (the kernel-use interface): only where the harness says.
SCRATCH_CONFTEST = '''
import json
import os


def pytest_sessionfinish(session):
    report_dir = os.environ.get("MOE_XARCH_REPORT_DIR")
    if report_dir:
        counts = {"gemm_bf16": {os.environ["SCRATCH_ISA"]: 3}}
        with open(os.path.join(report_dir, f"kernel-use-{os.getpid()}.json"), "w") as file:
            json.dump({"isa": os.environ["SCRATCH_ISA"], "counts": counts}, file)
'''
# The container's python, minus the wheel install and the account of its environment.
STUB_PYTHON = '''#!/bin/bash
case "$1 $2" in
    "-m pip" | *"/environment.py "*) exit 0 ;;
esac
exec "$REAL_PYTHON" "$@"
'''


@pytest.fixture
def scratch(tmp_path):
    project = tmp_path / "project"
    (project / "tests" / "kernels").mkdir(parents=True)
    (project / "tests" / "kernels" / "test_scratch.py").write_text(SCRATCH_TESTS)
    (project / "tests" / "kernels" / "conftest.py").write_text(SCRATCH_CONFTEST)
    stub = tmp_path / "bin" / "python"
    stub.parent.mkdir()
    stub.write_text(STUB_PYTHON)
    stub.chmod(0o755)
    return project


def suite_run(project, name: str, arch: str, cpu: str, isa: str, **env: str) -> RunRecord:
    """One run as the harness makes it (`-n 2`), recorded as run_suite records it."""
    report_dir = project.parent / "reports" / name
    report_dir.mkdir(parents=True)
    process = subprocess.run(
        ["bash", str(DOCKER / "run-kernel-suite.sh"), "scratch.whl", str(report_dir), "-n", "2"],
        cwd=project, capture_output=True, text=True,
        env={**os.environ, "PATH": f"{project.parent / 'bin'}:{os.environ['PATH']}", "REAL_PYTHON": sys.executable,
             "SCRATCH_ARCH": arch, "SCRATCH_ISA": isa, **env},
        timeout=60,  # a crashed worker must end the run, not hang it
    )
    runner, builder = ("qemu", "cross") if arch == "aarch64" else ("native", "cibuildwheel")
    return RunRecord(arch, runner, cpu, isa, isa, process.returncode, 1.0, str(report_dir), builder=builder)


def test_a_test_skipped_on_aarch64_only_fails_the_matrix_naming_it_and_both_runs(scratch, tmp_path):
    runs = [suite_run(scratch, "x86", "x86_64", "host", "avx2"), suite_run(scratch, "arm", "aarch64", "a64fx", "neon")]
    assert all(judge(run).result == "passed" for run in runs)  # each run alone looks fine
    assert not write_summary(runs, console.StepLog(), tmp_path / "summary")
    text = (tmp_path / "summary" / "summary.md").read_text()
    assert ("`tests/kernels/test_scratch.py::test_bias_swiglu: passed on x86_64 (cibuildwheel) CPU host, ISA avx2, "
            "skipped on aarch64 (cross) CPU a64fx, ISA neon: aarch64-only skip`") in text
    assert "| 6 | 0 | 1 | 7 / 0 / 0 | neon: gemm_bf16 | - | 00:01 | FAILED: 1 tests did not run as on the other runs |" in text
    # MOE_XARCH_REPORT_DIR reached the tests: the kernel-use files of both workers, merged
    assert "| neon: gemm_bf16 |" in text and "| avx2: gemm_bf16 |" in text


def test_a_worker_killed_by_sigill_fails_its_run_at_once_naming_signal_test_and_cpu(scratch):
    run = suite_run(scratch, "arm", "aarch64", "a64fx", "neon", SCRATCH_CRASH="3")
    assert run.exit_code != 0
    assert judge(run).result == (
        "FAILED: crashed: SIGILL (Illegal instruction) in tests/kernels/test_scratch.py::test_kernel[3] on CPU a64fx, "
        "1 failed")


def test_both_workers_killed_at_once_are_both_named(scratch):
    """Their faulthandler dumps interleave in the output. No worker is restarted: by
    default xdist restarts up to 4 per worker, each re-importing torch (minutes under
    QEMU) to crash on the next test, which kept a crashed run going for tens of minutes."""
    result = judge(suite_run(scratch, "arm", "aarch64", "a64fx", "neon", SCRATCH_CRASH="every")).result
    assert re.fullmatch(r"FAILED: crashed: SIGILL \(Illegal instruction\) in tests/kernels/test_scratch.py::"
                        r"test_kernel\[\d\], tests/kernels/test_scratch.py::test_kernel\[\d\] on CPU a64fx, 2 failed",
                        result), result
