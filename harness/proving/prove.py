"""A test record from any Linux machine: the kernel suite at every level its CPU has.

    python -m harness.proving.prove --wheel wheelhouse/moe_xarch-...whl --out DIR [--levels generic,avx2]
    python -m harness.proving.prove --sdist wheelhouse/moe_xarch-....tar.gz --out DIR

Needs no Docker and no network: this Python's torch, pytest, pytest-xdist and
hypothesis, a checkout of this repository (the suite) and the wheel. The wheel goes
into a venv in DIR that sees this Python's packages (pip --no-deps, so the torch
there stays), or is built there from the sdist against that torch (then the record
proves that wheel's bytes, not another build's). Each level runs as the test
sessions run it (harness/running/suite.py: the same plan, the same script), natively;
DIR gets each run's reports (JUnit, pytest.log) under runs/, the summary
(summary.md, .json) and the record, which `nox -s records -- add` takes.
`--levels` limits the run to some of the levels the CPU has.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.building.build import wheel_matches
from harness.common import console
from harness.common.errors import HarnessError
from harness.common.paths import DOCKER, PYPROJECT, REPO
from harness.common.project import PACKAGE
from harness.plan.runners import NATIVE, runner_for, selections
from harness.plan.targets import Target, load_targets
from harness.plan.verdict import load_allowed
from harness.proving.records import ENVIRONMENT, make_record, record_name, write_json_atomically
from harness.proving.summary import write_summary
from harness.running.suite import RunRecord, record_run
from harness.setup import host

NEEDED = ("torch", "pytest", "xdist", "hypothesis")
PRODUCER = "prove"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m harness.proving.prove", description=__doc__.split("\n")[0])
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--wheel", type=Path, help="the exact wheel to prove")
    given.add_argument("--sdist", type=Path, help="build a wheel from this sdist against this Python's torch")
    parser.add_argument("--out", type=Path, required=True, help="where the venv, reports, summary and record go")
    parser.add_argument("--levels", default="", help="comma-separated: only these of the CPU's levels")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="pytest-xdist workers per run")
    return parser.parse_args(list(argv))


def missing_modules() -> list[str]:
    return [name for name in NEEDED if importlib.util.find_spec(name) is None]


def make_venv(out: Path) -> Path:
    """A venv for the wheel alone that sees this Python's packages (its torch) after
    its own; `venv --system-site-packages` would skip them when this Python is a venv."""
    venv = out / "venv"
    shutil.rmtree(venv, ignore_errors=True)
    # without pip: this Python's pip, seen through the .pth, installs into it
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (own,) = venv.glob("lib/python*/site-packages")
    (own / "_outer.pth").write_text("".join(f"{path}\n" for path in site.getsitepackages()))
    return venv / "bin"


def build_from_sdist(python: Path, sdist: Path, out: Path) -> Path:
    built = out / "built"
    shutil.rmtree(built, ignore_errors=True)
    subprocess.run([str(python), "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "--wheel-dir", str(built), str(sdist)], check=True)
    (wheel,) = built.glob("*.whl")
    return wheel


def describe(python: Path, wheel: Path, out: Path) -> dict[str, Any]:
    """The installed library's own account: its levels, those this CPU runs, the environment."""
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                    "--force-reinstall", str(wheel)], check=True)
    path = out / ENVIRONMENT
    subprocess.run([str(python), str(DOCKER / "environment.py"), PACKAGE, str(path)], check=True)
    return json.loads(path.read_text())


def levels_to_run(ladder: Sequence[str], supported: Sequence[str], asked: str) -> list[str]:
    """The levels this CPU runs, or those of them --levels names."""
    if not asked:
        return [level for level in ladder if level in supported]
    names = [name.strip() for name in asked.split(",") if name.strip()]
    for name in names:
        if name not in ladder:
            raise HarnessError(f"--levels {name}: the library has no such level; it has {', '.join(ladder)}")
        if name not in supported:
            raise HarnessError(f"--levels {name}: this CPU cannot run it; it runs {', '.join(supported)}")
    return [level for level in ladder if level in names]


def native_target(target: Target, levels: Sequence[str]) -> Target:
    """The target as this machine runs it: natively, one run per level."""
    return dataclasses.replace(target, runner=NATIVE.name, isa_levels=tuple(levels), cpu_models=())


def checked_wheel(wheel: Path, arch: str) -> Path:
    wheel = wheel.resolve()
    if not wheel.is_file():
        raise HarnessError(f"--wheel {wheel}: no such file")
    if not wheel_matches(wheel.name, arch):
        raise HarnessError(f"--wheel {wheel.name}: not a {PACKAGE} wheel for this machine's {arch}")
    return wheel


def prove(wheel: Path | None, sdist: Path | None, out: Path, asked_levels: str, jobs: int) -> bool:
    arch = host.arch()
    targets = load_targets()
    if arch not in targets:
        raise HarnessError(f"no target in the table for this machine's architecture {arch}")
    if wheel is not None:
        wheel = checked_wheel(wheel, arch)
    elif sdist is not None and not sdist.is_file():
        raise HarnessError(f"--sdist {sdist}: no such file")
    if missing := missing_modules():
        raise HarnessError(f"this Python ({sys.executable}) lacks {', '.join(missing)}: install them beside "
                           "its torch (pip install pytest pytest-xdist hypothesis numpy)")
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    python = make_venv(out) / "python"
    if sdist is not None:  # built here, not repaired (linux_<arch>): the bytes this record proves
        wheel = build_from_sdist(python, sdist.resolve(), out)
    assert wheel is not None  # argparse requires --wheel or --sdist
    environment = describe(python, wheel, out)
    ladder, supported = environment["levels"], environment["supported"]
    levels = levels_to_run(ladder, supported, asked_levels)
    target = native_target(targets[arch], levels)
    print(f"{wheel.name} carries {', '.join(ladder)}; this CPU ({environment['cpu']}) runs "
          f"{', '.join(supported)}; testing {', '.join(levels)}", flush=True)
    runs = {run.isa: run for run in runner_for(target).runs(target, levels)}
    selected = selections(list(runs.values()), "")
    path_env = {"PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}",
                "VIRTUAL_ENV": str(python.parent.parent)}
    steps = console.StepLog()
    records = []
    for level in ladder:  # a level --levels leaves out has no record at all
        if level not in supported:
            records.append(RunRecord(arch, target.runner, "host", level, "", None, 0.0, ""))
        elif run := runs.get(level):
            report_dir = out / "runs" / run.name
            shutil.rmtree(report_dir, ignore_errors=True)
            report_dir.mkdir(parents=True)
            command = ["bash", str(DOCKER / "run-kernel-suite.sh"), str(wheel), str(report_dir), "-n", str(jobs),
                       *selected[run.name]]
            with steps.step(f"test {arch} host {level}"):
                records.append(record_run(run, "", command, report_dir, env={**path_env, **dict(run.env)}, cwd=REPO))
    ok = write_summary(records, steps, out, load_allowed(PYPROJECT, targets))
    record = make_record(wheel, arch, target.runner, "", PRODUCER, records)
    path = out / record_name(record)
    write_json_atomically(path, record, "python -m harness.proving.prove")
    print(f"record: {path}\nadd it where the wheel is published from: nox -s records -- add {path}", flush=True)
    return ok


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    try:
        return 0 if prove(args.wheel, args.sdist, args.out, args.levels, args.jobs) else 1
    except subprocess.CalledProcessError as error:
        print(f"prove: {' '.join(map(str, error.cmd))} failed (exit code {error.returncode}); its output is above",
              file=sys.stderr, flush=True)
    except HarnessError as error:
        print(f"prove: {error}", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
