"""The cross toolchain: building for a foreign arch with the host's compiler
instead of under emulation (the cross builder of harness/building/builders.py, the
coverage build and the drift proofs use it).

Debian's g++-<triplet> compiles against the headers and libraries of the target
architecture's torch wheel (the table's torch requirement), configured by
cmake/<triplet>.cmake. The same scikit-build-core build as cibuildwheel's makes
the wheel; `auditwheel repair` then runs in the target's build image, with the
repair command of [tool.cibuildwheel], so the wheel is repaired and tagged
exactly like the emulated build's. Only auditwheel runs under QEMU; every
compile runs natively.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import tomllib
import zipfile
from collections.abc import Sequence
from pathlib import Path

from harness.building import versioning
from harness.common import console
from harness.common.errors import HarnessError, writing
from harness.common.paths import CROSS_CACHE
from harness.plan.targets import Target
from harness.setup import containers, host, wheels


class CrossSetupError(HarnessError):
    """The host cannot cross-compile; the message says what to install."""


def toolchain_file(tree: Path, target: Target) -> Path:
    return tree / "cmake" / f"{target.cross_triplet}.cmake"


def compiler(target: Target) -> str:
    return f"{target.cross_triplet}-g++"


def ensure_compiler(target: Target) -> None:
    """Installs the cross compiler with apt where we can (root); otherwise says how."""
    if shutil.which(compiler(target)) is not None:
        return
    package = f"g++-{target.cross_triplet}"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise CrossSetupError(f"{compiler(target)} is not installed; run as root: apt-get install -y {package}")
    print(f"cross: apt-get install -y {package}", flush=True)
    host.apt_install([package])


def toolchain_identity(target: Target, python: str, backend: Sequence[str]) -> list[str]:
    """The versions that decide what a cross build makes: compiler, torch, build backend.

    Only asks: the compiler must be there already (ensure_compiler installs it).
    """
    if shutil.which(compiler(target)) is None:
        raise CrossSetupError(f"{compiler(target)} is not installed (ensure_compiler installs it)")
    version = subprocess.run([compiler(target), "--version"], check=True, capture_output=True,
                             text=True).stdout.splitlines()[0]
    versions = subprocess.run(
        [python, "-c", "import sys; from importlib.metadata import version; "
                       "print(*(version(name) for name in sys.argv[1:]))", *backend],
        capture_output=True, text=True,
    )
    if versions.returncode != 0:
        raise CrossSetupError(f"{python} cannot run a cross build: pip install {' '.join(backend)}")
    return [version, target.torch, versions.stdout.strip()]


def torch_dir(target: Target, cache: Path = CROSS_CACHE) -> Path:
    """The target's torch package (include/, lib/ and version.py), unpacked once into cache."""
    version = target.torch.split("==", 1)[1]
    unpacked = cache / f"torch-{version}-{target.arch}"
    if (unpacked / "torch" / "version.py").is_file():
        return unpacked / "torch"
    cache.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(unpacked, ignore_errors=True)  # without version.py it is not a torch this code unpacked
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        download = Path(scratch) / "wheel"
        print(f"cross: fetching {target.torch} for {target.arch} (headers and libraries)", flush=True)
        wheels.pip_download([target.torch], download, target)
        (wheel,) = download.glob("torch-*.whl")
        wheels.read_download(wheel, target, project="torch")
        staging = Path(scratch) / "unpacked"
        with writing(cache, f"nox -s build -- --arch {target.arch}"), zipfile.ZipFile(wheel) as archive:
            members = [n for n in archive.namelist()
                       if n.startswith(("torch/include/", "torch/lib/")) or n == "torch/version.py"]
            archive.extractall(staging, members)
        staging.rename(unpacked)  # atomic: a killed download leaves no half-unpacked torch
    return unpacked / "torch"


def cross_env(tree: Path, target: Target, torch: Path) -> dict[str, str]:
    """What turns scikit-build-core's ordinary build into a cross build.

    CMake takes the toolchain from CMAKE_TOOLCHAIN_FILE; CMakeLists.txt and the
    torch pin (build_support/torch_pin.py) both take torch from MOE_TORCH_DIR;
    scikit-build-core tags the wheel for _PYTHON_HOST_PLATFORM.
    """
    return {
        "CMAKE_TOOLCHAIN_FILE": str(toolchain_file(tree, target)),
        "MOE_TORCH_DIR": str(torch),
        "_PYTHON_HOST_PLATFORM": f"linux-{target.arch}",
        "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 1),
    }


def pip_wheel_command(python: str, tree: Path, output: Path, settings: Sequence[str] = ()) -> list[str]:
    """settings: pip's -C options for the build backend (the coverage build's)."""
    return [python, "-m", "pip", "wheel", "--verbose", "--no-build-isolation", "--no-deps",
            *settings, "--wheel-dir", str(output), str(tree)]


def repair_command(pyproject: Path, wheel: str, dest_dir: str) -> list[str]:
    """[tool.cibuildwheel]'s repair-wheel-command, for one wheel: the same repair as cibuildwheel's."""
    template = tomllib.loads(pyproject.read_text())["tool"]["cibuildwheel"]["repair-wheel-command"]
    return [part.format(wheel=wheel, dest_dir=dest_dir) for part in shlex.split(template)]


def build_wheel(target: Target, tree: Path, output: Path, *, python: str, version: str,
                build_image: str) -> None:
    """Cross-compile tree into a raw wheel, then repair it into output in the build image.

    python has the build backend; the compiler is installed (ensure_compiler).
    """
    torch = torch_dir(target)
    raw = output / "raw"
    console.run_streamed(
        pip_wheel_command(python, tree, raw),
        f"build {target.arch} cross",
        env={**cross_env(tree, target, torch), versioning.VARIABLE: version},
    )
    (wheel,) = raw.glob("*.whl")
    name = containers.container_name("repair", target.arch)
    try:
        console.run_streamed(
            ["docker", "run", "--rm", f"--name={name}", *containers.label_args(),
             f"--platform={target.platform}", "--network=none", f"--user={os.getuid()}:{os.getgid()}",
             f"--volume={raw}:/raw:ro", f"--volume={output}:/out", build_image,
             *repair_command(tree / "pyproject.toml", f"/raw/{wheel.name}", "/out")],
            f"repair {target.arch}",
        )
    finally:
        containers.remove(name)
    shutil.rmtree(raw)


def configure(source: Path, build_dir: Path, env: dict[str, str],
              options: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """CMake's configure step of a Release build, as the wheel's (env: cross_env's for a cross build)."""
    if shutil.which("ninja") is None:
        raise CrossSetupError("ninja is not installed; run: pip install ninja")
    return subprocess.run(
        ["cmake", "-S", str(source), "-B", str(build_dir), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", *options],
        env=env, capture_output=True, text=True,
    )


def compile_sources(source: Path, build_dir: Path, target: Target, torch: Path,
                    sources: list[str]) -> subprocess.CompletedProcess[str]:
    """Configures and compiles just the named sources (paths relative to the tree).

    Output is captured, so that callers can show or inspect the compiler's words.
    """
    ensure_compiler(target)
    configured = configure(source, build_dir, {**os.environ, **cross_env(source, target, torch)})
    if configured.returncode != 0:
        return configured
    objects = [f"CMakeFiles/_ops.dir/{path}.o" for path in sources]
    return subprocess.run(["cmake", "--build", str(build_dir), "--target", *objects],
                          capture_output=True, text=True)
