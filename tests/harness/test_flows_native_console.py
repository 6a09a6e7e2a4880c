from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import flows
from harness.common import console
from harness.common.errors import HarnessError
from harness.plan.targets import SdistBuild
from harness.running import native


def test_posargs_split_between_harness_and_pytest():
    options = flows.parse_posargs(["--arch", "aarch64", "-k", "int8", "--force", "-x"])
    assert options.arches == ["aarch64"] and options.force
    assert options.pytest_args == ["-k", "int8", "-x"]
    assert flows.parse_posargs([]) == flows.Options([], False, [])
    both = flows.parse_posargs(["--builder", "cross", "--builder", "cibuildwheel"])
    assert both.builders == ["cross", "cibuildwheel"] and both.pytest_args == []


def test_builds_planned_per_target_and_builder(targets):
    arm = dataclasses.replace(targets["aarch64"], builders=("cross", "cibuildwheel"))
    x86 = targets["x86_64"]
    assert flows.builds_planned([x86, arm], [], "x86_64") == [(x86, "cibuildwheel"), (arm, "cross")]
    # A builder that only some targets list applies to those; the others keep their default.
    assert flows.builds_planned([x86, arm], ["cibuildwheel", "cross"], "x86_64") == [
        (x86, "cibuildwheel"), (arm, "cibuildwheel"), (arm, "cross")
    ]
    with pytest.raises(HarnessError, match="--builder cross: no selected target builds that way"):
        flows.builds_planned([x86], ["cross"], "x86_64")


def test_build_time_ratio_is_printed_when_an_arch_was_built_both_ways():
    steps = console.StepLog([
        console.StepTime("build aarch64 (cibuildwheel)", 1000.0, "done"),
        console.StepTime("build aarch64 (cross)", 125.0, "done"),
        console.StepTime("build x86_64 (cibuildwheel)", 80.0, "done"),
    ])
    assert flows.build_time_ratios(steps) == [
        "aarch64: cross build 02:05, cibuildwheel build 16:40: the cross build is 8.0x faster"
    ]
    steps.steps[0].outcome = "reused"  # a reused wheel took no build time: no ratio
    assert flows.build_time_ratios(steps) == []
    steps.steps.append(console.StepTime("build aarch64 (hosted)", 250.0, "done"))  # any builder's name
    assert flows.build_time_ratios(steps) == [
        "aarch64: cross build 02:05, hosted build 04:10: the cross build is 2.0x faster"
    ]


def test_native_suite_runs_once_per_level_forcing_and_expecting_it():
    runs = native.suite_runs(["generic", "avx2"], ["-x"])
    assert runs == [
        ({"MOE_XARCH_ISA": "generic", "MOE_XARCH_EXPECT_ISA": "generic",
          "MOE_XARCH_TEST_STRENGTH": "full"},
         ["python", "-m", "pytest", "tests/kernels", "-p", "no:cacheprovider", "-x"]),
        ({"MOE_XARCH_ISA": "avx2", "MOE_XARCH_EXPECT_ISA": "avx2",
          "MOE_XARCH_TEST_STRENGTH": "full"},
         ["python", "-m", "pytest", "tests/kernels", "-p", "no:cacheprovider", "-x"]),
    ]


def test_run_kernel_suite_asks_the_library_for_its_levels():
    class FakeSession:
        def __init__(self):
            self.calls = []

        def run(self, *args, **kwargs):
            self.calls.append((args, kwargs))
            return "generic avx2\n" if "-c" in args else None

    session = FakeSession()
    native.run_kernel_suite(session, ["-q"])
    assert [call[1].get("env", {}).get("MOE_XARCH_ISA") for call in session.calls[1:]] == ["generic", "avx2"]


def test_run_streamed_prefixes_lines_and_returns_the_exit_code(capsys):
    code = console.run_streamed(
        [sys.executable, "-c", "print('hello'); raise SystemExit(3)"], "step", check=False
    )
    assert code == 3 and "[step 00:00] hello" in capsys.readouterr().out
    with pytest.raises(console.CommandFailed, match="exited with 3"):
        console.run_streamed([sys.executable, "-c", "raise SystemExit(3)"], "step")


def test_run_streamed_kills_a_silent_hung_process():
    code = console.run_streamed(
        [sys.executable, "-c", "import time; time.sleep(60)"], "hang", check=False, timeout=0.5
    )
    assert code == 124


def test_a_timeout_kills_children_in_process_groups_of_their_own(tmp_path):
    # As ninja does with each compiler: the child leaves its parent's process group.
    pid_file = tmp_path / "child.pid"
    child = f"import os, time; os.setpgid(0, 0); open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    parent = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}], "
              "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); time.sleep(60)")
    code = console.run_streamed([sys.executable, "-c", parent], "build", check=False, timeout=2)
    assert code == 124
    pid = int(pid_file.read_text())
    for _ in range(50):  # SIGKILL is delivered asynchronously; the zombie is reaped by init
        status = Path(f"/proc/{pid}/status")
        if not status.exists() or "State:\tZ" in status.read_text():
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the child {pid} in its own process group survived")


def test_step_log_times_and_marks_outcomes():
    steps = console.StepLog()
    with steps.step("images") as step:
        step.outcome = "reused"
    with pytest.raises(RuntimeError), steps.step("build"):
        raise RuntimeError("boom")
    assert [(s.name, s.outcome) for s in steps.steps] == [("images", "reused"), ("build", "failed")]
    assert "| total (wall time) | |" in steps.table()


def test_exclusive_keeps_a_second_process_out(tmp_path):
    lock = tmp_path / "image.lock"
    probe = (
        "import fcntl, sys\n"
        f"f = open({str(lock)!r}, 'w')\n"
        "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept BlockingIOError:\n    sys.exit(1)\n"
    )
    with console.exclusive(lock):
        assert subprocess.run([sys.executable, "-c", probe]).returncode == 1
    assert subprocess.run([sys.executable, "-c", probe]).returncode == 0


def fake_matrix(monkeypatch, targets, build, test, summarized):
    """The matrix flow on these targets with build and test in place of the real steps, on an
    x86_64 host with every image made; the summary's records go to summarized."""
    monkeypatch.setattr(flows, "_targets", lambda arches: targets)
    monkeypatch.setattr(flows, "_allowed", lambda: ())
    monkeypatch.setattr(flows.host, "arch", lambda: "x86_64")
    monkeypatch.setattr(flows, "_prepare", lambda targets, steps: None)
    monkeypatch.setattr(flows, "_background_images", lambda target, steps: None)
    monkeypatch.setattr(flows, "_images_made", lambda target: True)
    monkeypatch.setattr(flows, "_build", build)
    monkeypatch.setattr(flows, "_test", test)
    monkeypatch.setattr(flows, "write_summary", lambda records, steps, reports, allowed: summarized.extend(records))
    monkeypatch.setattr(flows, "_write_levels", lambda: None)


def test_matrix_builds_every_wheel_then_runs_the_emulated_canaries_then_the_full_suites(
        targets, monkeypatch, tmp_path, capsys):
    calls, summarized = [], []
    x86, arm = targets["x86_64"], dataclasses.replace(targets["aarch64"], builders=("cross", "cibuildwheel"))

    def build(target, builder, tools, force, steps):
        calls.append(("build", target.arch))
        if builder == "cibuildwheel" and target.arch == "aarch64":
            raise console.CommandFailed("build aarch64", ["cibuildwheel"], 1, "csrc/x.cpp:3:1: error: boom")
        return tmp_path / f"{target.arch}-{builder}.whl"

    def test(target, builder, wheel, pytest_args, steps, stage="full", on_run=None):
        calls.append((stage, target.arch))
        directory = tmp_path / stage / target.arch
        directory.mkdir(parents=True)
        (directory / "junit.xml").write_text(
            '<testsuite tests="1" failures="1" errors="0" skipped="0"><testcase classname="tests.t" name="test_a"'
            ' file="tests/t.py"><failure message="AssertionError: wrong number">x</failure></testcase></testsuite>')
        record = flows.suite.RunRecord(target.arch, target.runner, "max", "i8mm", "i8mm", 1, 1.0, str(directory),
                                       builder=builder, stage=stage)
        if on_run:
            on_run(record)
            calls.append(("reported", target.arch))
        return [record]

    fake_matrix(monkeypatch, [x86, arm], build, test, summarized)
    flows.matrix(["--builder", "cross", "--builder", "cibuildwheel"], tools=None)
    assert calls == [("build", "x86_64"), ("build", "aarch64"), ("build", "aarch64"),
                     ("canary", "aarch64"), ("reported", "aarch64"), ("full", "x86_64"), ("full", "aarch64")]
    assert [(r.target, r.builder, r.stage) for r in summarized] == [
        ("aarch64", "cibuildwheel", "full"), ("aarch64", "cross", "canary"),
        ("x86_64", "cibuildwheel", "full"), ("aarch64", "cross", "full")]
    assert summarized[0].failure == ("CommandFailed: build aarch64: cibuildwheel exited with 1; "
                                     "first error: csrc/x.cpp:3:1: error: boom")
    out = capsys.readouterr().out
    # a canary run's failure is printed as soon as the run ends, once, then its target's stage verdict
    assert ("- canary aarch64 (cross) CPU max, ISA i8mm: FAILED: 1 failed\n"
            "  - `tests/t.py::test_a` (failed): AssertionError: wrong number\n"
            "==> canary stage of aarch64 (cross): FAILED\n") in out
    assert out.count("AssertionError: wrong number") == 1  # the aarch64 canary run; x86_64 has none


def test_an_emulated_target_whose_images_are_being_made_comes_in_a_later_batch(targets):
    x86, arm = targets["x86_64"], targets["aarch64"]
    planned = [(x86, "cibuildwheel"), (arm, "cross"), (arm, "cibuildwheel")]
    assert flows.batches(planned, lambda target: True) == [planned]
    assert flows.batches(planned, lambda target: False) == [planned[:1], planned[1:]]
    assert flows.batches(planned[1:], lambda target: False) == [planned[1:]]


def test_a_failed_command_names_its_first_compiler_error(tmp_path):
    script = ("echo 'building'; echo '/tmp/stage-x/csrc/arch/arm/gemm_neon.cpp:12:5: error: use of undeclared x';"
              " echo 'gemm_neon.cpp:20:1: error: second'; echo 'error: subprocess-exited-with-error'; exit 2")
    with pytest.raises(console.CommandFailed) as failed:
        console.run_streamed(["bash", "-c", script], "build aarch64 (cross)")
    assert failed.value.first_error == "csrc/arch/arm/gemm_neon.cpp:12:5: error: use of undeclared x"
    assert str(failed.value) == ("build aarch64 (cross): bash exited with 2; "
                                 "first error: csrc/arch/arm/gemm_neon.cpp:12:5: error: use of undeclared x")
    assert console.first_error_line("CMake Error at CMakeLists.txt:3 (project):") == (
        "CMake Error at CMakeLists.txt:3 (project):")
    assert console.first_error_line("-- Performing Test HAVE_ERROR_H - Success") == ""


def test_the_canary_report_prints_a_run_that_ran_other_tests_when_its_target_ends(tmp_path, capsys):
    records = []
    for cpu, outcome in (("neoverse-n1", ""), ("a64fx", '<skipped message="not on this CPU"/>')):
        directory = tmp_path / cpu
        directory.mkdir()
        (directory / "junit.xml").write_text(
            f'<testsuite tests="1" failures="0" errors="0" skipped="{int(bool(outcome))}">'
            f'<testcase classname="tests.t" name="test_a" file="tests/t.py">{outcome}</testcase></testsuite>')
        records.append(flows.suite.RunRecord("aarch64", "qemu", cpu, "neon", "neon", 0, 1.0, str(directory),
                                             builder="cross", stage="canary"))
    report = flows.CanaryReport(())
    for record in records:
        report.run_ended(record)
    assert capsys.readouterr().out == ""  # each run alone passed
    report.target_ended(records)
    out = capsys.readouterr().out
    assert out.startswith("==> canary stage of aarch64 (cross): FAILED\n- canary aarch64 (cross) CPU a64fx")
    assert "tests/t.py::test_a" in out and "not on this CPU" in out


def with_legs(x86, *torches):
    build = SdistBuild("trixie", ("3.13",), "torch==2.14.1")
    return dataclasses.replace(x86, test_torches=(x86.torch, *torches), sdist_builds=(build,))


def test_an_sdist_build_leg_is_planned_after_the_rows_and_built_last(targets):
    x86, arm = with_legs(targets["x86_64"]), targets["aarch64"]
    (trixie,) = x86.sdist_legs()
    planned = flows.builds_planned([x86, arm], [], "x86_64")
    assert planned == [(x86, "cibuildwheel"), (arm, "cibuildwheel"), (trixie, "sdist")]
    assert flows.batches(planned, lambda target: True) == [planned[:2], planned[2:]]
    assert flows.batches(planned, lambda target: False) == [planned[:1], planned[1:2], planned[2:]]
    assert flows.builds_planned([x86, arm], ["sdist"], "x86_64")[-1] == (trixie, "sdist")
    assert (trixie, "sdist") not in flows.builds_planned([x86, arm], ["cibuildwheel"], "x86_64")
    assert flows.builds_planned([x86], [], "aarch64") == [(x86, "cibuildwheel")]  # its toolchain is native only


def test_the_matrix_tests_one_wheel_under_every_torch_and_the_sdist_leg_its_own(targets, monkeypatch, tmp_path):
    x86 = with_legs(targets["x86_64"], "torch==2.14.1")
    tested, summarized = [], []

    def build(target, builder, tools, force, steps):
        return tmp_path / f"{target.name}.whl"

    def test(target, builder, wheel, pytest_args, steps, stage="full", on_run=None):
        tested.append((target.name, target.torch, builder, wheel.name))
        if target.torch == "torch==2.14.1" and not target.from_sdist:
            raise HarnessError("no image")
        return [flows.suite.RunRecord(target.arch, target.runner, "host", "generic", "generic", 0, 1.0, "",
                                      builder=builder, environment=target.environment)]

    fake_matrix(monkeypatch, [x86], build, test, summarized)
    flows.matrix([], tools=None)
    assert tested == [("x86_64", "torch==2.13.0", "cibuildwheel", "x86_64.whl"),
                      ("x86_64-torch2.14.1", "torch==2.14.1", "cibuildwheel", "x86_64.whl"),  # the same wheel
                      ("x86_64-trixie-sdist", "torch==2.14.1", "sdist", "x86_64-trixie-sdist.whl")]
    # a leg that could not run is a row of its own, and the others still ran
    assert [(r.environment, r.failure) for r in summarized] == [
        ("Debian 12 · GCC 12 · Python 3.11 · torch 2.13.0", ""),
        ("Debian 12 · GCC 12 · Python 3.11 · torch 2.14.1", "HarnessError: no image"),
        ("Debian 13 · GCC 14 · Python 3.13 · torch 2.14.1", "")]
