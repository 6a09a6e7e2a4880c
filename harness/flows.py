"""What the nox sessions do: build, test, matrix. Each flow prepares the host,
removes what a killed run left behind, times every step and ends with a summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.building import build, builders
from harness.common import console
from harness.common.errors import HarnessError
from harness.common.paths import DOCKER, IMAGE_CONTEXTS, PYPROJECT, REPO, REPORTS, WHEEL_CACHE, WHEELHOUSE
from harness.plan import ladders, verdict
from harness.plan.runners import STAGES, runner_for
from harness.plan.targets import SDIST_BUILDER, Target, load_targets, select
from harness.proving import gate, summary
from harness.proving.records import record_tested
from harness.proving.summary import write_summary
from harness.running import suite
from harness.setup import containers, host, images
from harness.setup.tools import Tools


@dataclasses.dataclass(frozen=True)
class Options:
    arches: list[str]
    force: bool  # rebuild the wheel even when its inputs are unchanged
    pytest_args: list[str]
    builders: list[str] = dataclasses.field(default_factory=list)  # empty: each target's default


def parse_posargs(posargs: Sequence[str]) -> Options:
    """`--arch A`, `--builder B` (both repeatable) and `--force`; anything else goes to pytest."""
    parser = argparse.ArgumentParser(prog="nox -s <session> --", add_help=False)
    parser.add_argument("--arch", action="append", default=[])
    parser.add_argument("--builder", action="append", default=[])
    parser.add_argument("--force", action="store_true")
    known, rest = parser.parse_known_args(list(posargs))
    return Options(known.arch, known.force, rest, known.builder)


def _targets(arches: list[str]) -> list[Target]:
    targets = load_targets()
    builders.check_table(targets)
    ladders.check_table(targets, ladders.declared_ladders())
    return select(targets, arches)


def _allowed() -> tuple[verdict.Allowed, ...]:
    return verdict.load_allowed(PYPROJECT, load_targets())


def builds_planned(targets: list[Target], requested: list[str], host_arch: str) -> list[tuple[Target, str]]:
    """(target, builder) pairs to build, then each sdist-build leg of theirs that builds
    on this host (with no --builder, or --builder sdist); a builder no selected target
    lists is an error."""
    legs = [leg for target in targets for leg in target.sdist_legs()]
    for name in requested:
        if not any(name in target.builders for target in [*targets, *legs]):
            listed = "; ".join(f"{t.name}: {', '.join(t.builders)}" for t in [*targets, *legs])
            raise HarnessError(f"--builder {name}: no selected target builds that way ({listed})")
    sdist = builders.BUILDERS[SDIST_BUILDER]
    planned = [(target, builder.name) for target in targets
               for builder in builders.choose(target, requested, host_arch)]
    if not requested or SDIST_BUILDER in requested:
        planned += [(leg, sdist.name) for leg in legs if sdist.applies(leg, host_arch)]
    return planned


def _prepare(targets: list[Target], steps: console.StepLog) -> None:
    with steps.step("host set-up"):
        host.prepare(targets)


def _build(target: Target, builder: str, tools: Tools, force: bool, steps: console.StepLog) -> Path:
    specs = images.ensure_images(target, IMAGE_CONTEXTS, steps)
    return build.build_wheel(
        target, builders.BUILDERS[builder], specs, repo=REPO, wheelhouse=WHEELHOUSE if target.ships else None,
        cache=WHEEL_CACHE, tools=tools, steps=steps, force=force,
    )


def _test_legs(target: Target, builder: str, wheel: Path, pytest_args: list[str], steps: console.StepLog,
               stage: str = "full", on_run: Callable[[suite.RunRecord], None] | None = None) -> list[suite.RunRecord]:
    """The wheel's runs against every torch of its target (Target.test_legs): the same bytes each time."""
    records: list[suite.RunRecord] = []
    for leg in target.test_legs():
        try:
            records += _test(leg, builder, wheel, pytest_args, steps, stage, on_run)
        except Exception as error:
            records.append(_could_not(leg, builder, error, stage))
    return records


def _test(target: Target, builder: str, wheel: Path, pytest_args: list[str],
          steps: console.StepLog, stage: str = "full",
          on_run: Callable[[suite.RunRecord], None] | None = None) -> list[suite.RunRecord]:
    specs = images.ensure_images(target, IMAGE_CONTEXTS, steps, upto="test")
    with images.image_in_use(specs["test"].tag, f"nox -s {target.test_session}"):
        records = suite.run_suite(
            target, builder, test_image=specs["test"].tag, wheel=wheel, repo=REPO, reports=REPORTS,
            steps=steps, pytest_args=pytest_args, stage=stage, on_run=on_run,
        )
    if stage == "full":
        record_tested(target, builder, wheel, records, REPORTS)  # what publish may upload
    return records


def build_time_ratios(steps: console.StepLog) -> list[str]:
    """For each arch built more than one way in this run: how much faster its fastest
    build was than each other one."""
    times: dict[str, dict[str, float]] = {}  # arch -> builder -> seconds
    for step in steps.steps:
        if step.outcome == "done" and (built := build.BUILD_STEP.fullmatch(step.name)):
            times.setdefault(built[1], {})[built[2]] = step.seconds
    lines = []
    for arch, seconds in times.items():
        fastest = min(seconds, key=seconds.__getitem__)
        if seconds[fastest] <= 0:
            continue
        for other in (name for name in seconds if name != fastest):
            lines.append(f"{arch}: {fastest} build {console.clock(seconds[fastest])}, {other} build "
                         f"{console.clock(seconds[other])}: the {fastest} build is "
                         f"{seconds[other] / seconds[fastest]:.1f}x faster")
    return lines


def _print_build_time_ratios(steps: console.StepLog) -> None:
    for line in build_time_ratios(steps):
        print(line, flush=True)


def build_wheels(posargs: Sequence[str], tools: Tools) -> None:
    options = parse_posargs(posargs)
    targets = _targets(options.arches)
    planned = builds_planned(targets, options.builders, host.arch())
    steps = console.StepLog()
    with containers.terminate_as_exit():
        _prepare(targets, steps)
        for target, builder in planned:
            _build(target, builder, tools, options.force, steps)
    print("\n" + steps.table(), flush=True)
    _print_build_time_ratios(steps)


def test(arch: str, posargs: Sequence[str]) -> bool:
    """Test the wheel already in wheelhouse/ (nox -s build makes it)."""
    options = parse_posargs(posargs)
    (target,) = _targets([arch])
    allowed = _allowed()
    steps = console.StepLog()
    with containers.terminate_as_exit():
        _prepare([target], steps)
        wheel = build.find_wheel(WHEELHOUSE, arch)
        records = _test_legs(target, build.built_by(wheel, WHEEL_CACHE), wheel, options.pytest_args, steps)
    ok = write_summary(records, steps, REPORTS, allowed)
    _write_levels()
    return ok


def _could_not(target: Target, builder: str, error: Exception, stage: str) -> suite.RunRecord:
    """A record for a step that raised: reported in the summary, and the matrix goes on."""
    if isinstance(error, HarnessError):
        console.note(str(error))  # its message says it all
    else:
        traceback.print_exc()
    why = f"{type(error).__name__}: {str(error).splitlines()[0]}"
    return suite.RunRecord.could_not_run(target, builder, why[:400], stage)


def matrix(posargs: Sequence[str], tools: Tools) -> bool:
    """Build every (target, builder) wheel, run the canary selection on every run of
    each emulated one, then the full suites (see batches()); a failure does not stop the rest."""
    options = parse_posargs(posargs)
    targets = _targets(options.arches)
    allowed = _allowed()
    planned = builds_planned(targets, options.builders, host.arch())
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
                    if runner_for(target).emulated:
                        background.submit(_background_images, target, steps)
            for batch in batches(planned, _images_made):
                records += _build_then_stages(batch, tools, options, steps, allowed)
            background.shutdown(wait=True)
        except BaseException:  # interrupted: stop the background work too
            console.stop_all()
            raise
    ok = write_summary(records, steps, REPORTS, allowed)  # prints the steps' table too
    _write_levels()
    _print_build_time_ratios(steps)
    return ok


def _write_levels() -> None:
    """What publish will ask: which machine's record proved each level of each wheel
    (a level no run here reaches needs one from elsewhere: README, Proving every level)."""
    text = f"## Every level shipped, and what proved it\n\n{gate.levels_table(WHEELHOUSE, REPORTS)}\n"
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / "levels.md").write_text(text)
    print("\n" + text, flush=True)


def _images_made(target: Target) -> bool:
    return all(images.image_exists(spec.tag)
               for spec in images.image_specs(target, DOCKER, host.ca_bundle()).values())


def batches(planned: list[tuple[Target, str]], images_made: Callable[[Target], bool]) -> list[list[tuple[Target, str]]]:
    """The builds in the order the matrix takes them: an emulated target whose images
    are still to be made (in the background) comes in a later batch, so that the
    others' suites overlap the making; with every image made, one batch. The
    sdist-build legs (other toolchains, wheels that do not ship) come last, so that
    they delay no canary."""
    waiting = {target.arch for target, _ in planned if runner_for(target).emulated and not images_made(target)}
    shipped = [(target, builder) for target, builder in planned if target.ships]
    first = [(target, builder) for target, builder in shipped if target.arch not in waiting]
    later = [(target, builder) for target, builder in shipped if target.arch in waiting]
    own_toolchains = [(target, builder) for target, builder in planned if not target.ships]
    return [batch for batch in (first, later, own_toolchains) if batch]


def _build_then_stages(batch: list[tuple[Target, str]], tools: Tools, options: Options,
                       steps: console.StepLog, allowed: Sequence[verdict.Allowed]) -> list[suite.RunRecord]:
    """Every wheel of the batch, then the canary selection on every run of each emulated
    one (its failures printed at once), then the full suites."""
    records, wheels = [], []
    for target, builder in batch:
        try:
            wheels.append((target, builder, _build(target, builder, tools, options.force, steps)))
        except Exception as error:
            records.append(_could_not(target, builder, error, "full"))
    canary = CanaryReport(allowed)
    for stage in STAGES:
        # Canaries for the emulated targets only: there an early report saves minutes; a
        # native target's full suites come next and take about a minute per level.
        order = [built for built in wheels if runner_for(built[0]).emulated] if stage == "canary" else wheels
        on_run = canary.run_ended if stage == "canary" else None
        for target, builder, wheel in order:
            stage_records = _test_legs(target, builder, wheel, options.pytest_args, steps, stage, on_run)
            records += stage_records
            if stage == "canary":
                canary.target_ended(stage_records)
    return records


class CanaryReport:
    """Prints the canary stage's failures now, not after the full suites: a run's own as
    soon as it ends, then, per target, the stage's verdict with what comparing its runs
    added (a run that ran other tests than the rest)."""

    def __init__(self, allowed: Sequence[verdict.Allowed]) -> None:
        self.allowed = allowed
        self.printed: dict[suite.RunRecord, list[str]] = {}

    def run_ended(self, record: suite.RunRecord) -> None:
        self.printed[record] = summary.failure_lines(*summary.judge_all([record], self.allowed))
        _print_lines(self.printed[record])

    def target_ended(self, records: list[suite.RunRecord]) -> None:
        rows, verdicts = summary.judge_all(records, self.allowed)
        first = records[0]
        print(f"==> canary stage of {first.target} ({first.builder}): "
              f"{'passed' if all(row.ok for row in rows) else 'FAILED'}", flush=True)
        for row in rows:
            lines = summary.failure_lines([row], verdicts)
            if lines != self.printed.get(row.record):
                _print_lines(lines)


def _print_lines(lines: list[str]) -> None:
    for line in lines:
        print(line, flush=True)


def _background_images(target: Target, steps: console.StepLog) -> None:
    try:
        images.ensure_images(target, IMAGE_CONTEXTS, steps)
    except Exception:  # the target's own turn retries and reports it
        traceback.print_exc()
