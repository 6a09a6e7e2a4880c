"""The closing summary of a run: target x CPU model x ISA x passed/failed/skipped/time,
the failing tests by name, the cross-run verdict (harness/plan/verdict.py), the kernels
each run executed; printed, and written as Markdown (a GitHub step summary as is) and JSON."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping, Sequence
from pathlib import Path

from harness.common.console import StepLog, clock
from harness.common.project import NAME, TABLE
from harness.plan.runners import STAGES
from harness.plan.verdict import (
    FAILING,
    SCOPES,
    Allowed,
    Drift,
    Outcome,
    RunId,
    ToleranceDrift,
    Verdict,
    compare,
    compare_tolerances,
    read_junit,
)
from harness.running.suite import RunRecord

SHOWN_PER_RUN = 10  # failing tests or drifts listed per run; the JSON has them all


@dataclasses.dataclass(frozen=True)
class Counts:
    tests: int = 0
    failures: int = 0  # failed and errored
    skipped: int = 0
    seconds: float = 0.0

    @property
    def passed(self) -> int:
        return self.tests - self.failures - self.skipped


def junit_counts(path: Path) -> Counts:
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = Counts()
    for suite in suites:
        tests, failures, errors, skipped = (
            int(suite.get(key, "0")) for key in ("tests", "failures", "errors", "skipped")
        )
        total = Counts(
            total.tests + tests,
            total.failures + failures + errors,
            total.skipped + skipped,
            total.seconds + float(suite.get("time", "0")),
        )
    return total


# What faulthandler prints for each fatal signal it handles.
FATAL_ERRORS = {
    "Segmentation fault": "SIGSEGV",
    "Illegal instruction": "SIGILL",
    "Bus error": "SIGBUS",
    "Floating-point exception": "SIGFPE",
    "Aborted": "SIGABRT",
}
_FRAME = re.compile(r'File "(?:[^"]*/)?(tests/[^"]+\.py)", line (\d+) in (\S+)')
_WORKER_CRASH = re.compile(r"worker '[^']+' crashed while running '([^']+)'")


@dataclasses.dataclass(frozen=True)
class Crash:
    signal: str  # "SIGILL (Illegal instruction)", or what is known
    where: tuple[str, ...]  # the test IDs, or the test file and line when pytest could not say


def crash(log: str, outcomes: Mapping[str, Outcome]) -> Crash | None:
    """The crashed test processes of a run: the tests pytest-xdist names as crashed,
    with the signal of faulthandler's dumps in the output (a SIGKILL leaves none).

    Workers that crash at once write their dumps into one stream, interleaved, so
    the signals are read as a set, and a stack only where xdist named no test."""
    first = log.find("Fatal Python error: ")
    dumped = log[first:] if first >= 0 else ""
    signals = " or ".join(f"{number} ({name})" for name, number in FATAL_ERRORS.items() if name in dumped)
    crashed = [test for test, outcome in outcomes.items() if _WORKER_CRASH.search(outcome.reason)]
    if crashed:
        return Crash(signals or "a signal faulthandler cannot report (SIGKILL?)", tuple(crashed))
    if not signals:
        return None
    # No test named: a crash while collecting, or a run without xdist. The crashed
    # thread's stack, innermost first, up to the blank line that ends it.
    start = dumped.find("Current thread")
    stack = dumped[start:dumped.find("\n\n", start)] if start >= 0 else ""
    frame = _FRAME.search(stack)
    if not frame:
        return Crash(signals, ("outside the tests",))
    file, line, function = frame.groups()
    return Crash(signals, (f"{file}::{function}" if function.startswith("test") else f"{file} line {line} ({function})",))


def _exit_signal(exit_code: int | None) -> str:
    """docker run's exit code 128+N: the container's main process died of signal N."""
    if exit_code is None or not 128 < exit_code < 128 + 65:
        return ""
    try:
        return signal.Signals(exit_code - 128).name
    except ValueError:
        return f"signal {exit_code - 128}"


def _report_files(report_dir: Path, prefix: str) -> list[tuple[str, dict]]:
    """The JSON files the tests of a run wrote into its report dir (one per process)."""
    return [(path.name, json.loads(path.read_text())) for path in sorted(report_dir.glob(f"{prefix}-*.json"))]


class ReportFileError(ValueError):
    """A test-side report file is malformed: the writer's bug, which fails the run."""


def kernel_use(report_dir: Path) -> dict[str, dict[str, int]] | None:
    """The kernel-use-*.json files merged: {level whose code ran: {kernel kind: calls}}."""
    files = _report_files(report_dir, "kernel-use")
    if not files:
        return None
    merged: dict[str, dict[str, int]] = {}
    for name, data in files:
        try:
            for kind, levels in data["counts"].items():
                for level, calls in levels.items():
                    merged.setdefault(level, {}).setdefault(kind, 0)
                    merged[level][kind] += int(calls)
        except (KeyError, AttributeError, TypeError, ValueError) as error:
            raise ReportFileError(f"{name}: {type(error).__name__}: {error}") from None
    return merged


def kernels_text(merged: Mapping[str, Mapping[str, int]] | None, isa: str) -> str:
    """ "i8mm: gemm_bf16 gemm_s8; neon: gemm_f32", the level under test first."""
    if merged is None:
        return "-"
    ran = {level: sorted(kind for kind, calls in kinds.items() if calls) for level, kinds in merged.items()}
    order = sorted((level for level in ran if ran[level]), key=lambda level: (level != isa, level))
    return "; ".join(f"{level}: {' '.join(ran[level])}" for level in order) or "none"


PROPERTY_KEYS = ("valid", "invalid", "crashes")


def property_cases(report_dir: Path) -> dict[str, int] | None:
    """The property-cases-*.json files summed."""
    files = _report_files(report_dir, "property-cases")
    if not files:
        return None
    total = dict.fromkeys(PROPERTY_KEYS, 0)
    for name, data in files:
        try:
            for key in PROPERTY_KEYS:
                total[key] += int(data[key])
        except (KeyError, TypeError, ValueError) as error:
            raise ReportFileError(f"{name}: {type(error).__name__}: {error}") from None
    return total


def tolerances(report_dir: Path) -> dict[str, dict] | None:
    """The tolerances-*.json files merged: {method/dtype: the tolerance it was compared with}."""
    files = _report_files(report_dir, "tolerances")
    if not files:
        return None
    merged: dict[str, tuple[str, dict]] = {}
    for name, data in files:
        if not isinstance(data, dict):
            raise ReportFileError(f"{name}: not a JSON object")
        for key, tolerance in data.items():
            earlier_name, earlier = merged.setdefault(key, (name, tolerance))
            if tolerance != earlier:
                raise ReportFileError(f"{name}: {key} compared with {tolerance}, in {earlier_name} with {earlier}")
    return {key: tolerance for key, (_, tolerance) in merged.items()}


def properties_text(cases: Mapping[str, int] | None) -> str:
    return "-" if cases is None else "/".join(str(cases[key]) for key in PROPERTY_KEYS)


def parts_text(parts: Mapping[str, int] | None) -> str:
    return "-" if parts is None else " / ".join(str(parts[scope]) for scope in SCOPES)


@dataclasses.dataclass(frozen=True)
class Row:
    record: RunRecord
    counts: Counts
    result: str  # "passed", "not supported by this CPU", or "FAILED: <why>"
    outcomes: Mapping[str, Outcome] | None = None  # None: no readable JUnit report
    kernels: dict[str, dict[str, int]] | None = None
    properties: dict[str, int] | None = None
    tolerances: dict[str, dict] | None = None  # None: the run recorded none
    tolerance_drifts: tuple[ToleranceDrift, ...] = ()  # set by judge_all, against the other runs

    @property
    def ok(self) -> bool:
        return not self.result.startswith("FAILED")

    @property
    def failing(self) -> list[tuple[str, Outcome]]:
        return [(test, outcome) for test, outcome in (self.outcomes or {}).items() if outcome.outcome in FAILING]

    @property
    def run_id(self) -> RunId:
        r = self.record
        return RunId(r.target, r.builder, r.cpu, r.isa, r.environment)

    @property
    def label(self) -> str:
        """The run as the summary names it: its stage, then its RunId."""
        return f"{self.record.stage} {self.run_id}"

    @property
    def ran(self) -> bool:
        """The run was started (its CPU has the level, its wheel and image were there)."""
        return self.record.exit_code is not None and not self.record.failure

    @property
    def parts(self) -> dict[str, int] | None:
        """How many of the run's tests belong to each part of the suite (verdict.SCOPES)."""
        if self.outcomes is None:
            return None
        return {scope: sum(1 for outcome in self.outcomes.values() if outcome.scope == scope) for scope in SCOPES}


def judge(record: RunRecord) -> Row:
    if record.failure:
        return Row(record, Counts(), f"FAILED: {record.failure}")
    if record.exit_code is None:
        return Row(record, Counts(), "not supported by this CPU")
    report_dir = Path(record.report_dir)
    junit = report_dir / "junit.xml"
    counts, outcomes, problems = Counts(), None, []
    if junit.exists():
        try:
            counts, outcomes = junit_counts(junit), read_junit(junit)
        except ElementTree.ParseError as error:
            problems.append(f"unreadable JUnit report ({error})")
    elif killed := _exit_signal(record.exit_code):
        problems.append(f"killed by {killed} (exit code {record.exit_code}) before pytest wrote its report")
    else:
        problems.append("no JUnit report")
    log = report_dir / "pytest.log"
    if crashed := crash(log.read_text(errors="replace") if log.exists() else "", outcomes or {}):
        problems.append(f"crashed: {crashed.signal} in {', '.join(crashed.where)} on CPU {record.cpu}")
    if outcomes is not None and counts.tests == 0 and not problems:
        problems.append("no tests ran")
    if counts.failures:
        problems.append(f"{counts.failures} failed")
    if record.isa_reported and record.isa_reported != record.isa:
        problems.append(f"selected {record.isa_reported}, expected {record.isa}")
    kernels = properties = compared = None
    try:
        kernels, properties, compared = kernel_use(report_dir), property_cases(report_dir), tolerances(report_dir)
    except (ReportFileError, OSError, ValueError) as error:
        problems.append(f"unreadable test report file {error}")
    if record.exit_code == 124:
        problems.append("timed out")
    elif record.exit_code != 0 and not problems:
        problems.append(f"exit code {record.exit_code}")
    result = "FAILED: " + ", ".join(problems) if problems else "passed"
    return Row(record, counts, result, outcomes, kernels, properties, compared)


def verdicts(rows: Sequence[Row], allowed: Sequence[Allowed] = ()) -> dict[str, Verdict]:
    """The cross-run verdict of each stage: canary runs against canary runs, full against full.
    Every run that started designates, in plan order, the runs of each part of the suite."""
    return {
        stage: compare({row.run_id: row.outcomes for row in rows
                        if row.record.stage == stage and row.outcomes is not None}, allowed,
                       planned=[row.run_id for row in rows if row.record.stage == stage and row.ran])
        for stage in STAGES if any(row.record.stage == stage for row in rows)
    }


def _drifts(row: Row, verdict: Mapping[str, Verdict]) -> list[Drift]:
    stage_verdict = verdict.get(row.record.stage)
    return [drift for drift in stage_verdict.drifts if drift.run == row.run_id] if stage_verdict else []


def judge_all(records: Sequence[RunRecord], allowed: Sequence[Allowed] = ()) -> tuple[list[Row], dict[str, Verdict]]:
    """Every run judged alone, then against the other runs of its stage: a run whose
    tests did not run as on the others fails too; and against every other run: a run
    that compared a (method, dtype) with another tolerance, or recorded none where
    others did (a passed run only: a failed one may have ended before writing it)."""
    rows = [judge(record) for record in records]
    verdict = verdicts(rows, allowed)
    tolerance_drifts = compare_tolerances((row.label, row.tolerances) for row in rows
                                          if row.tolerances is not None or (row.ok and row.outcomes is not None))
    judged = []
    for row in rows:
        problems = []
        if drifts := _drifts(row, verdict):
            problems.append(f"{len(drifts)} tests did not run as on the other runs")
        if own := tuple(drift for drift in tolerance_drifts if drift.run == row.label):
            problems.append(f"{len(own)} comparisons not as on the other runs")
            row = dataclasses.replace(row, tolerance_drifts=own)
        if problems:
            problem = ", ".join(problems)
            row = dataclasses.replace(row, result=f"{row.result}, {problem}" if not row.ok else f"FAILED: {problem}")
        judged.append(row)
    return judged, verdict


def _capped(lines: list[str], indent: str = "  ") -> list[str]:
    more = len(lines) - SHOWN_PER_RUN
    return [f"{indent}- {line}" for line in lines[:SHOWN_PER_RUN]] + (
        [f"{indent}- ... and {more} more (reports/summary.json)"] if more > 0 else [])


def failure_lines(rows: Sequence[Row], verdict: Mapping[str, Verdict]) -> list[str]:
    """Markdown list: each failed run, its failing tests, and the tests that ran otherwise on it."""
    lines = []
    for row in rows:
        if not row.ok:
            lines.append(f"- {row.record.stage} {row.run_id}: {row.result}")
            lines += _capped([f"`{test}` ({outcome.outcome}): {outcome.reason}" for test, outcome in row.failing])
            lines += _capped([f"`{drift}`" for drift in [*_drifts(row, verdict), *row.tolerance_drifts]])
    return lines


_COLUMNS = ("| target | wheel built by | runner | CPU model | ISA path (expected / selected) | passed | failed "
            "| skipped | tests run every run / once per CPU model / once per arch | kernels that ran (level: kinds) "
            "| property cases (valid/invalid/crashes) | wall time | result |")
_STAGE_TITLES = {"canary": "Canary stage (`-m canary`, emulated targets, before the full suites)", "full": "Full suites"}


_ENVIRONMENT_COLUMNS = ("| target and environment | wheel built by | wheel (sha256) | runs | levels passed "
                        "| passed | failed | skipped | wall time | result |")


def environment_label(record: RunRecord) -> str:
    """x86_64 · Debian 13 · GCC 14 · Python 3.13 · torch 2.14.1: the arch and what its wheel met."""
    return " · ".join(filter(None, (record.target, record.environment)))


def _environments(rows: Sequence[Row]) -> list[str]:
    """One row per (arch, environment, builder) of the full suites: each torch and toolchain a
    wheel met, with the wheel's sha256, so that one wheel under two torches reads as such."""
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for row in rows:
        if row.record.stage == "full":
            groups.setdefault((row.record.target, row.record.environment, row.record.builder), []).append(row)
    lines = [_ENVIRONMENT_COLUMNS, "| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | --- |"]
    for group in groups.values():
        first = group[0].record
        ran = [row for row in group if row.ran]
        digests = sorted({row.record.wheel_sha256[:12] for row in group if row.record.wheel_sha256})
        passed_levels = [row.record.isa for row in ran if row.ok]
        failed = [row for row in group if not row.ok]
        result = "passed" if not failed else f"FAILED: {len(failed)} of {len(group)} runs"
        lines.append(
            f"| {environment_label(first)} | {first.builder or '-'} | {', '.join(digests) or '-'} | {len(ran)} "
            f"| {', '.join(passed_levels) or '-'} | {sum(row.counts.passed for row in group)} "
            f"| {sum(row.counts.failures for row in group)} | {sum(row.counts.skipped for row in group)} "
            f"| {clock(sum(row.record.wall_seconds for row in group))} | {result} |")
    return lines


def _table(rows: Sequence[Row]) -> list[str]:
    lines = [_COLUMNS, "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- | ---: | --- |"]
    for row in rows:
        r, c = row.record, row.counts
        lines.append(
            f"| {environment_label(r)} | {r.builder or '-'} | {r.runner} | {r.cpu} | {r.isa} / {r.isa_reported or '-'} | "
            f"{c.passed} | {c.failures} | {c.skipped} | {parts_text(row.parts)} | {kernels_text(row.kernels, r.isa)} | "
            f"{properties_text(row.properties)} | {clock(r.wall_seconds)} | {row.result} |"
        )
    return lines


def markdown(rows: Sequence[Row], steps: StepLog, verdict: Mapping[str, Verdict],
             allowed: Sequence[Allowed] = ()) -> str:
    lines = [f"## {NAME} test matrix", ""]
    if any(row.record.stage == "full" for row in rows):
        lines += ["### Environments (full suites)", "", *_environments(rows), ""]
    for stage in STAGES:
        stage_rows = [row for row in rows if row.record.stage == stage]
        if stage_rows:
            lines += [f"### {_STAGE_TITLES[stage]}", "", *_table(stage_rows), ""]
    lines += ["### Same tests on every run", "",
              "Every run ran and passed the tests of every run; the first run of each CPU model of an "
              "architecture also those once per CPU model, and its first run (x86_64: generic; aarch64: the "
              "first CPU model) those once per architecture (markers: pyproject.toml); each environment "
              "(torch, toolchain) of an architecture the same, in its own runs.", ""]
    for stage, stage_verdict in verdict.items():
        compared = [row for row in rows if row.record.stage == stage and row.outcomes is not None]
        places = len({(row.record.target, row.record.environment) for row in compared})
        state = "the same" if stage_verdict.ok else f"{len(stage_verdict.drifts)} not the same (below)"
        lines.append(f"- {stage}: {stage_verdict.tests} test IDs over {len(compared)} runs "
                     f"in {places} environment{'s' if places != 1 else ''}: {state}")
    if recorded := [row for row in rows if row.tolerances is not None]:
        differing = sum(len(row.tolerance_drifts) for row in rows)
        state = "the same" if not differing else f"{differing} not the same (below)"
        lines.append(f"- the tolerance of each method and dtype, over {len(recorded)} runs: {state}")
    if allowed:
        lines += ["", f"Allowed differences ([{TABLE}] allowed-differences):", "",
                  "| test | where | outcome | reason | runs it applied to |", "| --- | --- | --- | --- | ---: |"]
        for allowance in allowed:
            used = {run for stage_verdict in verdict.values() for a, run, _ in stage_verdict.excused if a == allowance}
            lines.append(f"| `{allowance.test}` | {allowance.scope} | {allowance.outcome} | {allowance.reason} "
                         f"| {len(used)} |")
    if failures := failure_lines(rows, verdict):
        lines += ["", "### What failed", "", *failures]
    lines += ["", "### Steps", "", steps.table(), ""]
    return "\n".join(lines)


def _run_data(row: Row) -> dict[str, object]:
    return {
        **dataclasses.asdict(row.record), "passed": row.counts.passed, "failed": row.counts.failures,
        "skipped": row.counts.skipped, "result": row.result,
        "failing_tests": [{"test": test, **dataclasses.asdict(outcome)} for test, outcome in row.failing],
        "kernels": row.kernels, "property_cases": row.properties, "tests_by_part": row.parts,
        "tolerances": row.tolerances, "tolerance_drifts": [str(drift) for drift in row.tolerance_drifts],
    }


def write_summary(records: list[RunRecord], steps: StepLog, reports: Path, allowed: Sequence[Allowed] = ()) -> bool:
    """Print and write reports/summary.{md,json}; True when every run passed and the
    runs of each stage ran the same tests."""
    rows, verdict = judge_all(records, allowed)
    ok = bool(rows) and all(row.ok for row in rows)
    text = markdown(rows, steps, verdict, allowed)
    reports.mkdir(parents=True, exist_ok=True)
    (reports / "summary.md").write_text(text)
    data = {
        "ok": ok,
        "runs": [_run_data(row) for row in rows],
        "same_tests": {
            stage: {"ok": v.ok, "tests": v.tests, "drifts": [str(drift) for drift in v.drifts],
                    "excused": [{"test": test, "run": str(run), "reason": a.reason} for a, run, test in v.excused]}
            for stage, v in verdict.items()
        },
        "allowed_differences": [dataclasses.asdict(allowance) for allowance in allowed],
        "steps": [dataclasses.asdict(step) for step in steps.steps],
    }
    (reports / "summary.json").write_text(json.dumps(data, indent=2) + "\n")
    if step_summary := os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(step_summary, "a") as file:
            file.write(text)
    print("\n" + text, flush=True)
    return ok
