"""What the drift proofs share: a scratch copy of the tree to edit."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.drift.support import NativeTree

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def scratch_tree() -> Callable[[Path], Path]:
    """copy(destination): the tracked files of the tree, copied to destination."""

    def copy(destination: Path) -> Path:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True,
                               capture_output=True, text=True).stdout.split("\0")
        for name in filter(None, files):
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if (REPO / name).is_file():
                shutil.copy2(REPO / name, target)
        return destination

    return copy


@pytest.fixture(scope="session")
def native_tree(tmp_path_factory, scratch_tree) -> NativeTree:
    """A scratch copy of the tree, built natively once for every native drift proof:
    each drifts it, rebuilds the file it edited, and restores it."""
    work = tmp_path_factory.mktemp("native-drift")
    native = NativeTree(scratch_tree(work / "tree"), work / "build", work / "site")
    native.build()
    return native
