"""Build-time metadata: the torch releases a wheel loads on.

The op library uses only PyTorch's stable ABI (csrc/core/stable_torch.h) and is
compiled for the oldest release named here (TORCH_TARGET_VERSION), so a wheel
built against any torch from that one on requires torch>=OLDEST. The build
torch is the one installed in the build environment, or, for a cross build, the
unpacked target-architecture package named by MOE_TORCH_DIR (as CMakeLists.txt
uses it).

    python torch_pin.py --target-version   # TORCH_TARGET_VERSION, for CMake
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

OLDEST = (2, 10)  # the first release whose stable ABI has everything the op library uses
REQUIREMENT = f"torch>={OLDEST[0]}.{OLDEST[1]}"


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
    major, minor = (int(part) for part in built_against().split("+")[0].split(".")[:2])
    if (major, minor) < OLDEST:
        raise RuntimeError(f"moe-xarch needs torch >= {OLDEST[0]}.{OLDEST[1]} to build (its stable ABI); "
                           f"the build environment has {built_against()}")
    return REQUIREMENT


def target_version() -> str:
    """OLDEST as torch/csrc/stable/version.h encodes a release: major << 56 | minor << 48."""
    return f"0x{OLDEST[0] << 56 | OLDEST[1] << 48:016x}"


class Provider:
    """scikit-build-core dynamic-metadata provider for the `dependencies` field."""

    def __init__(self) -> None:
        self.state = "wheel"

    def build_state(self, state: str) -> None:
        self.state = state

    def dynamic_metadata(self, settings: dict[str, Any], project: dict[str, Any]) -> dict[str, Any]:
        if self.state == "sdist":
            # Making an sdist needs no torch; the requirement is set when a wheel is built from it.
            return {"dependencies": []}
        return {"dependencies": [torch_requirement()]}

    @staticmethod
    def dynamic_wheel(settings: dict[str, Any]) -> dict[str, bool]:
        # An sdist does not know which torch its wheel will be built against.
        return {"dependencies": True}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="The torch releases a moe-xarch build targets.")
    parser.add_argument("--target-version", action="store_true", required=True,
                        help="print TORCH_TARGET_VERSION of the oldest supported torch, for CMake")
    parser.parse_args(argv)
    print(target_version())


if __name__ == "__main__":
    main(sys.argv[1:])
