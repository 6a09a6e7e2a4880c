"""A wheel's op library audited for PyTorch's stable ABI (torch-abi-audit, from PyPI).

A wheel may require torch>=OLDEST (build_support/torch_pin.py) only if its
library uses nothing of libtorch but the stable ABI, and nothing of that newer
than OLDEST. torch-abi-audit reads both from the library's dynamic symbols, for
the ELF of either architecture, so the publish gate asks it of every wheel.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from build_support import torch_pin
from harness.common.errors import HarnessError
from harness.setup.tools import pinned

TOOL = "torch-abi-audit"


@dataclasses.dataclass(frozen=True)
class Audit:
    library: str  # its path in the wheel
    stable: bool
    min_torch: str | None  # the oldest torch whose stable ABI has every symbol it uses
    unstable: tuple[str, ...]  # libtorch C++ symbols it uses, demangled

    def line(self) -> str:
        verdict = f"stable ABI, min torch {self.min_torch}" if self.stable else f"{len(self.unstable)} unstable symbols"
        return f"{self.library}: {verdict}"

    def problem(self) -> str | None:
        if not self.stable:
            return f"{self.library} uses libtorch's C++ ABI ({', '.join(self.unstable[:3])}, ...)"
        if self.min_torch is None or _release(self.min_torch) > torch_pin.OLDEST:
            return f"{self.library} needs torch {self.min_torch}, but the wheel requires {torch_pin.REQUIREMENT}"
        return None


def _release(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def requirement() -> str:
    """The tool at the harness's pin (harness/requirements-host.txt)."""
    return pinned(TOOL)


def audit_wheel(wheel: Path) -> list[Audit]:
    """Every shared object the wheel carries, audited (the tool runs in this Python)."""
    with tempfile.TemporaryDirectory() as scratch:
        with zipfile.ZipFile(wheel) as archive:
            libraries = [n for n in archive.namelist() if n.endswith(".so") and ".libs/" not in n]
            archive.extractall(scratch, members=libraries)
        audits = []
        for name in libraries:
            done = subprocess.run([sys.executable, "-m", "torch_abi_audit.cli", "--json", str(Path(scratch, name))],
                                  capture_output=True, text=True)
            try:
                report = json.loads(done.stdout)
            except json.JSONDecodeError:
                raise HarnessError(f"{TOOL} could not audit {name} of {wheel.name} (exit {done.returncode}): "
                                   f"{done.stderr.strip()[-400:]}; install it with pip install '{requirement()}'") from None
            for library in report.get("bundled_libs", []) + report.get("extensions", []):
                torch = library.get("torch") or {}
                if torch.get("uses_torch"):
                    audits.append(Audit(name, bool(torch.get("stable")), torch.get("min_torch_version"),
                                        tuple(torch.get("unstable_symbols") or ())))
        return audits
