"""Running the kernel suite against a built wheel, in a clean container per run.

One run per (target, CPU model) under QEMU, or per ISA level natively. Every run
installs the wheel (not the source tree) into the test image's venv, with no
network, and asserts the kernel path: MOE_XARCH_EXPECT_ISA for the suite, and
the path the library reports, recorded for the summary. Each run runs the parts of
the suite its place in the plan designates (harness/plan/verdict.py, designated()).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.common import console
from harness.common.paths import DOCKER
from harness.common.project import SUPPORTED_ISAS
from harness.plan.runners import SuiteRun, runner_for, selections
from harness.plan.targets import Target
from harness.setup import containers
from harness.setup.wheels import requirement_lines, sha256

# Under QEMU an import of torch takes about 9 s and the suite minutes; a hung
# run must not hold CI until its own limit.
RUN_TIMEOUT_SECONDS = 40 * 60
CANARY_TIMEOUT_SECONDS = 10 * 60


def host_test_requirements(docker_dir: Path = DOCKER) -> list[str]:
    """The test image's own pins but pip's: tests/harness runs the suite's script on
    scratch projects, whose crashes must behave as in the containers, and tests/drift
    runs tests/kernels natively (numpy: torch warns at import without it)."""
    pinned = requirement_lines(docker_dir / "requirements-test.txt")
    return [line for line in pinned if line.split("==")[0] != "pip"]


def _mounts(repo: Path, wheel: Path) -> list[str]:
    return [
        f"--volume={repo / 'tests'}:/src/tests:ro",
        # the suite's pytest settings, and nothing else of the source tree
        f"--volume={repo / 'pyproject.toml'}:/src/pyproject.toml:ro",
        # the file, not wheelhouse/: a wheel replaced there meanwhile does not change under the run
        f"--volume={wheel}:/wheelhouse/{wheel.name}:ro",
        f"--volume={DOCKER / 'run-kernel-suite.sh'}:/harness/run-kernel-suite.sh:ro",
        f"--volume={DOCKER / 'environment.py'}:/harness/environment.py:ro",
    ]


def docker_run_command(
    run: SuiteRun,
    *,
    image: str,
    wheel: Path,
    repo: Path,
    report_dir: Path,
    name: str,
    pytest_args: list[str],
) -> list[str]:
    return [
        "docker", "run", "--rm", f"--name={name}", *containers.label_args(),
        f"--platform={run.target.platform}", "--network=none",
        *(f"--env={key}={value}" for key, value in run.env),
        *_mounts(repo, wheel),
        f"--volume={report_dir}:/report",
        "--workdir=/src",
        image,
        "bash", "/harness/run-kernel-suite.sh", f"/wheelhouse/{wheel.name}", "/report",
        *pytest_args,
    ]


def query_supported_isas(target: Target, image: str, wheel: Path, repo: Path) -> list[str]:
    """The ISA levels the library can run on this CPU, asked of the installed wheel."""
    name = containers.container_name("isas", target.arch)
    script = (
        'pip install --quiet --no-index --no-deps "$0" && '
        f"python -c '{SUPPORTED_ISAS}'"
    )
    try:
        output = subprocess.run(
            ["docker", "run", "--rm", f"--name={name}", *containers.label_args(),
             f"--platform={target.platform}", "--network=none", *_mounts(repo, wheel),
             image, "bash", "-c", script, f"/wheelhouse/{wheel.name}"],
            check=True, capture_output=True, text=True, timeout=600,
        ).stdout
    finally:
        containers.remove(name)
    return output.split()


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """What the summary needs of a run besides its JUnit report (run.json)."""

    target: str
    runner: str
    cpu: str
    isa: str
    isa_reported: str
    exit_code: int | None  # None: not run (the CPU lacks the ISA level)
    wall_seconds: float
    report_dir: str
    failure: str = ""  # set when the run could not start (no image, no wheel)
    builder: str = ""  # what made the wheel under test (cross, cibuildwheel)
    stage: str = "full"  # a key of runners.STAGES
    environment: str = ""  # the target's (leg's) Target.environment; "" outside the test sessions
    wheel_sha256: str = ""  # of the wheel under test, where one was

    @classmethod
    def could_not_run(cls, target: Target, builder: str, why: str, stage: str = "full") -> RunRecord:
        return cls(target.arch, target.runner, "-", "-", "", 1, 0.0, "", why, builder, stage, target.environment)


def verb(stage: str) -> str:
    """What the console and the step log call a run of the stage."""
    return "test" if stage == "full" else stage


def record_run(run: SuiteRun, builder: str, command: list[str], report_dir: Path, *, stage: str = "full",
               env: dict[str, str] | None = None, cwd: Path | None = None, environment: str = "",
               wheel_sha256: str = "") -> RunRecord:
    """Run one run's command (the suite's script, in a container or not), and its record
    from what it left in report_dir (which exists), also written there as run.json."""
    start = time.monotonic()
    exit_code = console.run_streamed(
        command, f"{verb(stage)} {run.name}", env=env, cwd=cwd, check=False,
        timeout=RUN_TIMEOUT_SECONDS if stage == "full" else CANARY_TIMEOUT_SECONDS,
    )
    isa_file = report_dir / "isa.txt"
    record = RunRecord(
        run.target.arch, run.target.runner, run.cpu, run.isa,
        isa_file.read_text().strip() if isa_file.exists() else "",
        exit_code, time.monotonic() - start, str(report_dir), builder=builder, stage=stage,
        environment=environment, wheel_sha256=wheel_sha256,
    )
    (report_dir / "run.json").write_text(json.dumps(dataclasses.asdict(record), indent=2) + "\n")
    return record


def run_once(
    run: SuiteRun,
    builder: str,
    *,
    test_image: str,
    wheel: Path,
    repo: Path,
    report_dir: Path,
    pytest_args: list[str],
    stage: str = "full",
    wheel_sha256: str = "",
) -> RunRecord:
    """One run in a container of its own, its reports in report_dir (which exists)."""
    name = containers.container_name("test", run.name)
    command = docker_run_command(run, image=test_image, wheel=wheel, repo=repo, report_dir=report_dir,
                                 name=name, pytest_args=pytest_args)
    try:
        return record_run(run, builder, command, report_dir, stage=stage, environment=run.target.environment,
                          wheel_sha256=wheel_sha256)
    finally:
        containers.remove(name)


def run_suite(
    target: Target,
    builder: str,
    *,
    test_image: str,
    wheel: Path,
    repo: Path,
    reports: Path,
    steps: console.StepLog,
    pytest_args: list[str],
    stage: str = "full",
    on_run: Callable[[RunRecord], None] | None = None,
) -> list[RunRecord]:
    """Every planned run of the target, an emulated target's side by side; records land
    in reports/<target>/<builder>/<run>/ (the canary stage's in
    reports/canary/<target>/<builder>/<run>/; <target>: Target.name, a leg's apart from
    its arch's), in plan order. ``on_run`` sees each record as soon as its run ends."""
    target_reports = (reports if stage == "full" else reports / stage) / target.name / builder
    shutil.rmtree(target_reports, ignore_errors=True)
    digest = sha256(wheel) if wheel.is_file() else ""
    records = []
    runner = runner_for(target)
    if not runner.emulated:
        supported = query_supported_isas(target, test_image, wheel, repo)
        print(f"{target.arch}: this CPU supports {', '.join(supported)}", flush=True)
        for level in target.isa_levels:
            if level not in supported:
                records.append(RunRecord(target.arch, target.runner, "host", level, "", None, 0.0, "",
                                         builder=builder, stage=stage, environment=target.environment,
                                         wheel_sha256=digest))
        unlisted = [level for level in supported if level not in target.isa_levels]
        if unlisted:
            console.note(f"{target.arch}: the library supports {unlisted}, not in the table's isa-levels")
    else:
        supported = []
    runs = runner.runs(target, supported)
    selected = selections(runs, builder, stage)

    def one_run(run: SuiteRun) -> RunRecord:
        report_dir = target_reports / run.name
        report_dir.mkdir(parents=True)
        with steps.step(f"{verb(stage)} {run.target.name} ({builder}) {run.cpu} {run.isa}"):
            record = run_once(
                run, builder, test_image=test_image, wheel=wheel, repo=repo, report_dir=report_dir,
                pytest_args=[*runner.workers(), *selected[run.name], *pytest_args],
                stage=stage, wheel_sha256=digest,
            )
        if on_run:
            on_run(record)
        return record

    pool = ThreadPoolExecutor(max_workers=max(1, len(runs)) if runner.side_by_side else 1)
    try:
        records += pool.map(one_run, runs)
    except BaseException:  # interrupted, or a run could not start: stop the others too
        console.stop_all()
        raise
    finally:
        pool.shutdown(wait=True)
    return records
