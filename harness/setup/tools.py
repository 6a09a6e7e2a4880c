"""The programs the build sessions run on the host, and their pins (harness/requirements-host.txt).

cibuildwheel drives the builds in containers; the build backend (at the build
image's pins) makes cross builds and tells the version from git.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from harness.common.errors import HarnessError
from harness.common.paths import DOCKER, HOST_REQUIREMENTS
from harness.setup.wheels import requirement_lines


def pinned(name: str, path: Path = HOST_REQUIREMENTS) -> str:
    """The pinned requirement of one of the host's own tools."""
    found = [line for line in requirement_lines(path) if line.split("==")[0] == name]
    if len(found) != 1:
        raise HarnessError(f"{path.name}: {len(found)} pins of {name}, not one")
    return found[0]


CIBUILDWHEEL = pinned("cibuildwheel")
HOST_BACKEND = ("scikit-build-core", "setuptools-scm", "cmake", "ninja")


def backend_requirements(docker_dir: Path = DOCKER) -> list[str]:
    """The build backend, pinned as in the build image: for builds on the host."""
    pinned = requirement_lines(docker_dir / "requirements-build.txt")
    return [line for line in pinned if re.split(r"[=<>!~ ;\[]", line, maxsplit=1)[0] in HOST_BACKEND]


def host_tool_requirements(docker_dir: Path = DOCKER) -> list[str]:
    """What the build sessions install on the host: cibuildwheel and the build backend."""
    return [CIBUILDWHEEL, *backend_requirements(docker_dir)]


@dataclasses.dataclass(frozen=True)
class Tools:
    """The host-side programs builds use (installed by the nox session)."""

    cibuildwheel: list[str]
    python: str  # has the build backend (backend_requirements): cross builds, the version
