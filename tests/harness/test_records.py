"""The test records: written by a run, sealed by its digest, added from elsewhere only
for the same wheel bytes and intact."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys

import pytest

from harness.proving import records
from harness.running.suite import RunRecord
from tests.harness.conftest import REPO

JUNIT = ('<testsuite tests="2" failures="{failures}" errors="0" skipped="0">'
         '<testcase classname="tests.t" name="test_a" file="tests/t.py"/>'
         '<testcase classname="tests.t" name="test_b" file="tests/t.py">{failure}</testcase></testsuite>')
ENVIRONMENT = {"levels": ["generic", "neon", "dotprod", "i8mm"], "supported": ["generic", "neon"],
               "torch": "2.10.0", "python": "3.11.2", "os": "Debian GNU/Linux 12 (bookworm)",
               "compiler": "none on PATH", "cpu": "Test CPU 9000", "cpu_flags": ["fp", "asimd"]}


def run(tmp_path, cpu, isa, failed=False, environment=True):
    directory = tmp_path / "runs" / cpu
    directory.mkdir(parents=True)
    (directory / "junit.xml").write_text(JUNIT.format(
        failures=int(failed), failure='<failure message="wrong">x</failure>' if failed else ""))
    (directory / "kernel-use-1.json").write_text(json.dumps({"isa": isa, "counts": {"gemm_s8": {isa: 3}}}))
    if environment:
        (directory / records.ENVIRONMENT).write_text(json.dumps(ENVIRONMENT))
    return RunRecord("aarch64", "qemu", cpu, isa, isa, int(failed), 1.0, str(directory), builder="cross")


def wheel_file(directory, payload=b"the wheel", arch="aarch64"):
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"moe_xarch-0.1-py3-none-manylinux_2_28_{arch}.whl"
    wheel.write_bytes(payload)
    return wheel


def test_a_record_names_the_wheel_where_it_ran_its_levels_tests_and_kernels(arm, tmp_path):
    wheel = wheel_file(tmp_path / "wheelhouse")
    path = records.record_tested(arm, "cross", wheel, [run(tmp_path, "max", "i8mm")], tmp_path / "reports")
    record = json.loads(path.read_text())
    assert path.parent == tmp_path / "reports" / "records"
    assert path.name == f"aarch64-{hashlib.sha256(b'the wheel').hexdigest()[:12]}-test-arm64-test-cpu-9000-torch2.10.0.json"
    assert record["wheel"] == {"file": wheel.name, "sha256": records.sha256(wheel)}
    assert record["levels"] == ENVIRONMENT["levels"]  # as the library reported them
    assert record["where"] == {"runner": "qemu", "cpu": "Test CPU 9000", "os": "Debian GNU/Linux 12 (bookworm)",
                               "compiler": "none on PATH", "python": "3.11.2", "torch": "2.10.0",
                               "cpu_flags": ["fp", "asimd"]}
    assert record["runs"] == [{
        "cpu": "max", "isa": "i8mm", "isa_reported": "i8mm", "passed": 2, "failed": 0, "skipped": 0,
        "result": "passed", "tests": {"tests/t.py::test_a": "passed", "tests/t.py::test_b": "passed"},
        "scopes": {}, "kernels": {"i8mm": {"gemm_s8": 3}}}]
    assert records.load_records(tmp_path / "reports") == [record]


def test_a_new_run_of_the_same_wheel_there_replaces_its_record(arm, tmp_path):
    wheel = wheel_file(tmp_path / "wheelhouse")
    first = records.record_tested(arm, "cross", wheel, [run(tmp_path / "1", "max", "i8mm", failed=True)],
                                  tmp_path / "reports")
    second = records.record_tested(arm, "cross", wheel, [run(tmp_path / "2", "max", "i8mm")], tmp_path / "reports")
    assert first == second
    assert [r["runs"][0]["result"] for r in records.load_records(tmp_path / "reports")] == ["passed"]


@pytest.fixture
def made(arm, tmp_path):
    """(record file made elsewhere, this checkout's wheelhouse holding the same bytes, reports)."""
    elsewhere = records.record_tested(arm, "cross", wheel_file(tmp_path / "there"), [run(tmp_path, "max", "i8mm")],
                                      tmp_path / "there-reports")
    wheel_file(tmp_path / "wheelhouse")
    return elsewhere, tmp_path / "wheelhouse", tmp_path / "reports"


def test_a_record_of_the_same_wheel_bytes_is_added(made):
    elsewhere, wheelhouse, reports = made
    (added,) = records.add([elsewhere], wheelhouse, reports)
    assert added == records.records_dir(reports) / elsewhere.name
    assert records.load_records(reports) == [json.loads(elsewhere.read_text())]


def test_a_record_of_other_wheel_bytes_is_refused_naming_both(made):
    elsewhere, wheelhouse, reports = made
    (wheel,) = wheelhouse.glob("*.whl")
    wheel.write_bytes(b"a rebuilt wheel")
    with pytest.raises(records.RecordError) as error:
        records.add([elsewhere], wheelhouse, reports)
    message = str(error.value)
    assert message.startswith("refusing to add the records; nothing was added:\n")
    assert f"{elsewhere}: tested {wheel.name} with sha256 {hashlib.sha256(b'the wheel').hexdigest()[:12]}…" in message
    assert f"{wheel.name} (sha256 {records.sha256(wheel)[:12]}…): a record proves only the bytes it tested" in message
    assert not records.records_dir(reports).exists()


def test_a_record_whose_outcome_was_edited_is_refused(made):
    elsewhere, wheelhouse, reports = made
    record = json.loads(elsewhere.read_text())
    record["runs"][0]["tests"]["tests/t.py::test_b"] = "passed"  # unchanged: still intact
    elsewhere.write_text(json.dumps(record))
    assert records.add([elsewhere], wheelhouse, reports)
    record["runs"][0]["result"] = "passed"
    record["runs"][0]["tests"]["tests/t.py::test_b"] = "failed"
    elsewhere.write_text(json.dumps(record))
    with pytest.raises(records.RecordError, match="its content does not match its digest: edited after the run"):
        records.add([elsewhere], wheelhouse, reports)


def test_a_record_with_a_level_added_afterwards_is_refused(made):
    elsewhere, wheelhouse, reports = made
    record = json.loads(elsewhere.read_text())
    record["runs"].append(record["runs"][0] | {"isa": "dotprod"})
    elsewhere.write_text(json.dumps(record))
    with pytest.raises(records.RecordError, match="does not match its digest"):
        records.add([elsewhere], wheelhouse, reports)


@pytest.mark.parametrize(("content", "problem"), [
    ("{not json", "not a readable test record"),
    ("[]", "not a test record (a JSON object of moe-xarch-test-record/1)"),
    ('{"wheels": {}}', "unknown record format None; this checkout reads moe-xarch-test-record/1"),
    ('{"format": "moe-xarch-test-record/1", "wheel": {}}', "not a whole record, it lacks arch, builder"),
])
def test_what_is_not_a_record_of_this_format_is_refused(made, content, problem):
    elsewhere, wheelhouse, reports = made
    elsewhere.write_text(content)
    with pytest.raises(records.RecordError, match=re.escape(problem)):
        records.add([elsewhere], wheelhouse, reports)


@pytest.mark.parametrize(("part", "value", "problem"), [
    ("runs", [{"cpu": "max", "isa": "i8mm", "result": "passed"}], "runs without tests, scopes"),
    ("runs", ["passed"], "runs without cpu, isa, result, tests, scopes"),
    ("levels", "generic", "levels of the wrong type"),
    ("wheel", {"file": "w.whl"}, "wheel without sha256"),
])
def test_a_sealed_record_of_the_wrong_shape_is_refused(made, part, value, problem):
    """A producer's bug, not an edit: its digest matches, the gate could not read it."""
    elsewhere, wheelhouse, reports = made
    record = json.loads(elsewhere.read_text())
    record[part] = value
    elsewhere.write_text(json.dumps(records.seal({k: v for k, v in record.items() if k not in ("format", "digest")})))
    with pytest.raises(records.RecordError, match=f"{elsewhere}: not a whole record, {problem}"):
        records.add([elsewhere], wheelhouse, reports)


def test_a_record_of_an_arch_the_wheelhouse_has_no_wheel_of_is_refused(made):
    elsewhere, wheelhouse, reports = made
    for wheel in wheelhouse.glob("*.whl"):
        wheel.unlink()
    with pytest.raises(records.RecordError, match="has no aarch64 wheel to check it against"):
        records.add([elsewhere], wheelhouse, reports)


def test_one_refused_record_adds_none(made, arm, tmp_path):
    elsewhere, wheelhouse, reports = made
    other = records.record_tested(arm, "cross", wheel_file(tmp_path / "other", b"other bytes"),
                                  [run(tmp_path / "o", "max", "i8mm")], tmp_path / "other-reports")
    with pytest.raises(records.RecordError, match="other bytes"):
        records.add([elsewhere, other], wheelhouse, reports)
    assert records.load_records(reports) == []


def test_the_records_command_adds_and_refuses_without_a_traceback(made):
    """`nox -s records -- add FILE`, as the session runs it."""
    elsewhere, wheelhouse, reports = made

    def records_add() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "harness.proving.records", "--wheelhouse", str(wheelhouse),
                               "--reports", str(reports), "add", str(elsewhere)],
                              cwd=REPO, capture_output=True, text=True, timeout=120)

    added = records_add()
    assert added.returncode == 0, added.stderr
    assert f"added {records.records_dir(reports) / elsewhere.name}" in added.stdout
    elsewhere.write_text("{}")
    refused = records_add()
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith(f"records: refusing to add the records; nothing was added:\n  {elsewhere}: ")
