"""The cross-run verdict: every run of a stage ran the same tests, with the same outcome.

Each suite run's JUnit report (xunit1, which names each test's file) gives every
test ID its outcome. A test that passed on one run and was skipped, xfailed,
errored or absent (deselected, not collected) on another fails the matrix,
unless [[tool.moe-xarch.allowed-differences]] in pyproject.toml declares it.
A failed test is not a drift: its own run already fails, naming it.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import tomllib
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from harness.targets import TableError, Target, typed_fields
from harness.targets import one_of

# JUnit shows an xfail as <skipped type="pytest.xfail">, a strict xpass as a failure
# whose message starts so, and a non-strict xpass as a pass (xfail_strict is on).
XPASS_STRICT = "[XPASS(strict)]"
# Outcomes a test may be allowed to have where it passes elsewhere.
EXCUSABLE = ("skipped", "xfailed", "absent")
FAILING = ("failed", "error", "xpassed")


@dataclasses.dataclass(frozen=True)
class Outcome:
    outcome: str  # passed failed error skipped xfailed xpassed, or absent
    reason: str = ""  # pytest's: the skip or xfail reason, the failure's first line


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


def _outcome(case: ElementTree.Element) -> Outcome:
    children = {child.tag: child for child in case}
    if (error := children.get("error")) is not None:
        return Outcome("error", first_line(error.get("message") or error.text))
    if (failure := children.get("failure")) is not None:
        message = first_line(failure.get("message") or failure.text)
        return Outcome("xpassed" if message.startswith(XPASS_STRICT) else "failed", message)
    if (skipped := children.get("skipped")) is not None:
        kind = "xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"
        return Outcome(kind, first_line(skipped.get("message") or skipped.text))
    return Outcome("passed")


def read_junit(path: Path) -> dict[str, Outcome]:
    """Every test ID of a JUnit report with its outcome (the worst, when setup,
    call and teardown each left an element)."""
    outcomes: dict[str, Outcome] = {}
    rank = ("passed", "skipped", "xfailed", "xpassed", "failed", "error")
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        test, outcome = _test_id(case), _outcome(case)
        if test not in outcomes or rank.index(outcome.outcome) > rank.index(outcomes[test].outcome):
            outcomes[test] = outcome
    return outcomes


@dataclasses.dataclass(frozen=True)
class RunId:
    arch: str
    builder: str
    cpu: str  # the QEMU CPU model, or "host"
    isa: str

    def __str__(self) -> str:
        return f"{self.arch} ({self.builder or '-'}) CPU {self.cpu}, ISA {self.isa}"


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
WHERE = "[[tool.moe-xarch.allowed-differences]]"


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
    if models and target.runner != "qemu":
        # Every ISA level of a native target runs the same tests: no level may differ.
        raise TableError(f"{where}: cpu-models apply to an emulated target; {target.arch} runs natively")
    for model in models:
        one_of(where, "CPU model", model, [m.name for m in target.cpu_models])
    fields["cpu_models"] = models
    return Allowed(**fields)


def parse_allowed(pyproject: Mapping[str, Any], targets: Mapping[str, Target]) -> tuple[Allowed, ...]:
    rows = pyproject.get("tool", {}).get("moe-xarch", {}).get("allowed-differences", [])
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

    def __str__(self) -> str:
        why = f": {self.outcome.reason}" if self.outcome.reason else ""
        return (f"{self.test}: {self.reference_outcome.outcome} on {self.reference}, "
                f"{self.outcome.outcome} on {self.run}{why}")


@dataclasses.dataclass(frozen=True)
class Verdict:
    drifts: tuple[Drift, ...]
    excused: tuple[tuple[Allowed, RunId, str], ...]  # (allowance, run, test) it applied to
    tests: int  # distinct test IDs compared

    @property
    def ok(self) -> bool:
        return not self.drifts


def compare(runs: Mapping[RunId, Mapping[str, Outcome]], allowed: Iterable[Allowed] = ()) -> Verdict:
    """The runs of one stage: a test that passed on one run (or is present at all)
    must pass (be present) on every other, except where an allowance covers that
    run and the test passed on no run the allowance covers."""
    allowed = tuple(allowed)
    tests = sorted({test for outcomes in runs.values() for test in outcomes})
    drifts, excused = [], []
    for test in tests:
        seen = {run: outcomes.get(test, ABSENT) for run, outcomes in runs.items()}
        passed = [run for run, outcome in seen.items() if outcome.outcome == "passed"]
        reference = (passed or [run for run, outcome in seen.items() if outcome.outcome != "absent"])[0]
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
                drifts.append(Drift(test, reference, seen[reference], run, outcome))
    return Verdict(tuple(drifts), tuple(excused), len(tests))
