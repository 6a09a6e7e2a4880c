from __future__ import annotations

import json

import pytest

from harness.common import console
from harness.proving import summary
from harness.proving.summary import judge, junit_counts, write_summary
from harness.running.suite import RunRecord

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
    assert "| aarch64 | cross | qemu | cortex-a72 | neon / neon | 8 | 0 | 2 | 1 / 0 / 0 | - | - | 01:15 | passed |" in text
    assert "- full: 1 test IDs over 1 runs in 1 environment: the same" in text
    assert "| build aarch64 (cross) | done | 10:00 |" in text
    assert step_summary.read_text() == text
    data = json.loads((reports / "summary.json").read_text())
    assert data["ok"] and data["runs"][0]["passed"] == 8 and data["steps"][0]["seconds"] == 600.0
    assert not write_summary([record(tmp_path, failures=1, exit_code=1)], steps, reports)
    assert not write_summary([], steps, reports)  # nothing ran is not a pass


def junit_of(cases: str, failures: int = 0, errors: int = 0) -> str:
    return (f'<testsuites><testsuite tests="{cases.count("<testcase")}" failures="{failures}" '
            f'errors="{errors}" skipped="{cases.count("<skipped")}" time="1">{cases}</testsuite></testsuites>')


FAILING = junit_of(
    '<testcase classname="tests.kernels.test_a" name="test_ok" file="tests/kernels/test_a.py"/>'
    '<testcase classname="tests.kernels.test_a" name="test_bad[int8]" file="tests/kernels/test_a.py">'
    '<failure message="AssertionError: Tensor-likes are not close!&#10;Mismatched elements: 3">x</failure>'
    "</testcase>"
    '<testcase classname="tests.kernels.test_a" name="test_crash" file="tests/kernels/test_a.py">'
    "<error message=\"failed on setup with &quot;worker 'gw1' crashed while running "
    "'tests/kernels/test_a.py::test_crash'&quot;\">x</error></testcase>",
    failures=1, errors=1,
)
FAULTHANDLER = """..F.Fatal Python error: Illegal instruction

Thread 0x00007fb743dff6c0 (most recent call first):
  File "/opt/python/lib/python3.11/site-packages/execnet/gateway_base.py", line 534 in read

Current thread 0x00007fb7451d2b80 (most recent call first):
  File "/src/tests/kernels/test_a.py", line 15 in test_crash
  File "/opt/python/lib/python3.11/site-packages/_pytest/python.py", line 187 in pytest_pyfunc_call
"""


def run_dir(tmp_path, name="run", files=None):
    """A run's report dir holding files {name: text}."""
    directory = tmp_path / name
    directory.mkdir()
    for file, text in (files or {}).items():
        (directory / file).write_text(text)
    return directory


def arm_record(directory, exit_code=1, cpu="a64fx", isa="neon", stage="full"):
    return RunRecord("aarch64", "qemu", cpu, isa, isa, exit_code, 60.0, str(directory), builder="cross",
                     stage=stage)


def test_a_failed_run_names_its_failing_tests_and_the_crash_with_its_signal(tmp_path):
    directory = run_dir(tmp_path)
    (directory / "junit.xml").write_text(FAILING)
    (directory / "pytest.log").write_text(FAULTHANDLER)
    row = judge(arm_record(directory))
    assert row.result == ("FAILED: crashed: SIGILL (Illegal instruction) in tests/kernels/test_a.py::test_crash "
                          "on CPU a64fx, 2 failed")
    text = summary.markdown([row], console.StepLog(), {})
    assert ("  - `tests/kernels/test_a.py::test_bad[int8]` (failed): AssertionError: Tensor-likes are not close!"
            in text)
    assert "- full aarch64 (cross) CPU a64fx, ISA neon: FAILED: crashed: SIGILL" in text


def test_a_crash_outside_xdist_is_named_by_its_test_function_or_file(tmp_path):
    collection = FAULTHANDLER.replace("line 15 in test_crash", "line 2 in <module>")
    directory = run_dir(tmp_path, "run", {"junit.xml": junit_of(""), "pytest.log": collection})
    assert judge(arm_record(directory, exit_code=5)).result == (
        "FAILED: crashed: SIGILL (Illegal instruction) in tests/kernels/test_a.py line 2 (<module>) on CPU a64fx")
    directory = run_dir(tmp_path, "single",
                        {"pytest.log": FAULTHANDLER.replace("Illegal instruction", "Bus error")})
    assert judge(arm_record(directory, exit_code=135)).result == (
        "FAILED: killed by SIGBUS (exit code 135) before pytest wrote its report, "
        "crashed: SIGBUS (Bus error) in tests/kernels/test_a.py::test_crash on CPU a64fx")


def test_a_container_killed_mid_test_is_one_line(tmp_path):
    directory = run_dir(tmp_path, "run", {"pytest.log": "...."})
    assert judge(arm_record(directory, exit_code=137)).result == (
        "FAILED: killed by SIGKILL (exit code 137) before pytest wrote its report")
    cut = run_dir(tmp_path, "cut", {"junit.xml": "<testsuites><testsuite tests="})
    assert judge(arm_record(cut, exit_code=1)).result.startswith("FAILED: unreadable JUnit report (")


def test_a_worker_killed_without_a_dump_still_names_the_test(tmp_path):
    directory = run_dir(tmp_path, "run", {"junit.xml": FAILING, "pytest.log": ""})
    assert "crashed: a signal faulthandler cannot report (SIGKILL?) in tests/kernels/test_a.py::test_crash" in (
        judge(arm_record(directory)).result)


KERNEL_USE_1 = '{"isa": "i8mm", "counts": {"gemm_s8": {"i8mm": 4}, "gemm_f32": {"neon": 2, "i8mm": 0}}}'
KERNEL_USE_2 = '{"isa": "i8mm", "counts": {"gemm_bf16": {"i8mm": 1}, "gemm_s8": {"i8mm": 3}}}'


def test_kernel_use_and_property_cases_are_merged_over_the_processes(tmp_path):
    directory = run_dir(tmp_path, "run", {
        "junit.xml": JUNIT.format(tests=1, failures=0, errors=0, skipped=0),
        "kernel-use-11.json": KERNEL_USE_1, "kernel-use-12.json": KERNEL_USE_2,
        "property-cases-11.json": '{"valid": 30, "invalid": 5, "crashes": 0}',
        "property-cases-12.json": '{"valid": 12, "invalid": 1, "crashes": 1}',
    })
    row = judge(arm_record(directory, exit_code=0, cpu="max", isa="i8mm"))
    assert row.ok and row.kernels == {"i8mm": {"gemm_s8": 7, "gemm_bf16": 1, "gemm_f32": 0}, "neon": {"gemm_f32": 2}}
    assert row.properties == {"valid": 42, "invalid": 6, "crashes": 1}
    text = summary.markdown([row], console.StepLog(), {})
    assert "| i8mm: gemm_bf16 gemm_s8; neon: gemm_f32 | 42/6/1 |" in text
    assert summary.kernels_text({"avx2": {"gemm_f32": 1}, "generic": {"pack": 2}}, "generic") == (
        "generic: pack; avx2: gemm_f32")


def test_a_malformed_test_report_file_fails_the_run(tmp_path):
    directory = run_dir(tmp_path, "run", {"junit.xml": JUNIT.format(tests=1, failures=0, errors=0, skipped=0),
                                          "property-cases-3.json": '{"valid": 1}'})
    assert judge(arm_record(directory, exit_code=0)).result == (
        "FAILED: unreadable test report file property-cases-3.json: KeyError: 'invalid'")


def outcome_run(tmp_path, name, cases, stage="full", cpu="a64fx"):
    directory = run_dir(tmp_path, name, {"junit.xml": junit_of(cases)})
    return arm_record(directory, exit_code=0, cpu=cpu, stage=stage)


PASS_A = '<testcase classname="tests.t" name="test_a" file="tests/t.py"/>'
SKIP_A = '<testcase classname="tests.t" name="test_a" file="tests/t.py"><skipped message="r" type="pytest.skip"/></testcase>'
PASS_B = '<testcase classname="tests.t" name="test_b" file="tests/t.py"/>'


def test_canary_runs_are_compared_with_canary_runs_and_full_with_full(tmp_path):
    records = [outcome_run(tmp_path, "c1", PASS_A, "canary"), outcome_run(tmp_path, "c2", PASS_A, "canary", "max"),
               outcome_run(tmp_path, "f1", PASS_A + PASS_B), outcome_run(tmp_path, "f2", PASS_A + PASS_B, cpu="max")]
    steps = console.StepLog()
    assert write_summary(records, steps, tmp_path / "reports")
    text = (tmp_path / "reports" / "summary.md").read_text()
    assert "### Canary stage" in text and "### Full suites" in text
    assert "- canary: 1 test IDs over 2 runs in 1 environment: the same" in text
    assert "- full: 2 test IDs over 2 runs in 1 environment: the same" in text
    drifted = records[:3] + [outcome_run(tmp_path, "f3", SKIP_A + PASS_B, cpu="max")]
    assert not write_summary(drifted, steps, tmp_path / "reports")
    data = json.loads((tmp_path / "reports" / "summary.json").read_text())
    assert data["same_tests"]["full"]["drifts"] == [
        "tests/t.py::test_a: passed on aarch64 (cross) CPU a64fx, ISA neon, skipped on aarch64 (cross) CPU max, "
        "ISA neon: r"]
    assert data["same_tests"]["canary"]["ok"]


ONCE_C = ('<testcase classname="tests.t" name="test_c" file="tests/t.py">'
          '<properties><property name="markers" value="level_independent"/></properties></testcase>')


def test_each_run_shows_its_parts_and_a_once_only_test_missing_on_the_first_run_fails_it(tmp_path):
    records = [outcome_run(tmp_path, "f1", PASS_A + ONCE_C), outcome_run(tmp_path, "f2", PASS_A, cpu="max")]
    assert write_summary(records, console.StepLog(), tmp_path / "reports")
    text = (tmp_path / "reports" / "summary.md").read_text()
    assert "| a64fx | neon / neon | 2 | 0 | 0 | 1 / 0 / 1 |" in text and "| max | neon / neon | 1 | 0 | 0 | 1 / 0 / 0 |" in text
    data = json.loads((tmp_path / "reports" / "summary.json").read_text())
    assert data["runs"][0]["tests_by_part"] == {"every run": 1, "once per CPU model": 0, "once per architecture": 1}
    # the part ran on the second model instead of the first: both runs fail, each naming it
    swapped = [outcome_run(tmp_path, "f3", PASS_A), outcome_run(tmp_path, "f4", PASS_A + ONCE_C, cpu="max")]
    assert not write_summary(swapped, console.StepLog(), tmp_path / "reports")
    runs = json.loads((tmp_path / "reports" / "summary.json").read_text())["runs"]
    assert [run["result"] for run in runs] == ["FAILED: 1 tests did not run as on the other runs"] * 2
    assert "- `tests/t.py::test_c (once per architecture): ran on aarch64 (cross) CPU max" in (
        tmp_path / "reports" / "summary.md").read_text()


def test_an_allowed_difference_is_shown_with_its_reason(tmp_path):
    from harness.plan.verdict import Allowed

    records = [outcome_run(tmp_path, "f1", PASS_A), outcome_run(tmp_path, "f2", SKIP_A, cpu="max")]
    allowed = [Allowed("tests/t.py::test_a", "aarch64", "skipped", "needs SME", ("max",))]
    assert write_summary(records, console.StepLog(), tmp_path / "reports", allowed)
    text = (tmp_path / "reports" / "summary.md").read_text()
    assert "| `tests/t.py::test_a` | aarch64 (max) | skipped | needs SME | 1 |" in text


def test_two_workers_crashing_at_once_interleave_their_dumps_and_both_tests_are_named(tmp_path):
    # as two pytest-xdist workers under QEMU wrote it
    log = ("Fatal Python error: Fatal Python error: Illegal instruction\n\nIllegal instructionThread 0x\n\n"
           'Current thread 0x (most recent call first):\n  File , line 411 in _perform_spawn\n"/w/tests/x.py", line 13')
    second = FAILING.replace("test_bad[int8]", "test_crash2").replace(
        '<failure message="AssertionError: Tensor-likes are not close!&#10;Mismatched elements: 3">x</failure>',
        "<error message=\"worker 'gw0' crashed while running 'tests/kernels/test_a.py::test_crash2'\">x</error>")
    directory = run_dir(tmp_path, "run", {"junit.xml": second, "pytest.log": log})
    assert judge(arm_record(directory)).result == (
        "FAILED: crashed: SIGILL (Illegal instruction) in tests/kernels/test_a.py::test_crash2, "
        "tests/kernels/test_a.py::test_crash on CPU a64fx, 2 failed")


# The tolerances a run's suite compared with (moe_xarch.testing.applied_tolerances), as it writes them.
SPEC_BF16 = {"rtol": 0.02, "atol": 0.02, "relative_to_output_scale": False}
SPEC_INT8 = {"rtol": 0.03, "atol": 0.03, "relative_to_output_scale": True}


def tolerance_run(tmp_path, name, tolerances, cpu="a64fx", arch="aarch64", isa="neon"):
    """A passed run whose one process recorded `tolerances` (None: no file)."""
    files = {"junit.xml": junit_of(PASS_A)}
    if tolerances is not None:
        files["tolerances-7.json"] = json.dumps(tolerances)
    return RunRecord(arch, "qemu" if arch == "aarch64" else "native", cpu, isa, isa, 0, 60.0,
                     str(run_dir(tmp_path, name, files)), builder="cross" if arch == "aarch64" else "cibuildwheel")


def test_a_comparison_loosened_on_one_architecture_fails_its_runs_naming_the_method_and_dtype(tmp_path):
    """assert_matches_reference multiplying the bf16 tolerance by 20 on aarch64: every
    aarch64 run records it, and each fails, naming itself, the (method, dtype) and the
    run whose tolerance it differs from."""
    same = {"UNQUANT/bfloat16": SPEC_BF16, "INT8_W8A8/bfloat16": SPEC_INT8}
    loose = {**same, "UNQUANT/bfloat16": {**SPEC_BF16, "rtol": 0.4, "atol": 0.4}}
    x86 = [tolerance_run(tmp_path, f"x{level}", same, "host", "x86_64", level) for level in ("generic", "avx2")]
    arm = [tolerance_run(tmp_path, f"a{cpu}", same, cpu) for cpu in ("a64fx", "max")]
    reports = tmp_path / "reports"
    assert write_summary(x86 + arm, console.StepLog(), reports)
    assert "- the tolerance of each method and dtype, over 4 runs: the same" in (reports / "summary.md").read_text()

    arm = [tolerance_run(tmp_path, f"l{cpu}", loose, cpu) for cpu in ("a64fx", "max")]
    assert not write_summary(x86 + arm, console.StepLog(), reports)
    data = json.loads((reports / "summary.json").read_text())
    assert [run["result"] for run in data["runs"]] == ["passed"] * 2 + [
        "FAILED: 1 comparisons not as on the other runs"] * 2
    text = (reports / "summary.md").read_text()
    assert "- the tolerance of each method and dtype, over 4 runs: 2 not the same (below)" in text
    for cpu in ("a64fx", "max"):
        assert (f"- full aarch64 (cross) CPU {cpu}, ISA neon: FAILED: 1 comparisons not as on the other runs\n"
                f"  - `tolerance of UNQUANT/bfloat16: atol 0.4, relative_to_output_scale False, rtol 0.4 on full "
                f"aarch64 (cross) CPU {cpu}, ISA neon, atol 0.02, relative_to_output_scale False, rtol 0.02 on full "
                "x86_64 (cibuildwheel) CPU host, ISA generic`") in text, text


def test_a_passed_run_that_recorded_no_tolerance_fails_where_the_others_did(tmp_path):
    same = {"UNQUANT/bfloat16": SPEC_BF16}
    records = [tolerance_run(tmp_path, "a", same), tolerance_run(tmp_path, "b", None, "max")]
    assert not write_summary(records, console.StepLog(), tmp_path / "reports")
    runs = json.loads((tmp_path / "reports" / "summary.json").read_text())["runs"]
    assert runs[1]["result"] == "FAILED: 1 comparisons not as on the other runs"
    assert runs[1]["tolerance_drifts"] == [
        "tolerances: none recorded on full aarch64 (cross) CPU max, ISA neon, 1 on full aarch64 (cross) CPU a64fx, ISA neon"]


def test_two_processes_of_a_run_comparing_one_method_and_dtype_two_ways_fail_it(tmp_path):
    directory = run_dir(tmp_path, "run", {
        "junit.xml": junit_of(PASS_A), "tolerances-1.json": json.dumps({"UNQUANT/bfloat16": SPEC_BF16}),
        "tolerances-2.json": json.dumps({"UNQUANT/bfloat16": {**SPEC_BF16, "rtol": 0.4}})})
    assert judge(arm_record(directory, exit_code=0)).result.startswith(
        "FAILED: unreadable test report file tolerances-2.json: UNQUANT/bfloat16 compared with")


def test_each_environment_is_a_row_of_its_own_with_its_wheel(tmp_path):
    """One wheel (one sha256) under two torches, and the sdist's wheel under Debian 13."""
    runs = []
    for name, environment, builder, digest in [
            ("a", "Debian 12 · GCC 12 · Python 3.11 · torch 2.13.0", "cibuildwheel", "1" * 64),
            ("b", "Debian 12 · GCC 12 · Python 3.11 · torch 2.14.1", "cibuildwheel", "1" * 64),
            ("c", "Debian 13 · GCC 14 · Python 3.13 · torch 2.14.1", "sdist", "2" * 64)]:
        for isa in ("generic", "avx2"):
            directory = run_dir(tmp_path, f"{name}-{isa}", {"junit.xml": junit_of(PASS_A)})
            runs.append(RunRecord("x86_64", "native", "host", isa, isa, 0, 30.0, str(directory), builder=builder,
                                  environment=environment, wheel_sha256=digest))
    assert write_summary(runs, console.StepLog(), tmp_path / "reports")
    text = (tmp_path / "reports" / "summary.md").read_text()
    assert ("| x86_64 · Debian 12 · GCC 12 · Python 3.11 · torch 2.14.1 | cibuildwheel | 111111111111 | 2 "
            "| generic, avx2 | 2 | 0 | 0 | 01:00 | passed |") in text
    assert "| x86_64 · Debian 13 · GCC 14 · Python 3.13 · torch 2.14.1 | sdist | 222222222222 | 2 |" in text
    assert "| x86_64 · Debian 13 · GCC 14 · Python 3.13 · torch 2.14.1 | sdist | native | host | avx2 / avx2 |" in text
    assert "- full: 1 test IDs over 6 runs in 3 environments: the same" in text
