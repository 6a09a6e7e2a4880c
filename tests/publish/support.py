"""A real pypiserver on loopback with htpasswd authentication, small real wheels,
and a way to run `python -m harness.publishing.publish` as the publish session does.

Nothing here fakes the index: uploads go over HTTP to pypiserver, which stores
them on disk, and the tests look at what it serves and stores.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import io
import os
import platform
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from build_support import torch_pin  # noqa: E402
from harness.building import cross  # noqa: E402
from harness.plan.ladders import declared_ladders  # noqa: E402
from harness.plan.targets import ARCHES, load_targets  # noqa: E402
from harness.proving import records  # noqa: E402

TARGETS = load_targets(REPO / "pyproject.toml")
LADDERS = declared_ladders()
USER = "uploader"
PASSWORD = "s3cret-publish-pw"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclasses.dataclass
class Index:
    """A running pypiserver: uploads need USER/PASSWORD, reading is open."""

    port: int
    packages: Path
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    @property
    def simple(self) -> str:
        return f"{self.url}simple/"

    def stored(self) -> dict[str, str]:
        """filename -> sha256 of what the server holds on disk."""
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(self.packages.iterdir())}

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def start_index(root: Path, fallback: str | None = None) -> Index:
    """pypiserver; with fallback, it sends projects it has no files of there (its
    default sends them to PyPI)."""
    import warnings

    with warnings.catch_warnings():  # passlib imports the deprecated crypt module
        warnings.simplefilter("ignore", DeprecationWarning)
        from passlib.apache import HtpasswdFile

    packages = root / "packages"
    packages.mkdir(parents=True, exist_ok=True)
    htpasswd = HtpasswdFile(str(root / "htpasswd"), new=True)
    htpasswd.set_password(USER, PASSWORD)
    htpasswd.save()
    port = free_port()
    log = root / "pypiserver.log"
    command = [
        sys.executable, "-m", "pypiserver", "run", "--host", "127.0.0.1", "--port", str(port),
        "--passwords", str(root / "htpasswd"), "--authenticate", "update",
        *(["--fallback-url", fallback] if fallback else ["--disable-fallback"]),
        "--hash-algo", "sha256", str(packages),
    ]
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    index = Index(port, packages, process, log)
    for _ in range(100):
        try:
            urllib.request.urlopen(index.simple, timeout=1).close()
            return index
        except (urllib.error.URLError, OSError):
            if process.poll() is not None:
                break
            time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"pypiserver did not start:\n{log.read_text()}")


@pytest.fixture
def index(tmp_path: Path) -> Iterator[Index]:
    server = start_index(tmp_path / "index")
    yield server
    server.stop()


# --- small real distributions ----------------------------------------------------------




METADATA = """Metadata-Version: 2.1
Name: moe-xarch
Version: {version}
Summary: a small wheel for the publish tests
License: Apache-2.0
Requires-Python: >=3.10
{requires}Description-Content-Type: text/markdown

# moe-xarch test distribution
"""


@functools.cache
def shared_library(arch: str, *torch_symbols: str) -> bytes:
    """A shared object of arch's code that calls the given torch symbols (what
    torch-abi-audit reads): the stable ABI's parallel_for by default. Built with
    the host's compiler for arch (the cross compiler the cross builder uses,
    installed if missing), the same bytes for the same arguments."""
    symbols = torch_symbols or ("torch_parallel_for",)
    triplet = ARCHES[arch].cross_triplet if arch != platform.machine() else ""
    if triplet:
        cross.ensure_compiler(TARGETS[arch])  # a fresh host has none: apt-get install as root, else says how
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch, "library.c")
        source.write_text("".join(f"extern void {s}(void);\n" for s in symbols)
                          + "void moe(void) {" + "".join(f" {s}();" for s in symbols) + " }\n")
        # As small as an ELF library gets (about 2 KB; 0.5 KB deflated): the upload
        # tests cut a request half-way, and a wheel this size keeps the cut
        # before the file's bytes (pypiserver would store a truncated file).
        subprocess.run([f"{triplet}-gcc" if triplet else "cc", "-shared", "-fPIC", "-nostdlib", "-s",
                        "-fno-asynchronous-unwind-tables", "-Wl,--build-id=none", "-Wl,-z,max-page-size=4096",
                        "-Wl,-z,noseparate-code", "-Wl,-z,norelro", "-o", str(source.with_suffix(".so")), str(source)],
                       check=True)
        return source.with_suffix(".so").read_bytes()


def make_wheel(directory: Path, arch: str, version: str = "1.0.0", payload: bytes = b"",
               glibc: str = "2_34", library: bytes | None = None) -> Path:
    """A minimal but valid wheel of the project for arch (pip and twine accept it),
    with a library that uses torch's stable ABI (shared_library) unless given one."""
    name = f"moe_xarch-{version}-py3-none-manylinux_{glibc}_{arch}.whl"
    dist_info = f"moe_xarch-{version}.dist-info"
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "moe_xarch/__init__.py": b"ARCH = %r\n" % arch + payload,
        "moe_xarch/_ops.so": shared_library(arch) if library is None else library,
        f"{dist_info}/METADATA": METADATA.format(
            version=version, requires=f"Requires-Dist: {torch_pin.REQUIREMENT}\n").encode(),
        f"{dist_info}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: false\n"
            f"Tag: py3-none-manylinux_{glibc}_{arch}\n").encode(),
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(directory / name, "w") as archive:
        for path, data in files.items():
            archive.writestr(zipfile.ZipInfo(path, (2020, 1, 1, 0, 0, 0)), data,
                             zipfile.ZIP_DEFLATED if path.endswith(".so") else zipfile.ZIP_STORED)
    return directory / name


SDIST_FILES = ["pyproject.toml", "CMakeLists.txt", "csrc/moe_xarch.h", "csrc/register.cpp",
               "build_support/torch_pin.py", "package/moe_xarch/__init__.py"]


def make_sdist(directory: Path, version: str = "1.0.0") -> Path:
    base = f"moe_xarch-{version}"
    path = directory / f"{base}.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        contents = {name: (REPO / name).read_bytes() for name in SDIST_FILES}
        contents["PKG-INFO"] = METADATA.format(version=version, requires="").encode()
        for name, data in contents.items():
            info = tarfile.TarInfo(f"{base}/{name}")
            info.size = len(data)
            info.mtime = 1577836800
            archive.addfile(info, io.BytesIO(data))
    return path


SUITE_TESTS = ("tests/kernels/test_a.py::test_one", "tests/kernels/test_a.py::test_two")


def passing_runs(arch: str) -> list[dict[str, object]]:
    """A passing run at every level of the arch: each emulated CPU model's, and for
    aarch64 the generic level too, which only a native run selects (proven-elsewhere)."""
    target = TARGETS[arch]
    pairs = ([("host", "generic"), *((m.name, m.isa) for m in target.cpu_models)] if target.runner == "qemu"
             else [("host", level) for level in target.isa_levels])
    return [{"cpu": cpu, "isa": isa, "isa_reported": isa, "passed": 2, "failed": 0, "skipped": 0,
             "result": "passed", "tests": dict.fromkeys(SUITE_TESTS, "passed"), "scopes": {}, "kernels": {}}
            for cpu, isa in pairs]


def sealed_record(wheel: Path, arch: str, runs: list | None = None, levels: tuple[str, ...] | None = None,
                producer: str = "test") -> dict[str, object]:
    """A sealed record of the wheel's bytes, as a test session writes it."""
    return records.seal({
        "wheel": {"file": wheel.name, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()},
        "arch": arch, "builder": "", "producer": producer,
        "levels": list(LADDERS[arch] if levels is None else levels),
        "where": {"runner": TARGETS[arch].runner, "cpu": "Test CPU", "os": "Debian", "compiler": "none",
                  "python": "3.11", "torch": TARGETS[arch].torch, "cpu_flags": []},
        "runs": passing_runs(arch) if runs is None else runs,
    })


def write_manifest(reports: Path, wheels: dict[str, Path], runs: dict[str, list] | None = None) -> None:
    """Each wheel's record in reports/records/, in place of any earlier one."""
    shutil.rmtree(records.records_dir(reports), ignore_errors=True)
    for arch, wheel in wheels.items():
        records.store(sealed_record(wheel, arch, (runs or {}).get(arch)), reports, "the test")


@dataclasses.dataclass
class Release:
    wheelhouse: Path
    reports: Path
    wheels: dict[str, Path]
    sdist: Path

    def files(self) -> list[Path]:
        return [*self.wheels.values(), self.sdist]


@pytest.fixture
def release(tmp_path: Path) -> Release:
    """A small tested release: one wheel per target, an sdist, a passing manifest."""
    wheelhouse = tmp_path / "wheelhouse"
    wheels = {arch: make_wheel(wheelhouse, arch) for arch in TARGETS}
    sdist = make_sdist(wheelhouse)
    write_manifest(tmp_path / "reports", wheels)
    return Release(wheelhouse, tmp_path / "reports", wheels, sdist)


def publish_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TWINE_", "MOE_XARCH_INDEX"))}
    env["TWINE_CONFIG_FILE"] = os.devnull  # never a developer's own .pypirc
    env["PYTHON_KEYRING_BACKEND"] = "keyring.backends.null.Keyring"
    env.update(overrides)
    return env


def run_publish(release: Release, env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python -m harness.publishing.publish`, as the publish session runs it."""
    return subprocess.run(
        [sys.executable, "-m", "harness.publishing.publish", "--wheelhouse", str(release.wheelhouse),
         "--reports", str(release.reports), *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )


def uploader_env(index: Index, password: str = PASSWORD) -> dict[str, str]:
    return publish_env(TWINE_REPOSITORY_URL=index.url, TWINE_USERNAME=USER, TWINE_PASSWORD=password)


# --- a network fault between the uploader and the index ----------------------------------


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class CuttingProxy:
    """A TCP proxy in front of the index that passes the first `whole` uploads and
    cuts the next one's connection half-way through its request body."""

    def __init__(self, upstream_port: int, whole: int) -> None:
        self.upstream = upstream_port
        self.uploads_left = whole
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.cut = 0
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        with client, socket.create_connection(("127.0.0.1", self.upstream)) as upstream:
            first = client.recv(65536)
            if first.startswith(b"POST"):
                if self.uploads_left > 0:
                    self.uploads_left -= 1
                else:  # forward part of the request, then drop both sides
                    upstream.sendall(first[: len(first) // 2])
                    self.cut += 1
                    return
            upstream.sendall(first)
            back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
            back.start()
            _pump(client, upstream)
            back.join()

    def close(self) -> None:
        self.server.close()


def copy_release(release: Release, dest: Path) -> Release:
    shutil.copytree(release.wheelhouse, dest / "wheelhouse")
    shutil.copytree(release.reports, dest / "reports")
    return Release(dest / "wheelhouse", dest / "reports",
                   {a: dest / "wheelhouse" / w.name for a, w in release.wheels.items()},
                   dest / "wheelhouse" / release.sdist.name)
