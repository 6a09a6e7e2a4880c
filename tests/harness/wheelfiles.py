"""Small, well-formed wheel files for the harness's tests, and ways to damage them."""

from __future__ import annotations

import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from harness.plan.targets import ARCHES


def make_wheel(
    directory: Path,
    name: str = "moe_xarch",
    version: str = "0.1.0",
    tag: str = "py3-none-any",
    requires: Iterable[str] = (),
    files: Mapping[str, bytes] | None = None,
) -> Path:
    """A wheel whose METADATA and WHEEL agree with its file name."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-{version}-{tag}.whl"
    dist_info = f"{name}-{version}.dist-info"
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    metadata += [f"Requires-Dist: {line}" for line in requires]
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in (files or {f"{name}/__init__.py": b""}).items():
            archive.writestr(member, data)
        archive.writestr(f"{dist_info}/METADATA", "\n".join(metadata) + "\n")
        archive.writestr(f"{dist_info}/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n")
        archive.writestr(f"{dist_info}/RECORD", "")
    return path


def project_wheel(directory: Path, arch: str, version: str = "0.1.0", so_arch: str | None = None) -> Path:
    """The project's wheel for arch, holding a shared object of so_arch (default: arch)."""
    return make_wheel(directory, version=version, tag=f"py3-none-manylinux_2_28_{arch}",
                      files={"moe_xarch/_C.so": elf_header(so_arch or arch)})


def elf_header(arch: str) -> bytes:
    """The first bytes of a 64-bit little-endian ELF shared object for arch."""
    return b"\x7fELF\x02\x01\x01" + bytes(11) + ARCHES[arch].elf_machine.to_bytes(2, "little") + bytes(44)


def truncate(path: Path, keep: float = 0.5) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path
