"""What the nox sessions do: build, test, matrix. Each flow prepares the host,
removes what a killed run left behind, times every step and ends with a summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import traceback
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness import build as builds
from harness import console, containers, host, images, publish, suite
from harness.summary import write_summary
from harness.targets import Target, load_targets, select

REPO = Path(__file__).resolve().parent.parent
WHEELHOUSE = REPO / "wheelhouse"
REPORTS = REPO / "reports"
WORK = REPO / "build" / "harness"  # image contexts, build stamps


@dataclasses.dataclass(frozen=True)
class Options:
    arches: list[str]
    force: bool  # rebuild the wheel even when its inputs are unchanged
    pytest_args: list[str]


def parse_posargs(posargs: Sequence[str]) -> Options:
    """`--arch A` (repeatable) and `--force`; anything else goes to pytest."""
    parser = argparse.ArgumentParser(prog="nox -s <session> --", add_help=False)
    parser.add_argument("--arch", action="append", default=[])
    parser.add_argument("--force", action="store_true")
    known, rest = parser.parse_known_args(list(posargs))
    return Options(known.arch, known.force, rest)


def _targets(arches: list[str]) -> list[Target]:
    return select(load_targets(REPO / "pyproject.toml"), arches)


def _prepare(targets: list[Target], steps: console.StepLog) -> None:
    with steps.step("host set-up"):
        host.ensure_host(
            host.Needs(
                debootstrap=any(not t.base_image for t in targets),
                emulated_arches=tuple(t.arch for t in targets if t.runner == "qemu"),
            )
        )
        containers.remove_stale()


def _build(target: Target, cibuildwheel: list[str], force: bool, steps: console.StepLog) -> Path:
    specs = images.ensure_images(target, WORK / "images", steps)
    return builds.build_wheel(
        target, specs, repo=REPO, wheelhouse=WHEELHOUSE, stamps=WORK / "stamps",
        cibuildwheel=cibuildwheel, steps=steps, force=force,
    )


def _test(target: Target, wheel: Path, pytest_args: list[str], steps: console.StepLog) -> list[suite.RunRecord]:
    specs = images.ensure_images(target, WORK / "images", steps, upto="test")
    records = suite.run_suite(
        target, test_image=specs["test"].tag, wheel=wheel, repo=REPO, reports=REPORTS,
        steps=steps, pytest_args=pytest_args,
    )
    publish.record_tested(target, wheel, records, REPORTS)  # what publish may upload
    return records


def build(posargs: Sequence[str], cibuildwheel: list[str]) -> None:
    options = parse_posargs(posargs)
    targets = _targets(options.arches)
    steps = console.StepLog()
    with containers.terminate_as_exit():
        _prepare(targets, steps)
        for target in targets:
            _build(target, cibuildwheel, options.force, steps)
    print("\n" + steps.table(), flush=True)


def test(arch: str, posargs: Sequence[str]) -> bool:
    """Test the wheel already in wheelhouse/ (nox -s build makes it)."""
    options = parse_posargs(posargs)
    (target,) = _targets([arch])
    steps = console.StepLog()
    with containers.terminate_as_exit():
        _prepare([target], steps)
        records = _test(target, builds.find_wheel(WHEELHOUSE, arch), options.pytest_args, steps)
    return write_summary(records, steps, REPORTS)


def matrix(posargs: Sequence[str], cibuildwheel: list[str]) -> bool:
    """Build and test every target; a target that fails does not stop the others."""
    options = parse_posargs(posargs)
    targets = _targets(options.arches)
    steps = console.StepLog()
    records: list[suite.RunRecord] = []
    with containers.terminate_as_exit(), ThreadPoolExecutor(max_workers=1) as background:
        try:
            _prepare(targets, steps)
            if len(targets) > 1:
                # An emulated target's images are made mostly by one emulated process at
                # a time (dpkg, pip): in the background they overlap the native target's
                # work. Its own turn waits for them (a lock per image) and finds them made.
                for target in targets:
                    if target.runner == "qemu":
                        background.submit(_background_images, target, steps)
            for target in targets:
                try:
                    wheel = _build(target, cibuildwheel, options.force, steps)
                    records += _test(target, wheel, options.pytest_args, steps)
                except Exception as error:  # reported in the summary, then the next target
                    traceback.print_exc()
                    why = f"{type(error).__name__}: {str(error).splitlines()[0]}"
                    records.append(suite.RunRecord.could_not_run(target, why[:200]))
            background.shutdown(wait=True)
        except BaseException:  # interrupted: stop the background work too
            console.stop_all()
            raise
    return write_summary(records, steps, REPORTS)


def _background_images(target: Target, steps: console.StepLog) -> None:
    try:
        images.ensure_images(target, WORK / "images", steps)
    except Exception:  # the target's own turn retries and reports it
        traceback.print_exc()
