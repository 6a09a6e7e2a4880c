"""Compiling the op library for aarch64 with the host's cross compiler.

No emulation: Debian's g++-aarch64-linux-gnu against the headers and libraries
of the aarch64 torch wheel (the target's torch requirement from the table),
configured by cmake/aarch64-linux-gnu.cmake.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from harness import host, wheels
from harness.targets import Target

REPO = Path(__file__).resolve().parent.parent
TOOLCHAINS = {"aarch64": REPO / "cmake" / "aarch64-linux-gnu.cmake"}
COMPILERS = {"aarch64": "aarch64-linux-gnu-g++"}


class CrossSetupError(RuntimeError):
    """The host cannot cross-compile; the message says what to install."""


def ensure_compiler(target: Target) -> None:
    """Installs the cross compiler with apt where we can (root); otherwise says how."""
    compiler = COMPILERS[target.arch]
    if shutil.which(compiler) is not None:
        return
    package = f"g++-{target.arch}-linux-gnu"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise CrossSetupError(f"{compiler} is not installed; run as root: apt-get install -y {package}")
    print(f"cross: apt-get install -y {package}", flush=True)
    host.apt_install([package])


def torch_dir(target: Target, cache: Path) -> Path:
    """The target's torch package (include/ and lib/), unpacked once into cache."""
    version = target.torch.split("==", 1)[1]
    unpacked = cache / f"torch-{version}-{target.arch}"
    if (unpacked / "torch" / "include").is_dir():
        return unpacked / "torch"
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        download = Path(scratch) / "wheel"
        subprocess.run(
            wheels.pip_download_command([target.torch], download, target, target.python_versions[0]),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        (wheel,) = download.glob("torch-*.whl")
        staging = Path(scratch) / "unpacked"
        with zipfile.ZipFile(wheel) as archive:
            members = [n for n in archive.namelist() if n.startswith(("torch/include/", "torch/lib/"))]
            archive.extractall(staging, members)
        staging.rename(unpacked)  # atomic: a killed download leaves no half-unpacked torch
    return unpacked / "torch"


def configure_command(source: Path, build_dir: Path, target: Target, torch: Path) -> list[str]:
    return [
        "cmake", "-S", str(source), "-B", str(build_dir), "-G", "Ninja",
        f"-DCMAKE_TOOLCHAIN_FILE={TOOLCHAINS[target.arch]}",
        f"-DMOE_TORCH_DIR={torch}",
        "-DCMAKE_BUILD_TYPE=Release",
    ]


def compile_sources(source: Path, build_dir: Path, target: Target, torch: Path,
                    sources: list[str]) -> subprocess.CompletedProcess[str]:
    """Configures and compiles just the named sources (paths relative to the tree).

    Output is captured, so that callers can show or inspect the compiler's words.
    """
    ensure_compiler(target)
    if shutil.which("ninja") is None:
        raise CrossSetupError("ninja is not installed; run: pip install ninja")
    configure = subprocess.run(configure_command(source, build_dir, target, torch),
                               capture_output=True, text=True)
    if configure.returncode != 0:
        return configure
    objects = [f"CMakeFiles/_ops.dir/{path}.o" for path in sources]
    return subprocess.run(["cmake", "--build", str(build_dir), "--target", *objects],
                          capture_output=True, text=True)
