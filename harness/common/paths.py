"""Where the harness reads and writes, every path in one place.

Everything is under the repository: the sources it builds from, what it makes
(wheelhouse/, reports/) and its working files and caches (build/, .cache/).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # harness/common/paths.py
PYPROJECT = REPO / "pyproject.toml"  # the target table, [tool.cibuildwheel], allowed differences
PACKAGE_SOURCES = REPO / "package"  # the Python package's sources, package/<name>/
DOCKER = REPO / "docker"  # the images' Dockerfiles, scripts and pinned requirements
HOST_REQUIREMENTS = REPO / "harness" / "requirements-host.txt"  # the pins of the host's own tools

WHEELHOUSE = REPO / "wheelhouse"  # one tested-to-be wheel per target, and the sdist
REPORTS = REPO / "reports"  # the runs' reports, the summary and the test records
COVERAGE_REPORTS = REPORTS / "coverage"

WORK = REPO / "build" / "harness"
IMAGE_CONTEXTS = WORK / "images"  # docker build contexts, and their locks
WHEEL_CACHE = WORK / "wheels"  # each builder's last wheel and the hash of its inputs
COVERAGE_BUILD = REPO / "build" / "coverage"
CROSS_CACHE = REPO / ".cache" / "cross"  # the target's torch, unpacked for cross builds
QEMU_PLUGIN_CACHE = REPO / ".cache" / "qemu-plugin"  # the instruction-counting emulator, copied out of its image
