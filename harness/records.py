"""The test records: which exact wheel passed which runs.

Written by the test flow after each target's full suite (harness/flows.py),
read by publish (harness/publish.py), which uploads only wheels with a passing
record. One file per architecture, reports/manifest-<arch>.json, so that CI
jobs of different architectures hand theirs over side by side:

    {"wheels": {"<sha256 of the wheel>": {"file": ..., "arch": ..., "torch": ...,
                "runs": [{"cpu", "isa", "isa_reported", "passed", "failed", "skipped",
                          "result", "tests": {test ID: outcome}}, ...]}}}

Keyed by sha256, so a rebuilt wheel has no record until it is tested.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.errors import writing
from harness.paths import REPORTS
from harness.suite import RunRecord
from harness.summary import judge
from harness.targets import ARCHES, Target
from harness.verdict import EVERY_RUN, Allowed, Outcome, RunId, compare, read_junit


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json_atomically(path: Path, data: object, rerun: str) -> None:
    """A failed write leaves the previous file whole; `rerun` is the command to run again."""
    incoming = None
    try:
        with writing(path.parent, rerun):
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as file:
                incoming = Path(file.name)
                json.dump(data, file, indent=2)
                file.write("\n")
            os.replace(incoming, path)
    finally:
        if incoming is not None:
            incoming.unlink(missing_ok=True)


def manifest_path(reports: Path, arch: str) -> Path:
    return reports / f"manifest-{arch}.json"


def load_manifest(reports: Path = REPORTS) -> dict[str, Any]:
    """Every test record in reports/, the architectures' files merged."""
    merged: dict[str, Any] = {"wheels": {}}
    for path in sorted(reports.glob("manifest*.json")):
        merged["wheels"].update(json.loads(path.read_text()).get("wheels", {}))
    return merged


def record_tested(target: Target, wheel: Path, records: Sequence[RunRecord], reports: Path = REPORTS) -> Path:
    """Record a target's test runs against the exact wheel they installed, each run
    judged as the summary judges it, so that both agree."""
    runs = []
    for record in records:
        row = judge(record)
        junit = Path(record.report_dir) / "junit.xml" if record.report_dir else None
        tests = read_junit(junit) if junit and junit.is_file() else {}
        runs.append(
            {"cpu": record.cpu, "isa": record.isa, "isa_reported": record.isa_reported,
             "passed": row.counts.passed, "failed": row.counts.failures,
             "skipped": row.counts.skipped, "result": row.result,
             # what publish compares across the architectures (same_tests_problems)
             "tests": {test: outcome.outcome for test, outcome in tests.items()},
             # which runs must run each test (harness/verdict.py designated), where not every run
             "scopes": {test: outcome.scope for test, outcome in tests.items() if outcome.scope != EVERY_RUN}}
        )
    path = manifest_path(reports, target.arch)
    manifest = json.loads(path.read_text()) if path.exists() else {"wheels": {}}
    manifest["wheels"][sha256(wheel)] = {
        "file": wheel.name, "arch": target.arch, "torch": target.torch, "runs": runs,
    }
    write_json_atomically(path, manifest, f"nox -s {target.test_session}")
    return path


def test_problems(target: Target, entry: Mapping[str, Any] | None) -> list[str]:
    """Why a manifest entry is not a passing test record for the target (empty: it is)."""
    if entry is None:
        return [f"no test record for this exact file (nox -s {target.test_session} tests it)"]
    runs = entry.get("runs", [])
    problems = [f"{run['cpu']}/{run['isa']}: {run['result']}" for run in runs
                if run["result"].startswith("FAILED")]
    passed = {(run["cpu"], run["isa"]) for run in runs if run["result"] == "passed"}
    if target.runner == "qemu":
        problems += [f"CPU model {model.name} ({model.isa}) was not tested"
                     for model in target.cpu_models if (model.name, model.isa) not in passed]
    else:
        ran = {run["isa"] for run in runs}
        problems += [f"ISA level {level} has no record" for level in target.isa_levels if level not in ran]
    if not passed:
        problems.append("no run passed")
    return problems


def same_tests_problems(entries: Mapping[str, Mapping[str, Any]], allowed: Sequence[Allowed]) -> list[str]:
    """The recorded runs of the wheels to publish (arch -> manifest entry) must have run
    the same tests, as the matrix verdict requires: test sessions run one arch at a time."""
    runs: dict[RunId, dict[str, Outcome]] = {}
    problems = []
    for arch, entry in entries.items():
        # Only runs that ran: a level this CPU lacks has no tests, and a failed run is
        # refused by test_problems already.
        for run in (run for run in entry.get("runs", []) if run["result"] == "passed"):
            if "tests" not in run:
                problems.append(f"{arch} {run['cpu']}/{run['isa']}: recorded without its test IDs "
                                f"(test it again: nox -s {ARCHES[arch].test_session})")
                continue
            scopes = run.get("scopes", {})
            runs[RunId(arch, "", run["cpu"], run["isa"])] = {
                test: Outcome(outcome, scope=scopes.get(test, EVERY_RUN)) for test, outcome in run["tests"].items()}
    if runs and not problems:
        problems += [f"not the same tests: {drift}" for drift in compare(runs, allowed).drifts]
    return problems
