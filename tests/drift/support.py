"""What the drift proofs share: the edit that drifts a scratch copy of the tree, and
a native build of such a copy to run tests/kernels on."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
# A failed test's ID in pytest's -rf summary.
FAILED = re.compile(r"^FAILED (\S+)", re.MULTILINE)


def this_hosts(cases: Mapping[str, T], what: str) -> T:
    """The case of this host's architecture: a native drift proof must run its drifted build."""
    machine = platform.machine()
    assert machine in cases, f"no {what} for this host's architecture {machine}"
    return cases[machine]


def source_to_drift(tree: Path, source: str, pristine: str) -> str:
    """tree/source's text, which must hold exactly one `pristine`, the text a drift replaces."""
    text = (tree / source).read_text()
    assert text.count(pristine) == 1, (
        f"{source} no longer has exactly one {pristine!r}, the text this drift proof edits: "
        "update the proof's pristine and drifted texts to the source as it is now")
    return text


def drift_source(tree: Path, source: str, pristine: str, drifted: str) -> str:
    """Replaces the one `pristine` text of tree/source with `drifted`; returns the file's text before."""
    text = source_to_drift(tree, source, pristine)
    (tree / source).write_text(text.replace(pristine, drifted))
    return text


@dataclasses.dataclass(frozen=True)
class NativeTree:
    """A scratch copy of the tree with its library built natively (CMake and Ninja,
    against this Python's torch), and a site dir its package is staged into."""

    tree: Path
    build_dir: Path
    site: Path

    def build(self) -> None:
        """The library of the tree as it is now, built or brought up to date (the
        files edited since, and the link)."""
        for tool in ("cmake", "ninja"):
            assert shutil.which(tool), f"{tool} is not installed; run: pip install {tool}"
        configure = ["cmake", "-S", str(self.tree), "-B", str(self.build_dir), "-G", "Ninja",
                     "-DCMAKE_BUILD_TYPE=Release", f"-DPython_EXECUTABLE={sys.executable}"]
        compile_ = ["cmake", "--build", str(self.build_dir), "--parallel", str(os.cpu_count() or 1)]
        for command in (configure, compile_):
            result = subprocess.run(command, capture_output=True, text=True)
            assert result.returncode == 0, result.stdout + result.stderr

    def run_suite(self, level: str, *selection: str, report_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
        """pytest on `selection` of the tree's tests at `level`, with the package staged
        from the tree and its build; with `report_dir`, that run's JUnit report and the
        files the suite writes there, as the harness runs a suite."""
        package = self.site / "moe_xarch"
        shutil.rmtree(package, ignore_errors=True)
        shutil.copytree(self.tree / "package" / "moe_xarch", package)
        shutil.copy2(self.build_dir / "moe_xarch" / "_ops.so", package / "_ops.so")
        env = {name: value for name, value in os.environ.items() if not name.startswith("MOE_XARCH_")}
        env.update(MOE_XARCH_ISA=level, PYTHONPATH=str(self.site))
        report = []
        if report_dir is not None:
            report_dir.mkdir(parents=True)
            env.update(MOE_XARCH_REPORT_DIR=str(report_dir))
            report = ["-o", "junit_family=xunit1", f"--junitxml={report_dir / 'junit.xml'}"]
        return subprocess.run([sys.executable, "-m", "pytest", *selection, "-q", "-rf", "-p", "no:cacheprovider",
                               *report], cwd=self.tree, env=env, capture_output=True, text=True)

    @contextlib.contextmanager
    def drifted(self, source: str, pristine: str, drifted: str) -> Iterator[None]:
        """The tree with the drift, built; restored after (the next build takes it back)."""
        text = drift_source(self.tree, source, pristine, drifted)
        try:
            self.build()
            yield
        finally:
            (self.tree / source).write_text(text)
