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
from pathlib import Path

import pytest
import torch

# pytest-xdist runs one worker per core; ATen threads on top of that only contend
# on these tiny shapes. test_fused_experts.py::test_parallel_* turns threads back
# on where the kernel's work splitting is under test.
torch.set_num_threads(1)


LEVEL_RUNNER = Path(__file__).with_name("level_runner.py")


@dataclasses.dataclass(frozen=True)
class LevelRun:
    """What level_runner.py said in a process forced to one level."""

    returncode: int
    stderr: str
    isa: str | None  # what moe_xarch.isa() reported; None: it did not get that far
    outcomes: dict[str, str]  # method name -> outcome, for the methods it got to

    def failure(self) -> str:
        """Why a fact may be missing, for an assertion's message."""
        return f"level_runner.py exited with {self.returncode}: {self.stderr}"


def _run_every_level(directory: Path) -> dict[str, LevelRun]:
    import moe_xarch

    levels = moe_xarch.supported_isas()
    runs = {}
    for level in [levels[-1], *levels[:-1]]:  # the best level packs the weights the others use
        options = ["--pack"] if level == levels[-1] else []
        child = subprocess.run([sys.executable, str(LEVEL_RUNNER), str(directory), *options],
                               env={**os.environ, "MOE_XARCH_ISA": level}, capture_output=True, text=True)
        facts = [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]
        runs[level] = LevelRun(child.returncode, child.stderr, next((f["isa"] for f in facts if "isa" in f), None),
                               {f["method"]: f["outcome"] for f in facts if "method" in f})
    return {level: runs[level] for level in levels}


@pytest.fixture(scope="session")
def forced_levels(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, LevelRun]:
    """One level_runner.py process per level this CPU supports, forced to it: the
    forces_levels tests read their facts from these few processes instead of starting
    one per fact. Under pytest-xdist the first worker to ask starts them and the
    others read what they said."""
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
