"""What the drift proofs share: a scratch copy of the tree to edit."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

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
