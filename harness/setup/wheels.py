"""Download a target's wheels on the host, so that image builds need no network.

`pip download --platform` picks files for the target but evaluates environment
markers for the host: on x86_64 it adds torch's x86_64-only CUDA packages to an
aarch64 download (several GB). So dependencies are followed here, one round of
`pip download --no-deps` at a time, with markers evaluated for the target.
pip itself runs with the host's own configuration (index, find-links, CA), which
is how a locally provided torch build is found.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
import zlib
from collections.abc import Callable, Iterable, Sequence
from email.message import Message
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from harness.common.errors import HarnessError
from harness.plan.targets import ARCHES, Target

def sha256(path: Path) -> str:
    """A file's sha256, read in blocks (a wheel of torch is GBs)."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_wheel(path: Path, remedy: str, *, project: str | None = None, arch: str | None = None) -> Message:
    """Check that a wheel is whole and is what its file name says (of project, for
    arch, when given); return its METADATA headers.

    A truncated, corrupt or foreign file is a HarnessError naming it, what is
    wrong and the remedy (what to do about it).
    """

    def bad(what: str) -> HarnessError:
        return HarnessError(f"{path} {what}: {remedy}")

    try:
        name, version, _, tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename:
        raise bad("is not named as a wheel is") from None
    if project is not None and name != canonicalize_name(project):
        raise bad(f"is a wheel of {name}, not of {project}")
    if arch is not None and any(tag.platform != "any" and not tag.platform.endswith(f"_{arch}") for tag in tags):
        raise bad(f"is not tagged for {arch}")
    try:
        with zipfile.ZipFile(path) as archive:
            if (damaged := archive.testzip()) is not None:
                raise bad(f"is corrupt ({damaged} fails its checksum)")
            dist_info = {top for top in (n.split("/", 1)[0] for n in archive.namelist()) if top.endswith(".dist-info")}
            if len(dist_info) != 1:
                raise bad(f"has {len(dist_info)} .dist-info directories, not one")
            (info,) = dist_info
            metadata = HeaderParser().parsestr(archive.read(f"{info}/METADATA").decode())
            wheel_tags = HeaderParser().parsestr(archive.read(f"{info}/WHEEL").decode()).get_all("Tag") or []
            headers = [archive.open(member).read(20) for member in archive.namelist()
                       if member.endswith(".so") or ".so." in member]
    except (zipfile.BadZipFile, zlib.error, EOFError, KeyError, UnicodeDecodeError, OSError) as error:
        raise bad(f"is not a whole wheel, truncated or damaged ({error})") from None
    if canonicalize_name(metadata.get("Name", "")) != name or not _is_version(metadata.get("Version", ""), version):
        raise bad(f"holds {metadata.get('Name')} {metadata.get('Version')}, not what its name says")
    if not tags <= {Tag(*line.strip().split("-")) for line in wheel_tags if line.count("-") == 2}:
        raise bad(f"is tagged {', '.join(wheel_tags) or 'nothing'} inside, not what its name says")
    machines = {header[18:20] for header in headers if header.startswith(b"\x7fELF")}
    if arch is not None and machines - {ARCHES[arch].elf_machine.to_bytes(2, "little")}:
        raise bad(f"holds shared objects that are not {arch} code")
    return metadata


def _is_version(text: str, version: Version) -> bool:
    try:
        return Version(text) == version
    except InvalidVersion:
        return False


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


def read_download(wheel: Path, target: Target, project: str | None = None) -> Message:
    """read_wheel for a wheel pip downloaded for the target."""
    return read_wheel(
        wheel, f"pip fetched it for {target.arch}: remove the file where pip found it (a local wheel "
        f"directory, or pip's cache: pip cache remove {wheel.name.split('-')[0]}) and run again",
        project=project, arch=target.arch)


def wheel_dependencies(wheel: Path, target: Target) -> list[Requirement]:
    headers = read_download(wheel, target)
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
    every architecture), and skipped otherwise. Another version's wheels were
    chosen for it by download_closure (pip download --python-version); pip install
    checks a wheel file's Requires-Python against the host's own Python, so not then.
    """
    python_version = target.python_versions[0]
    same_python = f"{sys.version_info[0]}.{sys.version_info[1]}" == python_version
    return [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
            *target_interpreter_options(target, python_version), f"--target={site_packages}",
            *([] if same_python else ["--no-compile", "--ignore-requires-python"]), *map(str, wheels)]


Runner = Callable[[list[str]], None]


def _run(command: list[str]) -> None:
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def pip_download(requirements: Sequence[str], dest: Path, target: Target, *, run: Runner = _run) -> None:
    """`pip download --no-deps` of requirements for the target; pip's failure is one
    message pointing at pip's own, which it printed above."""
    try:
        run(pip_download_command(requirements, dest, target, target.python_versions[0]))
    except subprocess.CalledProcessError:
        raise HarnessError(
            f"pip could not download {', '.join(requirements)} for {target.arch} (its error is above): "
            f"fix what it names (a damaged file in a local wheel directory or in pip's cache: "
            f"pip cache remove <project>; the network; the version) and run again"
        ) from None


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
            pip_download(to_fetch, dest, target, run=run)
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
                for dependency in wheel_dependencies(found[name][1], target)
                if applies(dependency, environment, extras)
            ]
        if not new_dependencies:
            return sorted(path for _, path in found.values())
        wanted += new_dependencies


def requirement_lines(path: Path) -> list[str]:
    """A requirements file's requirements (comments and blank lines dropped)."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]

