"""Download a target's wheels on the host, so that image builds need no network.

`pip download --platform` picks files for the target but evaluates environment
markers for the host: on x86_64 it adds torch's x86_64-only CUDA packages to an
aarch64 download (several GB). So dependencies are followed here, one round of
`pip download --no-deps` at a time, with markers evaluated for the target.
pip itself runs with the host's own configuration (index, find-links, CA), which
is how a locally provided torch build is found.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable, Sequence
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from harness.targets import ARCHES, Target


def platform_tags(target: Target) -> list[str]:
    """Every manylinux tag the target's glibc accepts, newest first.

    pip does not expand `--platform manylinux_2_36_<arch>` to older tags, so they
    are all listed.
    """
    arch = ARCHES[target.arch]
    major, newest = target.glibc
    tags = [f"manylinux_{major}_{minor}_{target.arch}" for minor in range(newest, arch.glibc_min_minor - 1, -1)]
    tags += [f"{alias}_{target.arch}" for alias, minor in arch.legacy_manylinux if minor <= newest]
    return tags


def marker_environment(target: Target, python_version: str) -> dict[str, str]:
    return {
        "implementation_name": "cpython",
        "implementation_version": f"{python_version}.0",
        "os_name": "posix",
        "platform_machine": target.arch,
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": f"{python_version}.0",
        "python_version": python_version,
        "sys_platform": "linux",
    }


def wheel_dependencies(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        metadata_name = next(
            name for name in archive.namelist() if name.endswith(".dist-info/METADATA")
        )
        headers = HeaderParser().parsestr(archive.read(metadata_name).decode())
    return [Requirement(line) for line in headers.get_all("Requires-Dist") or []]


def applies(requirement: Requirement, environment: dict[str, str], extras: Iterable[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(
        requirement.marker.evaluate({**environment, "extra": extra}) for extra in (*extras, "")
    )


def _merged(requirements: Iterable[Requirement]) -> dict[str, Requirement]:
    """One requirement per project, specifiers and extras combined."""
    merged: dict[str, Requirement] = {}
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        plain = Requirement(str(requirement))
        plain.marker = None
        if name in merged:
            plain.specifier &= merged[name].specifier
            plain.extras |= merged[name].extras
        merged[name] = plain
    return merged


def target_interpreter_options(target: Target, python_version: str) -> list[str]:
    """pip's options that pick wheels for the target's platform and CPython, not the host's."""
    return [
        "--only-binary=:all:",
        *(f"--platform={tag}" for tag in platform_tags(target)),
        f"--python-version={python_version}",
        "--implementation=cp",
        f"--abi=cp{python_version.replace('.', '')}",
    ]


def pip_download_command(
    requirements: Sequence[str], dest: Path, target: Target, python_version: str
) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "--no-deps",
            *target_interpreter_options(target, python_version), f"--dest={dest}", *requirements]


def pip_install_target_command(wheels: Sequence[Path], site_packages: Path, target: Target) -> list[str]:
    """Install a target's wheels into a directory on the host, for an image to copy.

    pip compiles the bytecode with the host's Python; that is valid for the
    target when both run the same Python minor version (bytecode is the same on
    every architecture), and skipped otherwise.
    """
    python_version = target.python_versions[0]
    same_python = f"{sys.version_info[0]}.{sys.version_info[1]}" == python_version
    return [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
            *target_interpreter_options(target, python_version), f"--target={site_packages}",
            *([] if same_python else ["--no-compile"]), *map(str, wheels)]


Runner = Callable[[list[str]], None]


def _run(command: list[str]) -> None:
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def download_closure(
    requirements: Sequence[str],
    dest: Path,
    target: Target,
    *,
    run: Runner = _run,
) -> list[Path]:
    """Download requirements and everything they need on the target into dest."""
    python_version = target.python_versions[0]
    environment = marker_environment(target, python_version)
    dest.mkdir(parents=True, exist_ok=True)
    found: dict[str, tuple[str, Path]] = {}  # project -> (version, wheel)
    followed_extras: dict[str, set[str]] = {}  # project -> extras whose dependencies are in
    wanted: list[Requirement] = [Requirement(line) for line in requirements]
    while True:
        merged = _merged(wanted)
        for name, requirement in merged.items():
            if name in found and not requirement.specifier.contains(found[name][0], prereleases=True):
                raise RuntimeError(
                    f"{target.arch}: {requirement} conflicts with the {found[name][0]} "
                    f"already chosen for {name}"
                )
        to_fetch = [str(r) for name, r in merged.items() if name not in found]
        if to_fetch:
            run(pip_download_command(to_fetch, dest, target, python_version))
            for wheel in dest.glob("*.whl"):
                name, version, _, _ = parse_wheel_filename(wheel.name)
                found.setdefault(name, (str(version), wheel))
        missing = [name for name in merged if name not in found]
        if missing:
            raise RuntimeError(f"{target.arch}: pip downloaded no wheel for {', '.join(missing)}")
        # Follow the dependencies of new projects, and of extras asked for later.
        new_dependencies = []
        for name, requirement in merged.items():
            extras = set(requirement.extras)
            done = followed_extras.get(name)
            if done is not None and extras <= done:
                continue
            followed_extras[name] = extras | (done or set())
            new_dependencies += [
                dependency
                for dependency in wheel_dependencies(found[name][1])
                if applies(dependency, environment, extras)
            ]
        if not new_dependencies:
            return sorted(path for _, path in found.values())
        wanted += new_dependencies


def requirement_lines(path: Path) -> list[str]:
    """A requirements file's requirements (comments and blank lines dropped)."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]

