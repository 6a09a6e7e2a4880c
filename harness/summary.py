"""The closing summary of a run: target x CPU model x ISA x passed/failed/skipped/time,
printed, and written as Markdown (a GitHub step summary as is) and JSON."""

from __future__ import annotations

import dataclasses
import json
import os
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from harness.console import StepLog, clock
from harness.suite import RunRecord


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


@dataclasses.dataclass(frozen=True)
class Row:
    record: RunRecord
    counts: Counts
    result: str  # "passed", "not supported by this CPU", or "FAILED: <why>"

    @property
    def ok(self) -> bool:
        return not self.result.startswith("FAILED")


def judge(record: RunRecord) -> Row:
    if record.failure:
        return Row(record, Counts(), f"FAILED: {record.failure}")
    if record.exit_code is None:
        return Row(record, Counts(), "not supported by this CPU")
    junit = Path(record.report_dir) / "junit.xml"
    counts = junit_counts(junit) if junit.exists() else Counts()
    problems = []
    if not junit.exists():
        problems.append("no JUnit report")
    elif counts.tests == 0:
        problems.append("no tests ran")
    if counts.failures:
        problems.append(f"{counts.failures} failed")
    if record.isa_reported and record.isa_reported != record.isa:
        problems.append(f"selected {record.isa_reported}, expected {record.isa}")
    if record.exit_code == 124:
        problems.append("timed out")
    elif record.exit_code != 0 and not problems:
        problems.append(f"exit code {record.exit_code}")
    return Row(record, counts, "FAILED: " + ", ".join(problems) if problems else "passed")


def markdown(rows: list[Row], steps: StepLog) -> str:
    lines = [
        "## moe-kernels test matrix",
        "",
        "| target | wheel built by | runner | CPU model | ISA path (expected / selected) | passed | failed | skipped | wall time | result |",
        "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        r, c = row.record, row.counts
        selected = r.isa_reported or "-"
        lines.append(
            f"| {r.target} | {r.builder or '-'} | {r.runner} | {r.cpu} | {r.isa} / {selected} | {c.passed} | "
            f"{c.failures} | {c.skipped} | {clock(r.wall_seconds)} | {row.result} |"
        )
    lines += ["", "### Steps", "", steps.table(), ""]
    return "\n".join(lines)


def write_summary(records: list[RunRecord], steps: StepLog, reports: Path) -> bool:
    """Print and write reports/summary.{md,json}; True when every run passed."""
    rows = [judge(record) for record in records]
    ok = bool(rows) and all(row.ok for row in rows)
    text = markdown(rows, steps)
    reports.mkdir(parents=True, exist_ok=True)
    (reports / "summary.md").write_text(text)
    data = {
        "ok": ok,
        "runs": [
            {**dataclasses.asdict(row.record), "passed": row.counts.passed,
             "failed": row.counts.failures, "skipped": row.counts.skipped, "result": row.result}
            for row in rows
        ],
        "steps": [dataclasses.asdict(step) for step in steps.steps],
    }
    (reports / "summary.json").write_text(json.dumps(data, indent=2) + "\n")
    if step_summary := os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(step_summary, "a") as file:
            file.write(text)
    print("\n" + text, flush=True)
    return ok
