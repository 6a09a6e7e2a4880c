"""The test records: which exact wheel passed which runs, where.

A record is what one test session (or harness/proving/prove.py, on any machine) found for
one wheel: reports/records/<arch>-<sha256>-<producer>-<cpu>.json, read by the
publish gate (harness/proving/gate.py). Records made elsewhere join this checkout's with
`nox -s records -- add FILE...`, which checks them on the way in.

    {"format": FORMAT, "wheel": {"file", "sha256"}, "arch", "builder", "producer",
     "levels": [every level the library carries, as it reported them (docker/environment.py)],
     "where": {"runner", "cpu", "cpu_flags", "os", "compiler", "python", "torch"},
     "runs": [{"cpu", "isa", "isa_reported", "passed", "failed", "skipped", "result",
               "tests": {test ID: outcome}, "scopes": {test ID: scope}, "kernels"}, ...],
     "digest": sha256 of the rest}

The digest is written by the run that made the record: an outcome, a level or a
wheel edited afterwards no longer matches it. It catches edits, not forgery: anyone
can compute it, so a record is as trustworthy as where it came from.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.building.build import wheel_matches
from harness.common.errors import HarnessError, writing
from harness.common.paths import REPORTS, WHEELHOUSE
from harness.common.project import NAME
from harness.plan.targets import Target
from harness.plan.verdict import EVERY_RUN, read_junit
from harness.proving.summary import judge
from harness.running.suite import RunRecord
from harness.setup.wheels import sha256  # noqa: F401 (the gate and publish take it from here)

FORMAT = f"{NAME}-test-record/1"
# key -> the type of its value; a run's keys, and those of "wheel" and "where", are read too
KEYS = {"format": str, "wheel": dict, "arch": str, "builder": str, "producer": str, "levels": list,
        "where": dict, "runs": list, "digest": str}
PARTS = {"wheel": ("file", "sha256"), "where": ("runner", "cpu"),
         "runs": ("cpu", "isa", "result", "tests", "scopes")}
# What a run writes beside its JUnit report (docker/run-kernel-suite.sh).
ENVIRONMENT = "environment.json"


class RecordError(HarnessError):
    """A record refused: the message names the file and what is wrong with it."""


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


def records_dir(reports: Path) -> Path:
    return reports / "records"


def content_digest(record: Mapping[str, Any]) -> str:
    content = {key: value for key, value in record.items() if key != "digest"}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def seal(content: Mapping[str, Any]) -> dict[str, Any]:
    """The record with its digest."""
    return {"format": FORMAT, **content, "digest": content_digest({"format": FORMAT, **content})}


def _run_entry(record: RunRecord) -> dict[str, Any]:
    """A run judged as the summary judges it, so that both agree."""
    row = judge(record)
    junit = Path(record.report_dir) / "junit.xml" if record.report_dir else None
    tests = read_junit(junit) if junit and junit.is_file() else {}
    return {
        "cpu": record.cpu, "isa": record.isa, "isa_reported": record.isa_reported,
        "passed": row.counts.passed, "failed": row.counts.failures, "skipped": row.counts.skipped,
        "result": row.result,
        # what the gate compares across machines and architectures (harness/proving/gate.py)
        "tests": {test: outcome.outcome for test, outcome in tests.items()},
        # which runs must run each test (harness/plan/verdict.py designated), where not every run
        "scopes": {test: outcome.scope for test, outcome in tests.items() if outcome.scope != EVERY_RUN},
        "kernels": row.kernels or {},
    }


def _environment(records: Sequence[RunRecord]) -> dict[str, Any]:
    """What the first run that got as far as installing the wheel said of its environment."""
    for record in records:
        path = Path(record.report_dir) / ENVIRONMENT if record.report_dir else None
        if path and path.is_file():
            return json.loads(path.read_text())
    return {}


def make_record(wheel: Path, arch: str, runner: str, builder: str, producer: str,
                runs: Sequence[RunRecord]) -> dict[str, Any]:
    """The sealed record of a wheel's runs (in plan order) on this machine."""
    environment = _environment(runs)
    where = {key: environment.get(key, "unknown") for key in ("cpu", "os", "compiler", "python", "torch")}
    return seal({
        "wheel": {"file": wheel.name, "sha256": sha256(wheel)},
        "arch": arch, "builder": builder, "producer": producer,
        "levels": environment.get("levels", []),
        "where": {"runner": runner, **where, "cpu_flags": environment.get("cpu_flags", [])},
        "runs": [_run_entry(run) for run in runs],
    })


def record_name(record: Mapping[str, Any]) -> str:
    """One file per wheel, producer, CPU and torch: a new run there replaces the last one
    (the same wheel tested against two torch releases keeps both)."""
    cpu = re.sub(r"[^a-z0-9]+", "-", str(record["where"]["cpu"]).lower()).strip("-") or "unknown"
    torch = re.sub(r"[^a-z0-9.]+", "-", str(record["where"].get("torch", "")).lower()).strip("-") or "unknown"
    return f"{record['arch']}-{record['wheel']['sha256'][:12]}-{record['producer']}-{cpu}-torch{torch}.json"


def store(record: Mapping[str, Any], reports: Path, rerun: str) -> Path:
    path = records_dir(reports) / record_name(record)
    write_json_atomically(path, record, rerun)
    return path


def record_tested(target: Target, builder: str, wheel: Path, runs: Sequence[RunRecord],
                  reports: Path = REPORTS) -> Path:
    """The test flow's record of a target's full suites, in reports/records/."""
    session = target.test_session
    return store(make_record(wheel, target.arch, target.runner, builder, session, runs), reports,
                 f"nox -s {session}")


def check(data: object, source: str) -> dict[str, Any]:
    """The record, if it is one of this format whose content is as its run wrote it."""
    if not isinstance(data, dict):
        raise RecordError(f"{source}: not a test record (a JSON object of {FORMAT})")
    if data.get("format") != FORMAT:
        raise RecordError(f"{source}: unknown record format {data.get('format')!r}; this checkout reads {FORMAT}")
    if missing := [key for key in KEYS if key not in data]:
        raise RecordError(f"{source}: not a whole record, it lacks {', '.join(missing)}")
    if wrong := [key for key, kind in KEYS.items() if not isinstance(data[key], kind)]:
        raise RecordError(f"{source}: not a whole record, {', '.join(wrong)} of the wrong type")
    for part, keys in PARTS.items():
        for item in data[part] if part == "runs" else [data[part]]:
            lacking = [key for key in keys if key not in item] if isinstance(item, dict) else list(keys)
            if lacking:
                raise RecordError(f"{source}: not a whole record, {part} without {', '.join(lacking)}")
    if data["digest"] != content_digest(data):
        raise RecordError(f"{source}: its content does not match its digest: edited after the run that made it "
                          "(an outcome, a level, the wheel?); make it again where it was made")
    return data


def read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RecordError(f"{path}: not a readable test record ({error})") from None
    return check(data, str(path))


def load_records(reports: Path = REPORTS) -> list[dict[str, Any]]:
    """Every record in reports/records/, each checked."""
    directory = records_dir(reports)
    return [read(path) for path in sorted(directory.glob("*.json"))] if directory.is_dir() else []


def add(files: Sequence[Path], wheelhouse: Path = WHEELHOUSE, reports: Path = REPORTS) -> list[Path]:
    """Records made elsewhere, of the very bytes of a wheel in wheelhouse/, join
    reports/records/; one refused refuses them all, each problem named."""
    wheels = sorted(wheelhouse.glob("*.whl")) if wheelhouse.is_dir() else []
    accepted, problems = [], []
    for path in files:
        try:
            record = read(path)
        except RecordError as error:
            problems.append(str(error))
            continue
        arch, tested = record["arch"], record["wheel"]
        ours = [wheel for wheel in wheels if wheel_matches(wheel.name, arch)]
        if not ours:
            problems.append(f"{path}: tested {tested['file']}, and {wheelhouse}/ has no {arch} wheel to check "
                            "it against (put the wheel that was tested there)")
        elif tested["sha256"] not in (digests := {sha256(wheel): wheel for wheel in ours}):
            here = ", ".join(f"{wheel.name} (sha256 {digest[:12]}…)" for digest, wheel in digests.items())
            problems.append(f"{path}: tested {tested['file']} with sha256 {tested['sha256'][:12]}…, other bytes "
                            f"than {here}: a record proves only the bytes it tested")
        else:
            accepted.append(record)
    if problems:
        raise RecordError("refusing to add the records; nothing was added:\n  " + "\n  ".join(problems))
    return [store(record, reports, "nox -s records -- add") for record in accepted]


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="nox -s records --", description="the test records in reports/records/")
    parser.add_argument("--wheelhouse", type=Path, default=WHEELHOUSE)
    parser.add_argument("--reports", type=Path, default=REPORTS)
    commands = parser.add_subparsers(dest="command", required=True)
    adding = commands.add_parser("add", help="check records made elsewhere and add them")
    adding.add_argument("files", nargs="+", type=Path, metavar="FILE")
    commands.add_parser("show", help="which machine proved each level of the wheels in the wheelhouse")
    args = parser.parse_args(list(argv))
    if args.command == "add":
        for path in add(args.files, args.wheelhouse, args.reports):
            print(f"added {path}", flush=True)
    from harness.proving.gate import levels_table  # the gate reads records: imported here, one way round

    print(levels_table(args.wheelhouse, args.reports), flush=True)


if __name__ == "__main__":  # what nox -s records runs
    try:
        main(sys.argv[1:])
    except HarnessError as error:
        print(f"records: {error}", file=sys.stderr, flush=True)
        sys.exit(1)
