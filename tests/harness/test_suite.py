from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.common import console
from harness.plan import runners
from harness.running import suite

ANY_CPUS = str(os.cpu_count() or 1)


def test_an_emulated_target_runs_once_per_cpu_model(arm):
    runs = runners.planned_runs(arm)
    assert [(r.cpu, r.isa) for r in runs] == [("cortex-a72", "neon"), ("neoverse-n1", "dotprod"), ("max", "i8mm")]
    assert dict(runs[2].env) == {"QEMU_CPU": "max", "MOE_XARCH_EXPECT_ISA": "i8mm"}
    assert runs[0].name == "aarch64-cortex-a72-neon"


def test_a_native_target_runs_the_table_levels_the_cpu_supports(x86):
    runs = runners.planned_runs(x86, ["generic", "avx2", "avx512", "avx512_bf16", "amx"])
    assert [r.isa for r in runs] == ["generic", "avx2", "avx512", "avx512_bf16"]
    assert dict(runs[1].env) == {"MOE_XARCH_ISA": "avx2", "MOE_XARCH_EXPECT_ISA": "avx2"}
    assert [r.isa for r in runners.planned_runs(x86, ["generic", "avx2"])] == ["generic", "avx2"]


def test_docker_run_mounts_read_only_and_has_no_network(arm):
    run = runners.planned_runs(arm)[0]
    command = suite.docker_run_command(
        run, image="moe-xarch-test:aarch64-x", wheel=Path("/repo/wheelhouse/w.whl"),
        repo=Path("/repo"), report_dir=Path("/repo/reports/r"), name="n", pytest_args=["-n", "2"],
    )
    assert command[:4] == ["docker", "run", "--rm", "--name=n"]
    assert "--platform=linux/arm64" in command and "--network=none" in command
    assert "--env=QEMU_CPU=cortex-a72" in command and "--env=MOE_XARCH_EXPECT_ISA=neon" in command
    assert "--volume=/repo/tests:/src/tests:ro" in command
    assert "--volume=/repo/wheelhouse/w.whl:/wheelhouse/w.whl:ro" in command
    assert "--volume=/repo/reports/r:/report" in command
    image_at = command.index("moe-xarch-test:aarch64-x")
    assert command[image_at + 1:] == [
        "bash", "/harness/run-kernel-suite.sh", "/wheelhouse/w.whl", "/report", "-n", "2"
    ]


def _run_suite_commands(target, tmp_path, monkeypatch, supported=None):
    """Each stage's docker commands (in plan order, however the runs interleave) and records, nothing started."""
    commands = {}
    monkeypatch.setattr(suite.console, "run_streamed", lambda command, label, **kwargs: commands.update({label: command}) or 0)
    monkeypatch.setattr(suite.containers, "remove", lambda name: None)
    monkeypatch.setattr(suite, "query_supported_isas", lambda *args: supported)
    kwargs = {"test_image": "i", "wheel": Path("/w.whl"), "repo": Path("/repo"), "reports": tmp_path,
              "steps": console.StepLog(), "pytest_args": ["-k", "int8"]}
    canary = suite.run_suite(target, "cross", **kwargs, stage="canary")
    full = suite.run_suite(target, "cross", **kwargs)
    order = [f"{verb} {run.name}" for verb in ("canary", "test") for run in runners.planned_runs(target, supported)]
    return [commands[label] for label in order], canary, full


def _pytest_args(command):
    return command[command.index("/report") + 1:]


def test_the_canary_stage_runs_its_selection_into_reports_of_its_own(arm, tmp_path, monkeypatch):
    commands, canary, full = _run_suite_commands(arm, tmp_path, monkeypatch)
    # every CPU model runs its own per-CPU tests; the first alone the per-architecture ones;
    # the models side by side, one xdist worker each
    assert [_pytest_args(command) for command in commands[:3]] == [
        ["-n", "1", "-m", "canary", "-k", "int8"],
        ["-n", "1", "-m", "canary and not level_independent", "-k", "int8"],
        ["-n", "1", "-m", "canary and not level_independent", "-k", "int8"],
    ]
    assert [_pytest_args(command) for command in commands[3:]] == [
        ["-n", "1", "-k", "int8"],
        ["-n", "1", "-m", "not level_independent", "-k", "int8"],
        ["-n", "1", "-m", "not level_independent", "-k", "int8"],
    ]
    assert [r.stage for r in canary] == ["canary"] * 3 and [r.stage for r in full] == ["full"] * 3
    assert [r.cpu for r in full] == ["cortex-a72", "neoverse-n1", "max"]  # in plan order, whichever ends first
    assert canary[0].report_dir == str(tmp_path / "canary" / "aarch64" / "cross" / "aarch64-cortex-a72-neon")
    assert full[0].report_dir == str(tmp_path / "aarch64" / "cross" / "aarch64-cortex-a72-neon")
    assert all(Path(r.report_dir, "run.json").exists() for r in canary + full)  # the full stage kept the canary's


def test_a_native_target_runs_its_once_only_parts_on_its_lowest_level(x86, tmp_path, monkeypatch):
    commands, _, full = _run_suite_commands(x86, tmp_path, monkeypatch, ["generic", "avx2", "avx512"])
    assert [(r.isa, r.exit_code) for r in full] == [("avx512_bf16", None), ("generic", 0), ("avx2", 0), ("avx512", 0)]
    # one CPU: the tests that force every level themselves, like the level-independent ones, run on generic only
    assert [_pytest_args(command) for command in commands[3:]] == [
        ["-n", ANY_CPUS, "-k", "int8"],
        ["-n", ANY_CPUS, "-m", "not forces_levels and not level_independent", "-k", "int8"],
        ["-n", ANY_CPUS, "-m", "not forces_levels and not level_independent", "-k", "int8"],
    ]


def test_the_host_tests_use_the_test_images_pins(repo_root):
    requirements = suite.host_test_requirements()
    assert {"numpy", "pytest", "pytest-xdist"} <= {line.split("==")[0] for line in requirements}
    assert "pip" not in {line.split("==")[0] for line in requirements}
    assert all(line in (repo_root / "docker" / "requirements-test.txt").read_text() for line in requirements)


def test_emulated_runs_run_side_by_side_and_an_interrupt_stops_them_all(arm, tmp_path, monkeypatch):
    import threading

    started, stopped = threading.Barrier(3, timeout=10), []

    def run_streamed(command, label, **kwargs):
        started.wait()  # every model's container is running at once
        if "max" in label:
            raise KeyboardInterrupt
        return 0

    monkeypatch.setattr(suite.console, "run_streamed", run_streamed)
    monkeypatch.setattr(suite.console, "stop_all", lambda: stopped.append(True))
    monkeypatch.setattr(suite.containers, "remove", lambda name: None)
    with pytest.raises(KeyboardInterrupt):
        suite.run_suite(arm, "cross", test_image="i", wheel=Path("/w.whl"), repo=Path("/repo"), reports=tmp_path,
                        steps=console.StepLog(), pytest_args=[])
    assert stopped == [True]


def test_the_pins_hold_every_package_the_kernel_suite_imports(repo_root):
    """The host sessions that run tests/kernels (coverage, drift) install these pins:
    a package the suite imports and they lack fails its collection there only."""
    import ast
    import sys

    pinned = {line.split("==")[0] for line in suite.host_test_requirements()}
    ours = {"torch", "moe_xarch", *(path.stem for path in (repo_root / "tests" / "kernels").glob("*.py"))}
    imported = set()
    for path in (repo_root / "tests" / "kernels").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
    third_party = imported - ours - set(sys.stdlib_module_names) - {"__future__"}
    assert third_party and third_party <= pinned, third_party - pinned
