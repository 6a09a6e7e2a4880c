"""Shared setup of the kernel suite.

The suite runs unchanged on every architecture and ISA level: natively once per
MOE_XARCH_ISA level, and on aarch64 under QEMU, so shapes stay tiny.
"""

import json
import os
from pathlib import Path

import pytest
import torch

# pytest-xdist runs one worker per core; ATen threads on top of that only contend
# on these tiny shapes. test_fused_experts.py::test_parallel_* turns threads back
# on where the kernel's work splitting is under test.
torch.set_num_threads(1)


def _runs_no_tests(config: pytest.Config) -> bool:
    """pytest-xdist's controller: its workers run the tests and write their own reports."""
    return getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    """The kernel path the library selects under this CPU, for the run's summary
    (isa.txt), from the process that starts the others: under QEMU a process of its
    own would import torch once more."""
    report_dir = os.environ.get("MOE_XARCH_REPORT_DIR")
    if report_dir and not hasattr(session.config, "workerinput"):
        import moe_xarch

        (Path(report_dir) / "isa.txt").write_text(moe_xarch.isa() + "\n")


def pytest_report_header() -> str:
    import moe_xarch

    return f"moe_xarch.isa() = {moe_xarch.isa()}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test's marker names, as the JUnit property "markers": the harness's verdict
    reads from them which runs must run the test (harness/verdict.py, SCOPE_MARKERS)."""
    for item in items:
        item.user_properties.append(("markers", " ".join(sorted({mark.name for mark in item.iter_markers()}))))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Which kernels this process ran, for the run's summary: every level's code the
    suite reached, over the whole session (moe_xarch.kernel_use never resets)."""
    report_dir = os.environ.get("MOE_XARCH_REPORT_DIR")
    if not report_dir or _runs_no_tests(session.config):
        return
    import moe_xarch

    report = {"isa": moe_xarch.isa(), "counts": moe_xarch.kernel_use()}
    path = Path(report_dir) / f"kernel-use-{os.getpid()}.json"
    path.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
