"""Building the wheels: cibuildwheel in each target's local build image.

cibuildwheel copies its working directory into the container, so it runs in a
staged copy of the tree holding only what git tracks or would track: no host
build/ directory (whose CMake cache names host paths), no .nox virtualenvs.
The wheel is written to a temporary directory and moved into wheelhouse/ in one
rename, so a failed or killed build never leaves a partial wheel there.

A build is skipped when its inputs (the staged files, the build image, the
cibuildwheel version) are those of the wheel already in wheelhouse/.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from harness import console, containers
from harness.errors import HarnessError
from harness.images import ImageSpec
from harness.targets import Target

PROJECT = "moe_kernels"
CIBUILDWHEEL = "cibuildwheel==4.3.5"  # what the nox sessions install


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


def cibuildwheel_env(target: Target, build_image: str, owner_labels: list[str]) -> dict[str, str]:
    """The per-target settings; the shared ones are in [tool.cibuildwheel]."""
    return {
        "CIBW_PLATFORM": "linux",
        "CIBW_ARCHS": target.arch,
        "CIBW_BUILD": " ".join(f"{tag}-manylinux_{target.arch}" for tag in target.python_tags),
        f"CIBW_MANYLINUX_{target.arch.upper()}_IMAGE": build_image,
        # Labels let the next run remove the container of a killed build.
        "CIBW_CONTAINER_ENGINE": f"docker; create_args: {' '.join(owner_labels)}",
    }


def wheel_matches(name: str, arch: str) -> bool:
    return (
        name.startswith(f"{PROJECT}-")
        and name.endswith(f"_{arch}.whl")
        and "-py3-none-" in name
        and "manylinux" in name
    )


def find_wheel(wheelhouse: Path, arch: str) -> Path:
    wheels = sorted(p for p in wheelhouse.glob("*.whl") if wheel_matches(p.name, arch))
    if len(wheels) != 1:
        found = ", ".join(p.name for p in wheels) or "none"
        raise HarnessError(
            f"expected one {arch} wheel of {PROJECT} in {wheelhouse} (found: {found}); "
            f"build it with: nox -s build -- --arch {arch}"
        )
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


def publish(built: Path, wheelhouse: Path, arch: str) -> Path:
    """Move the new wheel into wheelhouse/ atomically and drop older ones of the arch."""
    final = wheelhouse / built.name
    os.replace(built, final)
    for old in wheelhouse.glob("*.whl"):
        if old != final and wheel_matches(old.name, arch):
            old.unlink()
    return final


def remove_partial_outputs(wheelhouse: Path) -> None:
    """Temporary output directories of builds whose process is gone."""
    for partial in wheelhouse.glob(".partial-*"):
        pid = partial.name.split("-")[1]
        if not Path(f"/proc/{pid}").exists():
            shutil.rmtree(partial, ignore_errors=True)


def build_wheel(
    target: Target,
    images: dict[str, ImageSpec],
    *,
    repo: Path,
    wheelhouse: Path,
    stamps: Path,
    cibuildwheel: list[str],
    steps: console.StepLog,
    force: bool = False,
) -> Path:
    build_image = images["build"].tag
    pyproject = tomllib.loads((repo / "pyproject.toml").read_text())
    files = source_files(repo)
    # The pinned tool, not its path: nox -s build and nox -s matrix share wheels.
    inputs = inputs_hash(repo, build_inputs(files), build_image, CIBUILDWHEEL)
    stamp = stamps / f"{target.arch}.json"
    wheelhouse.mkdir(parents=True, exist_ok=True)
    remove_partial_outputs(wheelhouse)
    with steps.step(f"build {target.arch}") as step, console.exclusive(stamps / f"{target.arch}.lock"):
        if not force and stamp.exists():
            recorded = json.loads(stamp.read_text())
            if recorded["inputs"] == inputs and (wheelhouse / recorded["wheel"]).exists():
                step.outcome = "reused"
                print(f"{recorded['wheel']}: built from these very inputs, reused", flush=True)
                return wheelhouse / recorded["wheel"]
        partial = wheelhouse / f".partial-{os.getpid()}-{target.arch}"
        try:
            with tempfile.TemporaryDirectory(prefix="moe-kernels-stage-") as staged:
                stage(repo, files, Path(staged))
                console.run_streamed(
                    [*cibuildwheel, "--output-dir", str(partial), "."],
                    f"build {target.arch}",
                    cwd=staged,
                    env=cibuildwheel_env(target, build_image, containers.label_args()),
                )
            built = list(partial.glob("*.whl"))
            if len(built) != 1 or not wheel_matches(built[0].name, target.arch):
                raise RuntimeError(
                    f"cibuildwheel made {[p.name for p in built]}, expected one "
                    f"{PROJECT}-*-py3-none-manylinux_*_{target.arch}.whl"
                )
            check_tag(built[0], target, build_image, repair_excludes(pyproject))
            wheel = publish(built[0], wheelhouse, target.arch)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        stamps.mkdir(parents=True, exist_ok=True)
        stamp.write_text(json.dumps({"inputs": inputs, "wheel": wheel.name}) + "\n")
        print(f"wheelhouse/{wheel.name}", flush=True)
        return wheel
