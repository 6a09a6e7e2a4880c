"""What a test record says of the environment a run used: written by
run-kernel-suite.sh once the wheel is installed, in the run's own environment (a
test container, or the venv of harness/proving/prove.py). Only the standard library,
torch and the package under test: the harness is not there.

    python environment.py PACKAGE OUT.json
"""

from __future__ import annotations

import importlib
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path


def cpu_description(cpuinfo: str) -> tuple[str, list[str]]:
    """(CPU name, feature flags) from /proc/cpuinfo: x86's model name and flags, or
    Arm's implementer and part and Features."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or " ".join(
        f"{key} {fields[key]}" for key in ("CPU implementer", "CPU part") if key in fields)
    return name or "unknown", sorted(set((fields.get("flags") or fields.get("Features") or "").split()))


def compiler() -> str:
    """The C++ compiler on PATH (what a build from the sdist would use)."""
    if not shutil.which("c++"):
        return "none on PATH"
    result = subprocess.run(["c++", "--version"], capture_output=True, text=True, check=False)
    return (result.stdout.splitlines() or ["c++ (no version)"])[0]


def os_name() -> str:
    try:
        return platform.freedesktop_os_release().get("PRETTY_NAME", "Linux")
    except OSError:  # no os-release file
        return platform.platform()


def describe(package: str) -> dict[str, object]:
    module = importlib.import_module(package)
    import torch

    cpuinfo = Path("/proc/cpuinfo")
    cpu, flags = cpu_description(cpuinfo.read_text() if cpuinfo.exists() else "")
    return {
        "levels": list(module.isa_levels()),
        "supported": list(module.supported_isas()),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "os": os_name(),
        "compiler": compiler(),
        "cpu": cpu,
        "cpu_flags": flags,
    }


if __name__ == "__main__":
    Path(sys.argv[2]).write_text(json.dumps(describe(sys.argv[1]), indent=2) + "\n")
