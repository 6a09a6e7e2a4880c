"""The test records: written by the test flow, read by publish."""

from __future__ import annotations

import hashlib
import json

from harness import records
from harness.suite import RunRecord

JUNIT = ('<testsuite tests="2" failures="{failures}" errors="0" skipped="0">'
         '<testcase classname="tests.t" name="test_a" file="tests/t.py"/>'
         '<testcase classname="tests.t" name="test_b" file="tests/t.py">{failure}</testcase></testsuite>')


def run(tmp_path, cpu, isa, failed=False):
    directory = tmp_path / "runs" / cpu
    directory.mkdir(parents=True)
    (directory / "junit.xml").write_text(JUNIT.format(
        failures=int(failed), failure='<failure message="wrong">x</failure>' if failed else ""))
    return RunRecord("aarch64", "qemu", cpu, isa, isa, int(failed), 1.0, str(directory), builder="cross")


def test_a_record_is_keyed_by_the_wheels_sha256_and_keeps_each_runs_tests(arm, tmp_path):
    wheel = tmp_path / "moe_xarch-0.1-py3-none-manylinux_2_28_aarch64.whl"
    wheel.write_bytes(b"the wheel")
    path = records.record_tested(arm, wheel, [run(tmp_path, "max", "i8mm")], tmp_path / "reports")
    assert path == tmp_path / "reports" / "manifest-aarch64.json"
    (entry,) = json.loads(path.read_text())["wheels"].items()
    assert entry[0] == hashlib.sha256(b"the wheel").hexdigest() == records.sha256(wheel)
    assert entry[1]["file"] == wheel.name and entry[1]["torch"] == arm.torch
    assert entry[1]["runs"] == [{
        "cpu": "max", "isa": "i8mm", "isa_reported": "i8mm", "passed": 2, "failed": 0, "skipped": 0,
        "result": "passed", "tests": {"tests/t.py::test_a": "passed", "tests/t.py::test_b": "passed"},
        "scopes": {}}]


def test_records_of_every_arch_are_read_together(x86, arm, tmp_path):
    reports = tmp_path / "reports"
    for target in (x86, arm):
        wheel = tmp_path / f"{target.arch}.whl"
        wheel.write_bytes(target.arch.encode())
        records.record_tested(target, wheel, [], reports)
    assert sorted(p.name for p in reports.iterdir()) == ["manifest-aarch64.json", "manifest-x86_64.json"]
    assert {entry["arch"] for entry in records.load_manifest(reports)["wheels"].values()} == {"x86_64", "aarch64"}


def test_a_rebuilt_wheel_has_no_record_and_an_untested_model_is_named(arm, tmp_path):
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(b"one")
    records.record_tested(arm, wheel, [run(tmp_path, "max", "i8mm"), run(tmp_path, "neoverse-n1", "dotprod", True)],
                          tmp_path / "reports")
    manifest = records.load_manifest(tmp_path / "reports")
    entry = manifest["wheels"][records.sha256(wheel)]
    assert records.test_problems(arm, entry) == [
        "neoverse-n1/dotprod: FAILED: 1 failed",
        "CPU model cortex-a72 (neon) was not tested",
        "CPU model neoverse-n1 (dotprod) was not tested",
    ]
    wheel.write_bytes(b"rebuilt")
    assert records.test_problems(arm, manifest["wheels"].get(records.sha256(wheel))) == [
        "no test record for this exact file (nox -s test-arm64 tests it)"]


def test_runs_recorded_without_their_test_ids_are_named_with_the_session_to_rerun():
    entry = {"runs": [{"cpu": "max", "isa": "i8mm", "result": "passed"}]}
    assert records.same_tests_problems({"aarch64": entry}, ()) == [
        "aarch64 max/i8mm: recorded without its test IDs (test it again: nox -s test-arm64)"]
