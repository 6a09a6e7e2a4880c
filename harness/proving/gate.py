"""The publish gate: every level a wheel ships is proven by a passing run of those bytes.

The levels a wheel ships are the ones its own library reported when a run installed
it (a record's "levels", harness/proving/records.py), never a list kept here. Each needs a
passing run at that level in some record of the wheel's sha256, from any machine,
and no failed run; and the runs of every record of every wheel to publish ran the
same tests (harness/plan/verdict.py). A level no machine could run passes only by
name, with a reason (`--allow-untested-level LEVEL --reason WHY`), which is
printed and kept in reports/untested/ beside the records.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.building.build import wheel_matches
from harness.common.errors import HarnessError
from harness.plan.runners import runner_for
from harness.plan.targets import Target, load_targets
from harness.plan.verdict import EVERY_RUN, Allowed, Outcome, RunId, compare
from harness.proving.records import load_records, sha256, write_json_atomically

PROVE = "python -m harness.proving.prove --wheel FILE on a machine that has it, then nox -s records -- add"


@dataclasses.dataclass(frozen=True)
class Level:
    arch: str
    level: str
    proven_by: tuple[str, ...]  # where each passing run at the level ran
    untested_because: str = ""  # the reason it may ship unproven, where one was given

    @property
    def proof(self) -> str:
        if self.proven_by:
            return "; ".join(self.proven_by)
        return f"UNTESTED, allowed: {self.untested_because}" if self.untested_because else "UNPROVEN"


def where(record: Mapping[str, Any]) -> str:
    """The machine a record comes from, as the gate names it."""
    return f"{record['where']['cpu']} ({record['where']['runner']}, {record['producer']})"


def of_wheel(records: Sequence[Mapping[str, Any]], digest: str) -> list[Mapping[str, Any]]:
    return [record for record in records if record["wheel"]["sha256"] == digest]


def shipped(mine: Sequence[Mapping[str, Any]]) -> list[str]:
    """The levels the wheel's library reported carrying, in ladder order."""
    return list(dict.fromkeys(level for record in mine for level in record["levels"]))


def levels(target: Target, mine: Sequence[Mapping[str, Any]], untested: Mapping[str, str]) -> list[Level]:
    """Each shipped level and what proves it."""
    return [Level(target.arch, level,
                  tuple(f"{where(record)} {run['cpu']}" for record in mine for run in record["runs"]
                        if run["isa"] == level and run["result"] == "passed"),
                  untested.get(level, ""))
            for level in shipped(mine)]


def problems(target: Target, mine: Sequence[Mapping[str, Any]], untested: Mapping[str, str]) -> list[str]:
    """Why the records of one wheel (``mine``) do not let it ship (empty: they do)."""
    if not mine:
        return [f"no test record for this exact file (nox -s {target.test_session} tests it, or {PROVE})"]
    found = [f"{where(record)} {run['cpu']}/{run['isa']}: {run['result']}"
             for record in mine for run in record["runs"] if run["result"].startswith("FAILED")]
    ladders = {tuple(record["levels"]) for record in mine}
    if ladders == {()}:
        found.append("no record names the levels it ships (no run got as far as installing it)")
    elif len(ladders) > 1:
        found.append(f"its records disagree on the levels it ships: {' / '.join(map(', '.join, sorted(ladders)))}")
    if runner_for(target).emulated:
        passed = {(run["cpu"], run["isa"]) for record in mine for run in record["runs"] if run["result"] == "passed"}
        found += [f"CPU model {model.name} ({model.isa}) was not tested"
                  for model in target.cpu_models if (model.name, model.isa) not in passed]
    if unproven := [level.level for level in levels(target, mine, untested)
                    if not level.proven_by and not level.untested_because]:
        found.append(f"ships levels no record proves: {', '.join(unproven)} ({PROVE}; or, knowingly, "
                     f"--allow-untested-level LEVEL --reason WHY)")
    return found


def same_tests_problems(records: Sequence[Mapping[str, Any]], allowed: Sequence[Allowed]) -> list[str]:
    """The passing runs of every record of the wheels to publish, from every machine
    and architecture, ran the same tests, as the matrix verdict requires of its own.
    Each machine's runs designate their own runs of each part of the suite, and so do
    each torch's: the same wheel tested against two torch releases runs every part under both."""
    runs: dict[RunId, dict[str, Outcome]] = {}
    for record in records:
        # A level the CPU lacks ran no tests; a failed run is refused by problems() already.
        for run in (run for run in record["runs"] if run["result"] == "passed"):
            scopes = run["scopes"]
            torch = str(record["where"].get("torch", "unknown")).removeprefix("torch==")
            runs[RunId(record["arch"], where(record), run["cpu"], run["isa"], f"torch {torch}")] = {
                test: Outcome(outcome, scope=scopes.get(test, EVERY_RUN)) for test, outcome in run["tests"].items()}
    return [f"not the same tests: {drift}" for drift in compare(runs, allowed).drifts] if runs else []


def untested_levels(levels_allowed: Sequence[str], reasons: Sequence[str]) -> dict[str, str]:
    """--allow-untested-level LEVEL (repeatable) with one --reason for all, or one each."""
    if not levels_allowed:
        if reasons:
            raise HarnessError("--reason: give it with --allow-untested-level LEVEL")
        return {}
    if len(reasons) not in (1, len(levels_allowed)):
        raise HarnessError(f"--reason: give one for every --allow-untested-level ({len(levels_allowed)}) "
                           f"or one for all, not {len(reasons)}")
    if any(not reason.strip() for reason in reasons):
        raise HarnessError("--reason: say why the level may ship without a run (it is printed and kept)")
    return dict(zip(levels_allowed, reasons * len(levels_allowed) if len(reasons) == 1 else reasons, strict=True))


def keep_untested(used: Sequence[Level], digests: Mapping[str, str], reports: Path) -> list[Path]:
    """The levels let through unproven, kept per wheel in reports/untested/ beside its records."""
    paths = []
    when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    for arch in sorted({level.arch for level in used}):
        path = reports / "untested" / f"{arch}-{digests[arch][:12]}.json"
        write_json_atomically(path, {"wheel_sha256": digests[arch], "arch": arch, "when": when,
                                     "levels": {level.level: level.untested_because for level in used
                                                if level.arch == arch}}, "nox -s publish")
        paths.append(path)
    return paths


def table(rows: Sequence[Level]) -> str:
    """Markdown: per shipped level, which machine proved it."""
    lines = ["| arch | level | proven by |", "| --- | --- | --- |"]
    lines += [f"| {row.arch} | {row.level} | {row.proof} |" for row in rows]
    return "\n".join(lines)


def levels_table(wheelhouse: Path, reports: Path, pyproject: Path | None = None) -> str:
    """The table for every target's wheel in wheelhouse/ (nox -s records)."""
    targets = load_targets(pyproject) if pyproject else load_targets()
    wheels = sorted(wheelhouse.glob("*.whl")) if wheelhouse.is_dir() else []
    if not wheels:
        return f"no wheel in {wheelhouse} (nox -s build makes them)"
    records = load_records(reports)
    rows, lines = [], []
    for arch, target in targets.items():
        for wheel in wheels:
            if wheel_matches(wheel.name, arch):
                mine = of_wheel(records, sha256(wheel))
                rows += levels(target, mine, {})
                lines += [f"{wheel.name}: {problem}" for problem in problems(target, mine, {})]
    return "\n".join([table(rows), *([""] + lines if lines else [])])
