"""Building the wheels, the same for every builder (harness/building/builders.py).

Every builder builds a staged copy of the tree holding only what git tracks or
would track: no host build/ directory (whose CMake cache names host paths), no
.nox virtualenvs. The wheel is written to a temporary directory and moved into
place in one rename, so a failed or killed build never leaves a partial wheel.

Each builder keeps its last wheel, with the hash of its inputs (the files that
reach the wheel, the version, the build image and the builder's identity()),
in the wheel cache (harness/common/paths.py); a build whose inputs are unchanged reuses it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.building import versioning
from harness.building.builders import Builder, BuildJob
from harness.common import console
from harness.common.errors import HarnessError, low_space, writing
from harness.common.project import NAME, PACKAGE
from harness.plan.targets import Target
from harness.setup import containers
from harness.setup.images import ImageSpec, image_in_use
from harness.setup.tools import Tools
from harness.setup.wheels import read_wheel

# Files that never reach the wheel: changing them rebuilds nothing. Anything else
# (a new directory included) counts as a build input.
NOT_BUILD_INPUTS = ("tests/", "harness/", "benchmarks/", ".github/", ".ci/", "noxfile.py", "nox.sh")


def build_inputs(files: list[str]) -> list[str]:
    return [name for name in files if not name.startswith(NOT_BUILD_INPUTS)]


def source_files(repo: Path) -> list[str]:
    """The files git tracks or would track (not ignored), relative to repo."""
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo, check=True, capture_output=True,
    ).stdout.decode()
    return sorted({name for name in listing.split("\0") if name and (repo / name).is_file()})


def inputs_hash(repo: Path, files: list[str], *extra: str) -> str:
    digest = hashlib.sha256()
    for name in files:
        digest.update(name.encode() + b"\0" + hashlib.sha256((repo / name).read_bytes()).digest())
    for item in extra:
        digest.update(item.encode() + b"\0")
    return digest.hexdigest()[:16]


def stage(repo: Path, files: list[str], dest: Path) -> None:
    for name in files:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, dest / name)


def step_name(arch: str, builder: str) -> str:
    """The build's step in the run's table of steps."""
    return f"build {arch} ({builder})"


BUILD_STEP = re.compile(r"build (\S+) \((\S+)\)")  # step_name's arch and builder


def built_by(wheel: Path, cache: Path) -> str:
    """The builder whose last wheel is this very file, or "unknown"."""
    for kept in cache.glob(f"*/{wheel.name}"):
        if kept.read_bytes() == wheel.read_bytes():
            return kept.parent.name.split("-", 1)[1]
    return "unknown"


def wheel_matches(name: str, arch: str, repaired: bool = True) -> bool:
    """A wheel of the project for arch; repaired: with a manylinux tag (a wheelhouse/ wheel)."""
    return (
        name.startswith(f"{PACKAGE}-")
        and name.endswith(f"_{arch}.whl")
        and "-py3-none-" in name
        and ("manylinux" in name or not repaired)
    )


def find_wheel(wheelhouse: Path, arch: str) -> Path:
    """The target's one wheel in wheelhouse/, checked whole and the project's, for arch."""
    wheels = sorted(p for p in wheelhouse.glob("*.whl") if wheel_matches(p.name, arch))
    if len(wheels) != 1:
        found = ", ".join(p.name for p in wheels) or "none"
        raise HarnessError(
            f"expected one {arch} wheel of {PACKAGE} in {wheelhouse} (found: {found}); "
            f"build it with: nox -s build -- --arch {arch}"
        )
    read_wheel(wheels[0], f"run nox -s build -- --arch {arch}, which replaces it", project=PACKAGE, arch=arch)
    return wheels[0]


def platform_tag(wheel_name: str) -> str:
    """The platform tag(s) of a wheel file name: manylinux_2_34_x86_64, or dotted several."""
    return wheel_name.removesuffix(".whl").split("-")[-1]


def repair_excludes(pyproject: dict[str, Any]) -> set[str]:
    """The libraries the repair command leaves out of the wheel (libtorch's)."""
    command = pyproject["tool"]["cibuildwheel"]["repair-wheel-command"]
    return set(re.findall(r"--exclude\s+(\S+)", command))


def audit_problems(show: dict[str, Any], wheel_name: str, excluded: set[str]) -> list[str]:
    """What `auditwheel show --json` finds wrong with a repaired wheel.

    Its overall tag stays linux_*, since libtorch (excluded on purpose) is not in
    the wheel; the tag from versioned symbols must be the wheel's, and libtorch
    must be all that is outside it.
    """
    problems = []
    if show["sym_tag"] not in platform_tag(wheel_name).split("."):
        problems.append(f"tagged {platform_tag(wheel_name)}, but its symbols need {show['sym_tag']}")
    outside = set(show["external_libs"]) - excluded
    if outside:
        problems.append(f"needs libraries it does not carry: {', '.join(sorted(outside))}")
    return problems


def check_tag(wheel: Path, target: Target, build_image: str, excluded: set[str]) -> None:
    """auditwheel show, in the build image, must agree with the wheel's tag."""
    shown = subprocess.run(
        ["docker", "run", "--rm", *containers.label_args(), f"--platform={target.platform}",
         "--network=none", f"--volume={wheel.parent}:/wheelhouse:ro", build_image,
         "auditwheel", "show", "--json", f"/wheelhouse/{wheel.name}"],
        check=True, capture_output=True, text=True,
    ).stdout
    problems = audit_problems(json.loads(shown), wheel.name, excluded)
    if problems:
        raise RuntimeError(f"auditwheel show: {wheel.name} " + "; ".join(problems))
    print(f"auditwheel show agrees: {platform_tag(wheel.name)}", flush=True)


def put(file: Path, directory: Path, rerun: str) -> Path:
    """Copy file into directory in one rename; a failed copy leaves no partial file
    there and is a HarnessError that says why and to run `rerun` again."""
    final = directory / file.name
    incoming = directory / f".partial-{os.getpid()}-{file.name}"
    try:
        with writing(directory, rerun):
            directory.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file, incoming)
            os.replace(incoming, final)
    finally:
        with contextlib.suppress(OSError):  # a read-only directory has none to remove
            incoming.unlink(missing_ok=True)
    return final


def replace_in_wheelhouse(built: Path, wheelhouse: Path, arch: str) -> Path:
    """Put a built wheel into wheelhouse/ atomically and drop older ones of the arch."""
    rerun = f"nox -s build -- --arch {arch}"
    final = put(built, wheelhouse, rerun)
    with writing(wheelhouse, rerun):
        for old in wheelhouse.glob("*.whl"):
            if old != final and wheel_matches(old.name, arch):
                old.unlink()
    return final


def remove_partial_outputs(*directories: Path) -> None:
    """Temporary outputs (.partial-<pid>-...) of builds whose process is gone."""
    for directory in directories:
        for partial in directory.glob(".partial-*"):
            pid = partial.name.split("-")[1]
            if not Path(f"/proc/{pid}").exists():
                if partial.is_dir():
                    shutil.rmtree(partial, ignore_errors=True)
                else:
                    partial.unlink(missing_ok=True)


def build_wheel(
    target: Target,
    builder: Builder,
    images: dict[str, ImageSpec],
    *,
    repo: Path,
    wheelhouse: Path | None,
    cache: Path,
    tools: Tools,
    steps: console.StepLog,
    force: bool = False,
) -> Path:
    """Build (or reuse) the target's wheel with one builder; return it in wheelhouse/
    (wheelhouse None: a wheel that does not ship, returned where the builder keeps it).

    Each builder keeps its last wheel and the hash of its inputs in cache/, so a
    run that builds both ways reuses both when nothing changed.
    """
    build_image = images["build"].tag
    pyproject = tomllib.loads((repo / "pyproject.toml").read_text())
    files = source_files(repo)
    kept = cache / f"{target.name}-{builder.name}"
    stamp = kept / "inputs.json"
    rerun = f"nox -s build -- --arch {target.arch}" if target.ships else "nox -s matrix"
    if wheelhouse is not None:
        with writing(wheelhouse, rerun):
            wheelhouse.mkdir(parents=True, exist_ok=True)
    with writing(cache, rerun):
        kept.mkdir(parents=True, exist_ok=True)
    remove_partial_outputs(*filter(None, (wheelhouse, cache)))
    with (steps.step(step_name(target.name, builder.name)) as step,
          console.exclusive(cache / f"{target.arch}.lock")):
        with tempfile.TemporaryDirectory(prefix=f"{NAME}-stage-") as staged:
            partial = cache / f".partial-{os.getpid()}-{target.name}-{builder.name}"
            job = BuildJob(target, builder.name, build_image, Path(staged), partial, tools,
                           versioning.project_version(repo, tools.python))
            builder.prepare(job)
            inputs = inputs_hash(repo, build_inputs(files), job.version, builder.name, build_image,
                                 *builder.identity(job))
            if not force and (reusable := kept_wheel(stamp, inputs, target.arch)):
                step.outcome = "reused"
                print(f"{reusable.name}: built by {builder.name} from these very inputs, reused", flush=True)
                return replace_in_wheelhouse(reusable, wheelhouse, target.arch) if wheelhouse else reusable
            try:
                with writing(job.staged, rerun):
                    stage(repo, files, job.staged)
                with builder_failure(rerun, cache, job.staged), image_in_use(build_image, rerun):
                    builder.build(job)
                    built = list(partial.glob("*.whl"))
                    if len(built) != 1 or not wheel_matches(built[0].name, target.arch, builder.repairs):
                        raise RuntimeError(
                            f"{builder.name} made {[p.name for p in built]}, expected one "
                            f"{PACKAGE}-*-py3-none-{'manylinux_*_' if builder.repairs else ''}{target.arch}.whl"
                        )
                    read_wheel(built[0], f"{builder.name} made it so (its output is above)", project=PACKAGE,
                               arch=target.arch)
                    if builder.repairs:
                        check_tag(built[0], target, build_image, repair_excludes(pyproject))
                with writing(cache, rerun):
                    stamp.unlink(missing_ok=True)
                    for old in kept.glob("*.whl"):
                        old.unlink()
                    os.replace(built[0], kept / built[0].name)
            finally:
                shutil.rmtree(partial, ignore_errors=True)
        with writing(cache, rerun):
            stamp.write_text(json.dumps({"inputs": inputs, "wheel": built[0].name}) + "\n")
        if wheelhouse is None:
            print(f"{kept / built[0].name} (built by {builder.name}; it does not ship)", flush=True)
            return kept / built[0].name
        wheel = replace_in_wheelhouse(kept / built[0].name, wheelhouse, target.arch)
        print(f"wheelhouse/{wheel.name} (built by {builder.name})", flush=True)
        return wheel


@contextlib.contextmanager
def builder_failure(rerun: str, *written: Path) -> Iterator[None]:
    """A builder that exits with an error (a compile error, a full disk) is one message:
    its output above says why."""
    try:
        yield
    except console.CommandFailed as error:
        raise HarnessError(f"{error} (its output is above){low_space(*written)}: fix what it names, "
                           f"then run {rerun} again") from None


def kept_wheel(stamp: Path, inputs: str, arch: str) -> Path | None:
    """The builder's last wheel, if its stamp says it was built from these inputs and
    it is whole; a damaged one is noted and built again."""
    try:
        recorded = json.loads(stamp.read_text())
        wheel, recorded_inputs = stamp.parent / recorded["wheel"], recorded["inputs"]
    except (OSError, ValueError, KeyError, TypeError):  # no stamp yet, or a half-written one
        return None
    if recorded_inputs != inputs or not wheel.exists():
        return None
    try:
        read_wheel(wheel, "building it again", project=PACKAGE, arch=arch)
    except HarnessError as error:
        console.note(str(error))
        return None
    return wheel
