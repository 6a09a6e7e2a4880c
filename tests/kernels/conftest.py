"""Shared setup of the kernel suite.

The suite runs unchanged on every architecture and ISA level: natively once per
MOE_XARCH_ISA level, and on aarch64 under QEMU, so shapes stay tiny.
"""

import dataclasses
import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import torch

T = TypeVar("T")

# pytest-xdist runs one worker per core; ATen threads on top of that only contend
# on these tiny shapes. The on_threads fixture turns threads back on where the
# kernel's work splitting is under test.
torch.set_num_threads(1)


def _on_threads(threads: int, call: Callable[[], T]) -> T:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return call()
    finally:
        torch.set_num_threads(previous)


@pytest.fixture
def on_threads() -> Callable[[int, Callable[[], T]], T]:
    """on_threads(threads, call): call() on that many ATen threads, then the suite's one again."""
    return _on_threads


LEVEL_RUNNER = Path(__file__).with_name("level_runner.py")
# A level no library has: its process must refuse it by name.
UNKNOWN_LEVEL = "no-such-level"


@dataclasses.dataclass(frozen=True)
class LevelRun:
    """What level_runner.py's process forced to one level said."""

    exit: int | None  # its exit code, a signal's number negated; None: the runner did not get to it
    stderr: str
    isa: str | None  # what moe_xarch.isa() reported; None: it did not get that far
    outcomes: dict[str, str]  # method name -> outcome, for the methods it got to

    def failure(self) -> str:
        """Why a fact may be missing, for an assertion's message."""
        return f"its process exited with {self.exit}: {self.stderr}"


def _run_every_level(directory: Path) -> dict[str, LevelRun]:
    import moe_xarch

    levels = moe_xarch.supported_isas()
    order = [levels[-1], *levels[:-1], UNKNOWN_LEVEL]  # the best level packs the weights the others use
    runner = subprocess.run([sys.executable, str(LEVEL_RUNNER), str(directory), *order],
                            capture_output=True, text=True)
    facts = [json.loads(line) for line in runner.stdout.splitlines() if line.startswith("{")]
    runs = {}
    for level in order:
        said = [fact for fact in facts if fact["level"] == level]
        stderr = directory / f"{level}.stderr"
        runs[level] = LevelRun(
            next((fact["exit"] for fact in said if "exit" in fact), None),
            stderr.read_text() if stderr.exists() else f"level_runner.py: {runner.returncode}: {runner.stderr}",
            next((fact["isa"] for fact in said if "isa" in fact), None),
            {fact["method"]: fact["outcome"] for fact in said if "method" in fact})
    return runs


@pytest.fixture(scope="session")
def forced_levels(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, LevelRun]:
    """A process forced to each level this CPU supports, and one to UNKNOWN_LEVEL,
    all forked by one level_runner.py: the forces_levels tests read their facts from
    these instead of starting a Python per fact. Under pytest-xdist the first worker
    to ask starts them and the others read what they said."""
    root = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):
        root = root.parent  # the session's, shared by its workers
    said = root / "forced-levels.json"
    with open(root / "forced-levels.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not said.exists():
            directory = root / "forced-levels"
            directory.mkdir()
            runs = _run_every_level(directory)
            said.write_text(json.dumps({level: dataclasses.asdict(run) for level, run in runs.items()}))
    return {level: LevelRun(**fields) for level, fields in json.loads(said.read_text()).items()}


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
    reads from them which runs must run the test (harness/plan/verdict.py, SCOPE_MARKERS)."""
    for item in items:
        item.user_properties.append(("markers", " ".join(sorted({mark.name for mark in item.iter_markers()}))))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Which kernels this process ran, for the run's summary: every level's code the
    suite reached, over the whole session (moe_xarch.kernel_use never resets); and the
    tolerance each (method, dtype) was compared with, which the verdict proves the same
    on every run."""
    report_dir = os.environ.get("MOE_XARCH_REPORT_DIR")
    if not report_dir or _runs_no_tests(session.config):
        return
    import moe_xarch
    from moe_xarch.testing import applied_tolerances

    report = {"isa": moe_xarch.isa(), "counts": moe_xarch.kernel_use()}
    for name, data in ((f"kernel-use-{os.getpid()}.json", report),
                       (f"tolerances-{os.getpid()}.json", applied_tolerances())):
        (Path(report_dir) / name).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
