"""The cross-run verdict: every run of a stage ran the tests it must, with the same outcome.

Each suite run's JUnit report (xunit1, which names each test's file) gives every
test ID its outcome and its markers. A test's part of the suite (its scope, from
its marker: SCOPE_MARKERS) says which runs run it: every run, or once per CPU
model, or once per architecture, on the designated run (designated()). A test that
passed on one run and was skipped, xfailed, errored or absent (deselected, not
collected) on another run its scope designates fails the matrix, unless
[[tool.moe-xarch.allowed-differences]] in pyproject.toml declares it; so does a test
that ran where its scope does not run it, or whose scope differs between runs. A
failed test is not a drift: its own run already fails, naming it.

The comparison is the same on every run too (compare_tolerances): each run records
the tolerance it compared each (method, dtype) with, and one that differs fails.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import tomllib
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from harness.common.project import NAME, TABLE
from harness.plan.targets import TableError, Target, one_of, typed_fields

# JUnit shows an xfail as <skipped type="pytest.xfail">, a strict xpass as a failure
# whose message starts so, and a non-strict xpass as a pass (xfail_strict is on).
XPASS_STRICT = "[XPASS(strict)]"
# Outcomes a test may be allowed to have where it passes elsewhere.
EXCUSABLE = ("skipped", "xfailed", "absent")
FAILING = ("failed", "error", "xpassed")


# Which runs of an (architecture, builder) run a test: every run; the first run of each
# CPU model; the first run of all. The markers that declare the narrower scopes are
# registered, with the argument for each, in [tool.pytest.ini_options] markers.
EVERY_RUN, PER_CPU, PER_ARCH = "every run", "once per CPU model", "once per architecture"
SCOPES = (EVERY_RUN, PER_CPU, PER_ARCH)
SCOPE_MARKERS = {"forces_levels": PER_CPU, "level_independent": PER_ARCH}
# The JUnit property the suite's conftest writes: the test's marker names.
MARKERS_PROPERTY = "markers"


@dataclasses.dataclass(frozen=True)
class Outcome:
    outcome: str  # passed failed error skipped xfailed xpassed, or absent
    reason: str = ""  # pytest's: the skip or xfail reason, the failure's first line
    scope: str = EVERY_RUN  # one of SCOPES


ABSENT = Outcome("absent", "not in this run's report (deselected or not collected)")


def first_line(text: str | None) -> str:
    return next((line.strip() for line in (text or "").splitlines() if line.strip()), "")


def _test_id(case: ElementTree.Element) -> str:
    """file::[Class::]name, as pytest names the test."""
    classname, name, file = case.get("classname", ""), case.get("name", ""), case.get("file")
    if not file:
        return f"{classname}::{name}"
    module = file.removesuffix(".py").replace("/", ".")
    classes = classname[len(module) + 1:].split(".") if classname.startswith(module + ".") else []
    return "::".join([file, *classes, name])


def scope_of(markers: Iterable[str]) -> str:
    """The scope a test's markers declare; the narrowest, should it carry two."""
    declared = {SCOPE_MARKERS[name] for name in markers if name in SCOPE_MARKERS}
    return max(declared, key=SCOPES.index, default=EVERY_RUN)


def _outcome(case: ElementTree.Element) -> Outcome:
    children = {child.tag: child for child in case}
    markers = [name for prop in case.iter("property") if prop.get("name") == MARKERS_PROPERTY
               for name in (prop.get("value") or "").split()]
    scope = scope_of(markers)
    if (error := children.get("error")) is not None:
        return Outcome("error", first_line(error.get("message") or error.text), scope)
    if (failure := children.get("failure")) is not None:
        message = first_line(failure.get("message") or failure.text)
        return Outcome("xpassed" if message.startswith(XPASS_STRICT) else "failed", message, scope)
    if (skipped := children.get("skipped")) is not None:
        kind = "xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"
        return Outcome(kind, first_line(skipped.get("message") or skipped.text), scope)
    return Outcome("passed", scope=scope)


def read_junit(path: Path) -> dict[str, Outcome]:
    """Every test ID of a JUnit report with its outcome (the worst, when setup,
    call and teardown each left an element)."""
    outcomes: dict[str, Outcome] = {}
    rank = ("passed", "skipped", "xfailed", "xpassed", "failed", "error")
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        test, outcome = _test_id(case), _outcome(case)
        if test in outcomes:
            earlier = outcomes[test]
            worse = outcome if rank.index(outcome.outcome) > rank.index(earlier.outcome) else earlier
            # a setup or teardown element may lack the call's properties
            outcome = dataclasses.replace(worse, scope=max(earlier.scope, outcome.scope, key=SCOPES.index))
        outcomes[test] = outcome
    return outcomes


@dataclasses.dataclass(frozen=True)
class RunId:
    arch: str
    builder: str
    cpu: str  # the QEMU CPU model, or "host"
    isa: str
    # what the wheel met there (targets.Target.environment: distribution, compiler, CPython,
    # torch); "" where one environment is all there is
    env: str = ""

    def __str__(self) -> str:
        return f"{self.arch} ({self.builder or '-'}) CPU {self.cpu}, ISA {self.isa}" + (
            f", {self.env}" if self.env else "")


def designated(runs: Iterable[RunId]) -> dict[RunId, tuple[str, ...]]:
    """The scopes each run runs, the runs given in plan order (runners.planned_runs: the
    lowest level of the ladder first): every run its own tests; the first run of each
    CPU model of an (arch, builder, environment) the per-CPU ones; the first run of each
    (arch, builder, environment) the per-architecture ones: on x86_64 the generic level,
    on aarch64 the first CPU model of the target table. Each torch and toolchain a wheel
    meets is an environment of its own: there too it runs every part of the suite."""
    seen: set[tuple[str, ...]] = set()
    scopes = {}
    for run in runs:
        arch = (run.arch, run.builder, run.env)
        cpu = (*arch, run.cpu)
        scopes[run] = (EVERY_RUN, *((PER_CPU,) if cpu not in seen else ()),
                       *((PER_ARCH,) if arch not in seen else ()))
        seen |= {arch, cpu}
    return scopes


@dataclasses.dataclass(frozen=True)
class Allowed:
    """A test that may not pass on some runs, where it can only mean something elsewhere."""

    test: str  # a test ID, or an fnmatch pattern of IDs
    arch: str
    outcome: str  # one of EXCUSABLE
    reason: str
    cpu_models: tuple[str, ...] = ()  # empty: every run of the arch

    def covers(self, run: RunId) -> bool:
        return run.arch == self.arch and (not self.cpu_models or run.cpu in self.cpu_models)

    def matches(self, test: str) -> bool:
        return fnmatch.fnmatchcase(test, self.test)

    @property
    def scope(self) -> str:
        return f"{self.arch}" + (f" ({', '.join(self.cpu_models)})" if self.cpu_models else "")


# key -> (field, type, required)
_ALLOWED_KEYS: dict[str, tuple[str, type, bool]] = {
    "test": ("test", str, True),
    "arch": ("arch", str, True),
    "outcome": ("outcome", str, True),
    "reason": ("reason", str, True),
    "cpu-models": ("cpu_models", list, False),
}
WHERE = f"[[{TABLE}.allowed-differences]]"


def _parse_allowed(index: int, row: Any, targets: Mapping[str, Target]) -> Allowed:
    where = f"{WHERE} #{index + 1}"
    if not isinstance(row, dict):
        raise TableError(f"{where}: must be a table, not {type(row).__name__}")
    fields = typed_fields(where, row, _ALLOWED_KEYS)
    one_of(where, "architecture", fields["arch"], targets)
    one_of(where, "outcome", fields["outcome"], EXCUSABLE)
    if not fields["reason"].strip():
        raise TableError(f"{where}: reason must say why the test cannot mean something there")
    target = targets[fields["arch"]]
    models = tuple(fields.get("cpu_models", ()))
    if models and not target.cpu_models:
        # Every ISA level of a native target runs the same tests: no level may differ.
        raise TableError(f"{where}: cpu-models apply to an emulated target; {target.arch} runs natively")
    for model in models:
        one_of(where, "CPU model", model, [m.name for m in target.cpu_models])
    fields["cpu_models"] = models
    return Allowed(**fields)


def parse_allowed(pyproject: Mapping[str, Any], targets: Mapping[str, Target]) -> tuple[Allowed, ...]:
    rows = pyproject.get("tool", {}).get(NAME, {}).get("allowed-differences", [])
    if not isinstance(rows, list):
        raise TableError(f"{WHERE}: must be an array of tables")
    return tuple(_parse_allowed(index, row, targets) for index, row in enumerate(rows))


def load_allowed(pyproject_path: Path, targets: Mapping[str, Target]) -> tuple[Allowed, ...]:
    with pyproject_path.open("rb") as file:
        return parse_allowed(tomllib.load(file), targets)


@dataclasses.dataclass(frozen=True)
class Drift:
    test: str
    reference: RunId  # where it passed (or, for a missing test, was present)
    reference_outcome: Outcome
    run: RunId
    outcome: Outcome
    problem: str = ""  # set when the drift is not an outcome: where the test ran, or its scope

    def __str__(self) -> str:
        scope = f" ({self.reference_outcome.scope})" if self.reference_outcome.scope != EVERY_RUN else ""
        if self.problem:
            return f"{self.test}{scope}: {self.problem}"
        why = f": {self.outcome.reason}" if self.outcome.reason else ""
        return (f"{self.test}{scope}: {self.reference_outcome.outcome} on {self.reference}, "
                f"{self.outcome.outcome} on {self.run}{why}")


@dataclasses.dataclass(frozen=True)
class Verdict:
    drifts: tuple[Drift, ...]
    excused: tuple[tuple[Allowed, RunId, str], ...]  # (allowance, run, test) it applied to
    tests: int  # distinct test IDs compared

    @property
    def ok(self) -> bool:
        return not self.drifts


def _misplaced(test: str, seen: Mapping[RunId, Outcome], scopes: Mapping[RunId, tuple[str, ...]]) -> list[Drift]:
    """A test whose scope differs between runs, or that ran on a run its scope does not designate."""
    present = [(run, outcome) for run, outcome in seen.items() if outcome.outcome != "absent"]
    first_run, first = present[0]
    return [Drift(test, first_run, first, run, outcome,
                  f"runs {first.scope} on {first_run}, {outcome.scope} on {run}: one declaration for every run"
                  if outcome.scope != first.scope else
                  f"ran on {run}, which does not run {first.scope} tests (its designated run does)")
            for run, outcome in present if outcome.scope != first.scope or first.scope not in scopes[run]]


def compare(runs: Mapping[RunId, Mapping[str, Outcome]], allowed: Iterable[Allowed] = (),
            planned: Iterable[RunId] = ()) -> Verdict:
    """The runs of one stage: a test that passed on one run its scope designates (or
    is present at all) must pass (be present) on every other it designates, except
    where an allowance covers that run and the test passed on no run the allowance
    covers; and it must be absent from the runs its scope does not designate.
    ``planned``: every run of the stage in plan order, those without a report too
    (which decide the designated runs but are not compared); by default ``runs``."""
    allowed = tuple(allowed)
    scopes = designated(dict.fromkeys([*planned, *runs]))
    tests = sorted({test for outcomes in runs.values() for test in outcomes})
    drifts, excused = [], []
    for test in tests:
        present = {run: outcomes.get(test, ABSENT) for run, outcomes in runs.items()}
        misplaced = _misplaced(test, present, scopes)
        drifts += misplaced
        if any(drift.outcome.scope != drift.reference_outcome.scope for drift in misplaced):
            continue  # declared two ways: no one set of runs it must run on
        scope = next(outcome.scope for outcome in present.values() if outcome.outcome != "absent")
        seen = {run: outcome for run, outcome in present.items() if scope in scopes[run]}
        passed = [run for run, outcome in seen.items() if outcome.outcome == "passed"]
        # where it passed, else where it ran at all (on a designated run if it did)
        reference = (passed or [run for run, outcome in [*seen.items(), *present.items()]
                                if outcome.outcome != "absent"])[0]
        for run, outcome in seen.items():
            drifted = outcome.outcome in EXCUSABLE + ("error",) if passed else outcome.outcome == "absent"
            if not drifted:
                continue
            allowance = next((a for a in allowed if a.matches(test) and a.covers(run)
                              and a.outcome == outcome.outcome
                              and not any(a.covers(other) for other in passed)), None)
            if allowance:
                excused.append((allowance, run, test))
            else:
                drifts.append(Drift(test, reference, present[reference], run, outcome))
    return Verdict(tuple(drifts), tuple(excused), len(tests))


@dataclasses.dataclass(frozen=True)
class ToleranceDrift:
    """A (method, dtype) that one run compared with another tolerance than an earlier run
    did, or a run that recorded no tolerance where another did."""

    key: str  # moe_xarch.testing.tolerance_key: "METHOD/dtype"; "" for a run that recorded none
    reference: str  # the run (as the summary names it) whose tolerance the other differs from
    reference_tolerance: Mapping[str, Any] | None
    run: str
    tolerance: Mapping[str, Any] | None  # None: the run recorded none at all

    def __str__(self) -> str:
        if self.tolerance is None:
            return f"tolerances: none recorded on {self.run}, {len(self.reference_tolerance or {})} on {self.reference}"
        return (f"tolerance of {self.key}: {_tolerance_text(self.tolerance)} on {self.run}, "
                f"{_tolerance_text(self.reference_tolerance)} on {self.reference}")


def _tolerance_text(tolerance: Mapping[str, Any] | None) -> str:
    return ", ".join(f"{name} {value}" for name, value in sorted((tolerance or {}).items()))


def compare_tolerances(runs: Iterable[tuple[str, Mapping[str, Mapping[str, Any]] | None]]) -> tuple[ToleranceDrift, ...]:
    """The contract promises one tolerance per (method, dtype) on every architecture:
    each (method, dtype) a run compared must have the tolerance of the first run, in
    the order given, that compared it; and a run that recorded none (None) while
    another did differs too. ``runs``: (run, {tolerance_key: tolerance fields})."""
    runs = list(runs)
    recorded = next(((run, tolerances) for run, tolerances in runs if tolerances is not None), None)
    first: dict[str, tuple[str, Mapping[str, Any]]] = {}
    drifts = []
    for run, tolerances in runs:
        if tolerances is None:
            if recorded is not None:
                drifts.append(ToleranceDrift("", *recorded, run, None))
            continue
        for key, tolerance in sorted(tolerances.items()):
            reference, reference_tolerance = first.setdefault(key, (run, tolerance))
            if tolerance != reference_tolerance:
                drifts.append(ToleranceDrift(key, reference, reference_tolerance, run, tolerance))
    return tuple(drifts)
