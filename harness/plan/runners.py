"""How the kernel suite runs on a target: natively, once per ISA level this CPU has,
or under QEMU, once per CPU model of the table.

Each back-end owns what its runs differ in (their environment, the pytest worker count
and whether they run side by side); the marker selection of each run comes from its
place in the plan (harness/plan/verdict.py, designated()). A back-end is found by the table's
runner value (harness/plan/targets.py, RUNNERS); the test sessions, the native session,
coverage and prove plan their runs here.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Protocol

from harness.common.project import ENV_PREFIX
from harness.plan.targets import Target
from harness.plan.verdict import SCOPE_MARKERS, RunId, designated

# The marker expression of each stage: the canary selection first (emulated targets), then the full suite.
STAGES = {"canary": "canary", "full": ""}


@dataclasses.dataclass(frozen=True)
class SuiteRun:
    target: Target
    cpu: str  # the QEMU CPU model, or "host" for a native run
    isa: str  # the kernel path the run must select
    env: tuple[tuple[str, str], ...]

    @property
    def name(self) -> str:
        return f"{self.target.arch}-{self.cpu}-{self.isa}"

    def run_id(self, builder: str) -> RunId:
        return RunId(self.target.arch, builder, self.cpu, self.isa, self.target.environment)


class Runner(Protocol):
    name: str  # the table's runner value
    emulated: bool
    # Under QEMU much of a run is one process at a time (pip, torch's import, collection):
    # the CPU models run side by side so that the runs share the cores.
    side_by_side: bool

    def runs(self, target: Target, supported: Sequence[str]) -> list[SuiteRun]: ...

    def workers(self) -> list[str]:
        """pytest-xdist's worker count of a test session's run."""
        ...

    def coverage_workers(self) -> list[str]:
        """The worker count of an instrumented run."""
        ...


def _cpu_workers() -> list[str]:
    return ["-n", str(os.cpu_count() or 1)]


class Native:
    name = "native"
    emulated = False
    side_by_side = False

    def env(self, level: str) -> tuple[tuple[str, str], ...]:
        """The level forced, and asserted by the suite."""
        return (f"{ENV_PREFIX}_ISA", level), (f"{ENV_PREFIX}_EXPECT_ISA", level)

    def runs(self, target: Target, supported: Sequence[str]) -> list[SuiteRun]:
        """One run per table ISA level the CPU supports."""
        return [SuiteRun(target, "host", level, self.env(level)) for level in target.isa_levels if level in supported]

    def workers(self) -> list[str]:
        return _cpu_workers()  # a native run is short and keeps one worker per core

    def coverage_workers(self) -> list[str]:
        return _cpu_workers()


class Qemu:
    name = "qemu"
    emulated = True
    side_by_side = True

    def runs(self, target: Target, supported: Sequence[str]) -> list[SuiteRun]:
        """One run per CPU model, asserting the level the model selects."""
        return [
            SuiteRun(target, model.name, model.isa,
                     (("QEMU_CPU", model.qemu_cpu), (f"{ENV_PREFIX}_EXPECT_ISA", model.isa)))
            for model in target.cpu_models
        ]

    def workers(self) -> list[str]:
        return ["-n", "1"]  # the CPU models side by side, one worker each

    def coverage_workers(self) -> list[str]:
        # pytest-xdist kills a worker that takes over 10 s to exit, before gcov writes its
        # counts: under QEMU exits are that slow, so the tests stay in pytest's own process.
        return ["-n", "0"]


NATIVE, QEMU = Native(), Qemu()
BACKENDS: dict[str, Runner] = {backend.name: backend for backend in (NATIVE, QEMU)}


def runner_for(target: Target) -> Runner:
    return BACKENDS[target.runner]


def planned_runs(target: Target, supported: Sequence[str] | None = None) -> list[SuiteRun]:
    """The target's runs; ``supported``: the ISA levels this CPU has (a native target's)."""
    return runner_for(target).runs(target, supported or [])


def marker_expression(stage: str, scopes: tuple[str, ...]) -> list[str]:
    """pytest's -m for a run of the stage that runs the tests of ``scopes``."""
    terms = [STAGES[stage], *(f"not {marker}" for marker, scope in SCOPE_MARKERS.items() if scope not in scopes)]
    expression = " and ".join(term for term in terms if term)
    return ["-m", expression] if expression else []


def selections(runs: Sequence[SuiteRun], builder: str, stage: str = "full") -> dict[str, list[str]]:
    """Each run's marker expression (by run name), from its place in the plan."""
    scopes = designated(run.run_id(builder) for run in runs)
    return {run.name: marker_expression(stage, scopes[run.run_id(builder)]) for run in runs}
