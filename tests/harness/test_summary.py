from __future__ import annotations

import json

import pytest

from harness import console
from harness.suite import RunRecord
from harness.summary import judge, junit_counts, write_summary

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites name="pytest tests"><testsuite name="pytest" errors="{errors}" failures="{failures}"
 skipped="{skipped}" tests="{tests}" time="12.5"><testcase classname="t" name="a" time="1"/></testsuite>
</testsuites>"""


def record(tmp_path, *, tests=10, failures=0, errors=0, skipped=2, exit_code=0, isa="neon", reported="neon"):
    directory = tmp_path / f"run-{tests}-{failures}-{errors}-{exit_code}-{reported}"
    directory.mkdir()
    if tests is not None:
        (directory / "junit.xml").write_text(
            JUNIT.format(tests=tests, failures=failures, errors=errors, skipped=skipped)
        )
    return RunRecord("aarch64", "qemu", "cortex-a72", isa, reported, exit_code, 75.0, str(directory),
                     builder="cross")


def test_junit_counts(tmp_path):
    row = judge(record(tmp_path, tests=10, failures=1, errors=1, skipped=2, exit_code=1))
    assert (row.counts.tests, row.counts.passed, row.counts.failures, row.counts.skipped) == (10, 6, 2, 2)
    assert row.counts.seconds == 12.5


def test_single_testsuite_root(tmp_path):
    path = tmp_path / "j.xml"
    path.write_text('<testsuite tests="3" failures="0" errors="0" skipped="1" time="1"/>')
    assert junit_counts(path).passed == 2


@pytest.mark.parametrize(
    ("kwargs", "result"),
    [
        ({}, "passed"),
        ({"tests": 0, "skipped": 0, "exit_code": 5}, "FAILED: no tests ran"),
        ({"tests": None, "exit_code": 1}, "FAILED: no JUnit report"),
        ({"failures": 2, "exit_code": 1}, "FAILED: 2 failed"),
        ({"reported": "neon", "isa": "i8mm"}, "FAILED: selected neon, expected i8mm"),
        ({"exit_code": 3}, "FAILED: exit code 3"),
        ({"exit_code": 124}, "FAILED: timed out"),
    ],
)
def test_judge(tmp_path, kwargs, result):
    assert judge(record(tmp_path, **kwargs)).result == result


def test_unsupported_and_unrunnable(arm):
    unsupported = RunRecord("x86_64", "native", "host", "avx512_bf16", "", None, 0.0, "")
    assert judge(unsupported).result == "not supported by this CPU" and judge(unsupported).ok
    broken = RunRecord.could_not_run(arm, "cross", "CommandFailed: build aarch64")
    assert judge(broken).result == "FAILED: CommandFailed: build aarch64" and not judge(broken).ok


def test_write_summary(tmp_path, monkeypatch):
    step_summary = tmp_path / "github-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    steps = console.StepLog([console.StepTime("build aarch64 (cross)", 600.0, "done")])
    reports = tmp_path / "reports"
    assert write_summary([record(tmp_path)], steps, reports)
    text = (reports / "summary.md").read_text()
    assert "| aarch64 | cross | qemu | cortex-a72 | neon / neon | 8 | 0 | 2 | 01:15 | passed |" in text
    assert "| build aarch64 (cross) | done | 10:00 |" in text
    assert step_summary.read_text() == text
    data = json.loads((reports / "summary.json").read_text())
    assert data["ok"] and data["runs"][0]["passed"] == 8 and data["steps"][0]["seconds"] == 600.0
    assert not write_summary([record(tmp_path, failures=1, exit_code=1)], steps, reports)
    assert not write_summary([], steps, reports)  # nothing ran is not a pass
