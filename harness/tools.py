"""The programs the build sessions run on the host, and their pins.

cibuildwheel drives the builds in containers; the build backend (at the build
image's pins) makes cross builds and tells the version from git.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from harness.paths import DOCKER
from harness.wheels import requirement_lines

CIBUILDWHEEL = "cibuildwheel==4.3.5"
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
