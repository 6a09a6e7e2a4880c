"""Line and branch coverage of the kernels, per kernel file and ISA level (`nox -s coverage`).

The library is built with MOE_XARCH_COVERAGE=ON (gcov, at the release
optimization level): natively for x86_64, with the cross compiler for aarch64.
The kernel suite then runs once per x86 level this CPU has and once per QEMU
CPU model (in the aarch64 test image), each run writing its own .gcda set
under reports/coverage/<arch>/<level>/ through GCOV_PREFIX (inside the
container, into the mounted report dir). gcovr reads each set with the arch's
gcov; the table, coverage.json and coverage.md go to reports/coverage/.

Each run runs the parts of the suite the test sessions' plan gives it (harness/plan/verdict.py,
designated()): the level-independent tests once per arch; the CPU models side by side, as
there.

The verdict: under each level, the level's own kernel files (those its level table names,
which CMake compiles for it), and over all of an arch's runs together, the files they share
(csrc/arch/<arch>/*.h, csrc/core/), have no line left unexecuted that a marker in the C++
(read_markers) or the closing-brace rule does not explain.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.building import cross
from harness.common import console
from harness.common.paths import COVERAGE_BUILD, COVERAGE_REPORTS, IMAGE_CONTEXTS, REPO
from harness.common.project import ENV_PREFIX, SUPPORTED_ISAS
from harness.plan.levels import ladder
from harness.plan.runners import SuiteRun, runner_for, selections
from harness.plan.targets import ARCHES, Target, load_targets, select
from harness.running import suite
from harness.setup import containers, host, images
from harness.setup.tools import pinned

GCOVR = pinned("gcovr")
KERNEL_FILES = ("csrc/arch/*/gemm_*.cpp", "csrc/generic/gemm_*.cpp", "csrc/arch/*/*.h", "csrc/core/*.cpp",
                "csrc/core/*.h")
CMAKE_SETTING = f"cmake.define.{ENV_PREFIX}_COVERAGE=ON"


# The one rule over every file: a line that is a lone closing brace.
EXCEPTION_CLEANUP = ("the exception cleanup of the scope's locals, which gcov puts on its closing brace: "
                     "runs only when an allocation in the scope throws")


# --- the C++'s unreachable-line markers -------------------------------------------------------
#
# Any other line no run on these machines can execute carries its reason in the C++, in a
# comment of its own right before it:
#
#   // coverage: unreachable[ on ARCH][ unless LEVEL[ or LEVEL...] ran][ (NAME)]: REASON
#   // coverage: unreachable (NAME)                  the reason NAME, given once in some marker
#   // coverage: begin unreachable...  ...  // coverage: end        every line in between
#
# A marker covers the next line that is not a comment; a REASON runs on over the comment lines
# after it; markers stacked together cover the same line (one `end` closes stacked begins).
# `on ARCH`: only for that arch's runs; `unless ... ran`: only when no run was of those levels.
# Not gcovr's own GCOVR_EXCL_* markers: they drop lines from the counts, with no reason, arch
# or level, where the report keeps every line and says why it cannot run.

MARKER = re.compile(r"^//\s*coverage\s*:", re.IGNORECASE)
TRAILING = re.compile(r"//\s*coverage\s*:", re.IGNORECASE)
UNREACHABLE = re.compile(r"^// coverage: (?P<begin>begin )?unreachable(?: on (?P<arch>\S+))?"
                         r"(?: unless (?P<levels>\S+(?: or \S+)*) ran)?(?: \((?P<name>[\w-]+)\))?"
                         r"(?:: (?P<text>\S.*))?$")
END = "// coverage: end"
SOURCE_SUFFIXES = (".cpp", ".h", ".def")


class MarkerError(ValueError):
    """A marker that is malformed or covers no line: `file:line: what`."""


@dataclasses.dataclass(frozen=True)
class Reason:
    """Why marked lines cannot run: on `arch` ("*": any), and with `unless_ran`, only when none
    of those levels had a run (a CPU without them)."""

    text: str
    arch: str = "*"
    unless_ran: tuple[str, ...] = ()

    def holds(self, arch: str, levels_run: Iterable[str]) -> bool:
        return self.arch in ("*", arch) and not set(self.unless_ran) & set(levels_run)


@dataclasses.dataclass
class _Marker:
    line: int
    begin: bool
    reason: Reason | None  # None: a use of `name`
    name: str | None


def _parse(path: str, text: Sequence[str], levels: Mapping[str, Iterable[str]]) -> list[tuple[range, _Marker]]:
    """The markers of one file, each with the lines it covers."""
    found: list[tuple[range, _Marker]] = []
    pending: list[_Marker] = []  # markers waiting for their line
    reason_open = False  # the last marker's reason runs on over comment lines
    blocks: list[tuple[int, list[_Marker]]] = []  # open begins: (first line, the markers)

    def error(number: int, what: str) -> MarkerError:
        return MarkerError(f"{path}:{number}: {what}")

    for number, raw in enumerate(text, 1):
        line = raw.strip()
        if MARKER.match(line):
            if line == END:
                if pending:
                    raise error(number, "`end` right after a marker: the block has no line")
                if not blocks:
                    raise error(number, "`end` without a `begin`")
                first, group = blocks.pop()
                found += [(range(first, number), marker) for marker in group]
                reason_open = False
                continue
            match = UNREACHABLE.match(line)
            if not match:
                raise error(number, f"malformed coverage marker: {line!r}")
            arch, unless, name, words = match["arch"], match["levels"], match["name"], match["text"]
            if arch is not None and arch not in levels:
                raise error(number, f"unknown arch {arch!r} (known: {', '.join(sorted(levels))})")
            unless_ran = tuple(unless.split(" or ")) if unless else ()
            known = {level for arch_levels in ([levels[arch]] if arch else levels.values())
                     for level in arch_levels}
            for level in unless_ran:
                if level not in known:
                    raise error(number, f"unknown level {level!r}")
            if words is None and (arch or unless or not name):
                raise error(number, "a marker gives its reason, or names one given elsewhere with `(NAME)` alone")
            if pending and pending[-1].begin != bool(match["begin"]):
                raise error(number, "stacked markers are all `begin`s or none")
            reason = Reason(words, arch or "*", unless_ran) if words is not None else None
            pending.append(_Marker(number, bool(match["begin"]), reason, name))
            reason_open = words is not None
        elif not line.startswith("//") and TRAILING.search(line):
            raise error(number, "a coverage marker goes on a line of its own, before the line it covers")
        elif line.startswith("//") and pending:
            if not reason_open:
                raise error(number, "a comment between a marker without its own reason and its line")
            last = pending[-1]
            assert last.reason is not None
            last.reason = dataclasses.replace(last.reason, text=f"{last.reason.text} {line[2:].strip()}")
        elif pending:
            if not line:
                raise error(pending[0].line, "the marker covers no line: a blank line follows it")
            if line == "}" and not pending[0].begin:
                raise error(pending[0].line, "the marker covers a lone closing brace: its line is gone")
            if pending[0].begin:
                blocks.append((number, pending))
            else:
                found += [(range(number, number + 1), marker) for marker in pending]
            pending, reason_open = [], False
    if pending:
        raise error(pending[0].line, "the marker covers no line: the file ends")
    if blocks:
        raise error(blocks[-1][1][0].line, "`begin` without its `end`")
    return sorted(found, key=lambda covered: covered[1].line)


def read_markers(root: Path = REPO, levels: Mapping[str, Iterable[str]] | None = None
                 ) -> dict[str, dict[int, list[Reason]]]:
    """Every marker under root/csrc: file -> line number -> the reasons that cover it, in the
    markers' order (the first that holds is the one reported). Raises MarkerError naming file and line for a malformed marker, one that
    covers no line, or a name used but not given (or given twice)."""
    if levels is None:
        targets = load_targets()
        levels = {arch: [*target.isa_levels, *(model.isa for model in target.cpu_models)]
                  for arch, target in targets.items()}
    parsed: dict[str, list[tuple[range, _Marker]]] = {}
    for source in sorted((root / "csrc").rglob("*")):
        if source.is_file() and source.suffix in SOURCE_SUFFIXES:
            path = source.relative_to(root).as_posix()
            parsed[path] = _parse(path, source.read_text().splitlines(), levels)
    named: dict[str, tuple[str, int, Reason]] = {}
    for path, markers in parsed.items():
        for _, marker in markers:
            if marker.name and marker.reason is not None:
                if marker.name in named:
                    first, line, _ = named[marker.name]
                    raise MarkerError(f"{path}:{marker.line}: the reason ({marker.name}) is given again "
                                      f"(first at {first}:{line})")
                named[marker.name] = (path, marker.line, marker.reason)
    found: dict[str, dict[int, list[Reason]]] = {}
    for path, markers in parsed.items():
        for lines, marker in markers:
            if marker.reason is None:
                if marker.name not in named:
                    raise MarkerError(f"{path}:{marker.line}: no marker gives the reason ({marker.name})")
                reason = named[marker.name][2]
            else:
                reason = marker.reason
            for number in lines:
                found.setdefault(path, {}).setdefault(number, []).append(reason)
    return found


def config_settings(build_dir: Path) -> list[str]:
    """pip's -C settings for an instrumented build in build_dir (whose .gcno files stay there)."""
    return ["-C", CMAKE_SETTING, "-C", f"build-dir={build_dir}"]


def gcov_env(prefix: str, build_dir: Path) -> dict[str, str]:
    """Counts go to prefix/<path of the object inside build_dir>.gcda, one set per run."""
    return {"GCOV_PREFIX": prefix, "GCOV_PREFIX_STRIP": str(len(build_dir.resolve().parts) - 1)}


def level_sources(root: Path = REPO) -> dict[str, str]:
    """Kernel file -> the level it is compiled for, as the level tables declare it."""
    return {path: level.name for arch in ARCHES.values() for level in ladder(arch.sources, root)
            for path in level.files}


def own_files(arch: str, level: str, declared: Mapping[str, str]) -> list[str]:
    """The kernel files a level brings (its GEMMs, its 4-bit kernels), which only its run
    is sure to reach: those of its arch's folder declared for it (generic's: csrc/generic/)."""
    folder = "csrc/generic/" if level == "generic" else f"csrc/arch/{ARCHES[arch].sources}/"
    return sorted(path for path, owner in declared.items() if owner == level and path.startswith(folder))


def shared_files(arch: str, files: Iterable[str]) -> list[str]:
    """Files the levels of arch share: the arch's headers and the driver."""
    folder = f"csrc/arch/{ARCHES[arch].sources}/"
    return [f for f in files if f.startswith("csrc/core/") or (f.startswith(folder) and f.endswith(".h"))]


def is_kernel_file(path: str) -> bool:
    return any(fnmatch.fnmatch(path, pattern) for pattern in KERNEL_FILES)


def copy_notes(build_dir: Path, gcda_dir: Path) -> None:
    """gcov reads the build's .gcno next to each run's .gcda."""
    for note in build_dir.rglob("*.gcno"):
        dest = gcda_dir / note.relative_to(build_dir)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(note, dest)


def gcovr_command(gcovr: str, gcov: str, gcda_dir: Path, output: Path, root: Path = REPO) -> list[str]:
    # The counters are atomic (CMakeLists.txt), so a count over 2^32 is real (the generic
    # level's inner loops reach 10^10): gcovr's check for wrapped counters would refuse it.
    return [gcovr, "--root", str(root), "--gcov-executable", gcov,
            "--filter", str(root / "csrc/"), "--exclude-throw-branches",
            "--exclude-unreachable-branches", "--gcov-suspicious-hits-threshold", "0",
            "--json", str(output), str(gcda_dir)]


# --- what a run's gcovr JSON says ------------------------------------------------------------


@dataclasses.dataclass
class FileCoverage:
    """Times each line ran; times each branch was taken, by (line, function, branch number):
    a template's instantiations are functions of their own."""

    lines: dict[int, int] = dataclasses.field(default_factory=dict)
    branches: dict[tuple[int, str, int], int] = dataclasses.field(default_factory=dict)

    def merge(self, other: FileCoverage) -> FileCoverage:
        lines, branches = dict(self.lines), dict(self.branches)
        for number, count in other.lines.items():
            lines[number] = lines.get(number, 0) + count
        for key, count in other.branches.items():
            branches[key] = branches.get(key, 0) + count
        return FileCoverage(lines, branches)

    def uncovered(self) -> list[int]:
        return sorted(n for n, count in self.lines.items() if count == 0)

    def summary(self) -> dict[str, int]:
        return {"lines": len(self.lines), "lines_hit": sum(c > 0 for c in self.lines.values()),
                "branches": len(self.branches), "branches_hit": sum(c > 0 for c in self.branches.values())}


def parse_gcovr(data: Mapping) -> dict[str, FileCoverage]:
    """gcovr's JSON (an entry per line and function) by kernel file."""
    files: dict[str, FileCoverage] = {}
    for entry in data["files"]:
        if not is_kernel_file(entry["file"]):
            continue
        coverage = files.setdefault(entry["file"], FileCoverage())
        for line in entry["lines"]:
            number = line["line_number"]
            coverage.lines[number] = coverage.lines.get(number, 0) + line["count"]
            for branch in line["branches"]:
                key = (number, line.get("function_name", ""), branch["branchno"])
                coverage.branches[key] = coverage.branches.get(key, 0) + branch["count"]
    return files


def reasons(arch: str, text: Sequence[str], levels_run: Iterable[str] = (),
            marked: Mapping[int, Sequence[Reason]] | None = None) -> dict[int, str]:
    """Line number -> why it cannot run, for the lines of a file (its text, one line an item;
    marked: its markers, from read_markers), after runs of levels_run."""
    found = {number: EXCEPTION_CLEANUP for number, line in enumerate(text, 1) if line.strip() == "}"}
    for number, held in (marked or {}).items():
        for reason in held:
            if reason.holds(arch, levels_run):
                found.setdefault(number, reason.text)
    return found


@dataclasses.dataclass(frozen=True)
class Gap:
    """An uncovered line where the verdict wants coverage."""

    arch: str
    level: str  # the level whose run missed it, or "all" for the arch's runs together
    file: str
    line: int
    text: str
    reason: str  # empty: nothing explains it


INCLUDE = re.compile(r'^\s*#include "([^"]+)"', re.MULTILINE)


def included(path: str, root: Path = REPO) -> set[str]:
    """The project headers `path` includes, directly or through others (include paths are from csrc/)."""
    seen: set[str] = set()
    todo = [path]
    while todo:
        for name in INCLUDE.findall((root / todo.pop()).read_text()):
            header = f"csrc/{name}"
            if header not in seen and (root / header).is_file():
                seen.add(header)
                todo.append(header)
    return seen


def includers(arch: str, declared: Mapping[str, str], root: Path = REPO) -> dict[str, set[str]]:
    """Each header of the arch's folder that some level's own files include -> those levels:
    only their runs can reach it (avx512_reduce.h is compiled under the AVX-512 levels alone)."""
    levels: dict[str, set[str]] = {}
    for level in sorted(set(declared.values())):
        for path in own_files(arch, level, declared):
            for header in included(path, root):
                if header.startswith(f"csrc/arch/{ARCHES[arch].sources}/"):
                    levels.setdefault(header, set()).add(level)
    return levels


def unchecked(arch: str, runs: Mapping[str, dict[str, FileCoverage]], sources: Path = REPO) -> dict[str, str]:
    """Shared headers no run can have reached, as not_run entries: the levels that include them had no run."""
    found = {}
    for header, levels in sorted(includers(arch, level_sources(sources), sources).items()):
        if not levels & set(runs):
            found[f"{arch} {header}"] = f"only {', '.join(sorted(levels))} include it, and none of them ran"
    return found


def gaps(arch: str, runs: Mapping[str, dict[str, FileCoverage]], sources: Path = REPO) -> list[Gap]:
    """Uncovered lines of each level's own files under it, and of the shared files over the runs
    that reach them: the arch's headers over the runs of the levels that include them, the
    driver and the headers no level's own file includes over all runs."""
    declared = level_sources(sources)
    checked: list[tuple[str, str, FileCoverage]] = []
    for level, files in runs.items():
        checked += [(level, path, files[path]) for path in own_files(arch, level, declared) if path in files]
    reached_by = includers(arch, declared, sources)
    paths = sorted({path for files in runs.values() for path in files})
    for path in shared_files(arch, paths):
        union: FileCoverage | None = None
        for level, files in runs.items():
            if path in files and (path not in reached_by or level in reached_by[path]):
                union = files[path] if union is None else union.merge(files[path])
        if union is not None:
            checked.append(("all", path, union))
    found = []
    markers = read_markers(sources)
    for level, path, coverage in checked:
        text = (sources / path).read_text().splitlines()
        why = reasons(arch, text, runs, markers.get(path))
        for number in coverage.uncovered():
            found.append(Gap(arch, level, path, number, text[number - 1].strip(), why.get(number, "")))
    return found


# --- the report -------------------------------------------------------------------------------


def _percent(hit: int, total: int) -> str:
    return "-" if total == 0 else f"{100 * hit / total:.0f}%"


def table_rows(runs: Mapping[str, Mapping[str, dict[str, FileCoverage]]]) -> tuple[list[str], list[list[str]]]:
    """One row per kernel file, one column per (arch, level): 'lines% / branches%'."""
    columns = [(arch, level) for arch, levels in runs.items() for level in levels]
    files = sorted({path for levels in runs.values() for files in levels.values() for path in files})
    header = ["file", *(f"{arch} {level}" for arch, level in columns)]
    rows = []
    for path in files:
        cells = []
        for arch, level in columns:
            coverage = runs[arch][level].get(path)
            if coverage is None:
                cells.append("")
                continue
            s = coverage.summary()
            cells.append(f"{_percent(s['lines_hit'], s['lines'])} / {_percent(s['branches_hit'], s['branches'])}")
        rows.append([path, *cells])
    return header, rows


def render(header: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                     for row in [header, *rows])


def gap_lines(found: Sequence[Gap]) -> list[str]:
    return [f"{g.arch} {g.level} {g.file}:{g.line}: {g.text}  -- "
            f"{g.reason or 'NOT EXPLAINED: no test reaches it'}" for g in found]


def write_report(runs: Mapping[str, Mapping[str, dict[str, FileCoverage]]], found: Sequence[Gap],
                 not_run: Mapping[str, str], out: Path = COVERAGE_REPORTS) -> str:
    """Writes coverage.json and coverage.md into out; returns the text table and gap list."""
    header, rows = table_rows(runs)
    skipped = [f"{run}: not run ({why})" for run, why in not_run.items()]
    out.mkdir(parents=True, exist_ok=True)
    (out / "coverage.json").write_text(json.dumps({
        "files": {arch: {level: {path: c.summary() for path, c in files.items()}
                         for level, files in levels.items()} for arch, levels in runs.items()},
        "gaps": [dataclasses.asdict(g) for g in found],
        "not_run": dict(not_run),
    }, indent=2) + "\n")
    legend = "lines / branches executed, per kernel file and level"
    listed = gap_lines(found) or ["none"]
    (out / "coverage.md").write_text(
        f"# Kernel coverage\n\n{legend}\n\n{render(header, rows, markdown=True)}\n\n"
        + "".join(f"- {line}\n" for line in skipped)
        + "\n## Uncovered lines the verdict checks\n\n" + "".join(f"- `{line}`\n" for line in listed))
    return "\n".join([legend, render(header, rows, markdown=False), *skipped,
                      "uncovered lines the verdict checks:", *listed])


def unexplained(found: Sequence[Gap]) -> list[Gap]:
    return [g for g in found if not g.reason]


def read_run(gcovr: str, gcov: str, build_dir: Path, gcda_dir: Path) -> dict[str, FileCoverage]:
    """The kernel files' coverage from one run's .gcda set."""
    copy_notes(build_dir, gcda_dir)
    output = gcda_dir / "gcovr.json"
    subprocess.run(gcovr_command(gcovr, gcov, gcda_dir, output), check=True)
    return parse_gcovr(json.loads(output.read_text()))


# --- the runs ---------------------------------------------------------------------------------

Runs = dict[str, dict[str, FileCoverage]]  # level -> kernel file -> coverage


@dataclasses.dataclass
class Outcome:
    runs: dict[str, Runs] = dataclasses.field(default_factory=dict)  # arch -> level -> ...
    not_run: dict[str, str] = dataclasses.field(default_factory=dict)  # "arch level" -> why
    failed: list[str] = dataclasses.field(default_factory=list)  # runs whose suite failed


def _fresh(directory: Path) -> Path:
    shutil.rmtree(directory, ignore_errors=True)  # counts of an older build would not match its notes
    directory.mkdir(parents=True)
    return directory


BUILDER = "coverage"  # what the plan's run ids name as the wheel's maker


def native_runs(target: Target, bin_dir: Path, pytest_args: Sequence[str], outcome: Outcome) -> None:
    """Instrumented build into bin_dir's venv, then the suite once per level this CPU has."""
    build_dir = COVERAGE_BUILD / target.arch
    python = str(bin_dir / "python")
    console.run_streamed([python, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                          *config_settings(build_dir), str(REPO)], f"build {target.arch} coverage")
    supported = subprocess.run([python, "-c", SUPPORTED_ISAS],
                               check=True, capture_output=True, text=True).stdout.split()
    for level in target.isa_levels:
        if level not in supported:
            outcome.not_run[f"{target.arch} {level}"] = "this CPU lacks it"
    runs = outcome.runs.setdefault(target.arch, {})
    runner = runner_for(target)
    planned = runner.runs(target, supported)
    selected = selections(planned, BUILDER)
    for run in planned:
        gcda = _fresh(COVERAGE_REPORTS / target.arch / run.isa)
        env = {**dict(run.env), **gcov_env(str(gcda), build_dir)}
        command = [python, "-m", "pytest", "tests/kernels", "-p", "no:cacheprovider", *runner.coverage_workers(),
                   *selected[run.name], *pytest_args]
        code = console.run_streamed(command, f"coverage {run.name}", env=env, cwd=REPO, check=False)
        if code != 0:
            outcome.failed.append(f"{target.arch} {run.isa}")
        runs[run.isa] = read_run(str(bin_dir / "gcovr"), "gcov", build_dir, gcda)


def emulated_runs(target: Target, bin_dir: Path, pytest_args: Sequence[str], outcome: Outcome) -> None:
    """Cross-built instrumented wheel, then the suite under each CPU model in the test image,
    the models side by side (each in one process: runners.Qemu.coverage_workers)."""
    build_dir = COVERAGE_BUILD / target.arch
    host.prepare([target])  # Docker, QEMU's registration, debootstrap, as the test sessions do
    wheels = _fresh(COVERAGE_BUILD / f"{target.arch}-wheel")
    cross.ensure_compiler(target)
    console.run_streamed(
        cross.pip_wheel_command(str(bin_dir / "python"), REPO, wheels, config_settings(build_dir)),
        f"build {target.arch} coverage", env=cross.cross_env(REPO, target, cross.torch_dir(target)))
    (wheel,) = wheels.glob("*.whl")
    image = images.ensure_images(target, IMAGE_CONTEXTS, console.StepLog(), upto="test")["test"].tag
    runner = runner_for(target)
    planned = runner.runs(target, [])
    selected = selections(planned, BUILDER)

    def one_run(run: SuiteRun) -> tuple[SuiteRun, int | None]:
        report_dir = _fresh(COVERAGE_REPORTS / target.arch / run.isa)
        counted = dataclasses.replace(run, env=(*run.env, *gcov_env("/report/gcda", build_dir).items()))
        name = containers.container_name("coverage", run.name)
        command = suite.docker_run_command(
            counted, image=image, wheel=wheel, repo=REPO, report_dir=report_dir, name=name,
            pytest_args=[*runner.coverage_workers(), *selected[run.name], *pytest_args])
        start = time.monotonic()
        try:
            code = console.run_streamed(command, f"coverage {run.name}", check=False,
                                        timeout=suite.RUN_TIMEOUT_SECONDS)
        finally:
            containers.remove(name)
        print(f"coverage {run.name}: {time.monotonic() - start:.0f} s", flush=True)
        return run, code

    runs = outcome.runs.setdefault(target.arch, {})
    with ThreadPoolExecutor(max_workers=max(1, len(planned))) as pool:
        for run, code in pool.map(one_run, planned):
            if code != 0:
                outcome.failed.append(f"{target.arch} {run.cpu} {run.isa}")
            runs[run.isa] = read_run(str(bin_dir / "gcovr"), f"{target.cross_triplet}-gcov", build_dir,
                                     COVERAGE_REPORTS / target.arch / run.isa / "gcda")


def main(bin_dir: Path, arches: Sequence[str], pytest_args: Sequence[str]) -> bool:
    """Every selected target's runs, then the report; True when every gap is explained."""
    outcome = Outcome()
    for target in select(load_targets(), list(arches)):
        run_target = emulated_runs if runner_for(target).emulated else native_runs
        run_target(target, bin_dir, pytest_args, outcome)
    found = [gap for arch, runs in outcome.runs.items() for gap in gaps(arch, runs)]
    for arch, runs in outcome.runs.items():
        outcome.not_run.update(unchecked(arch, runs))
    print(write_report(outcome.runs, found, outcome.not_run), flush=True)
    for run in outcome.failed:
        print(f"the suite failed under {run}", flush=True)
    missing = unexplained(found)
    if missing:
        print(f"{len(missing)} uncovered lines no test reaches and no coverage marker explains", flush=True)
    return not missing and not outcome.failed
