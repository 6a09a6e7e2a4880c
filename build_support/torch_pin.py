"""Build-time metadata: pin the wheel to the torch release it is built against.

The extension links libtorch's C++ API, whose ABI changes with every release,
so a wheel built against torch X.Y.Z requires torch==X.Y.*. That torch is the
one installed in the build environment, or, for a cross build, the unpacked
target-architecture package named by MOE_TORCH_DIR (as CMakeLists.txt uses it).
"""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path
from typing import Any


def built_against() -> str:
    """The version of the torch this build compiles against."""
    cross_torch = os.environ.get("MOE_TORCH_DIR")
    if cross_torch:
        version_file = Path(cross_torch) / "version.py"
        match = re.search(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", version_file.read_text(), re.M)
        if match is None:
            raise RuntimeError(f"MOE_TORCH_DIR: {version_file} does not give __version__")
        return match.group(1)
    # The installed package's metadata, not an import of torch: under QEMU (an
    # emulated build) that import alone takes 10-20 s.
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError as exc:
        raise RuntimeError(
            "moe-xarch builds against the installed torch, but no torch is installed "
            "here. Install torch first, then: pip install --no-build-isolation ."
        ) from exc


def torch_requirement() -> str:
    major, minor = built_against().split("+")[0].split(".")[:2]
    return f"torch=={major}.{minor}.*"


class Provider:
    """scikit-build-core dynamic-metadata provider for the `dependencies` field."""

    def __init__(self) -> None:
        self.state = "wheel"

    def build_state(self, state: str) -> None:
        self.state = state

    def dynamic_metadata(self, settings: dict[str, Any], project: dict[str, Any]) -> dict[str, Any]:
        if self.state == "sdist":
            # Making an sdist needs no torch; the pin is set when a wheel is built from it.
            return {"dependencies": []}
        return {"dependencies": [torch_requirement()]}

    @staticmethod
    def dynamic_wheel(settings: dict[str, Any]) -> dict[str, bool]:
        # An sdist does not know which torch its wheel will be built against.
        return {"dependencies": True}
