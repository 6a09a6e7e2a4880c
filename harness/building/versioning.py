"""The project's version: setuptools-scm's, from the repository's git tags.

A tag v1.2.3 gives 1.2.3; commits after it give a .devN version. Builds run in
a staged copy of the tree, which has no .git, so the harness asks here once and
passes the answer in setuptools-scm's own override variable.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.common.errors import HarnessError
from harness.common.project import PACKAGE

VARIABLE = f"SETUPTOOLS_SCM_PRETEND_VERSION_FOR_{PACKAGE.upper()}"  # setuptools-scm's name for it


def project_version(repo: Path, python: str) -> str:
    """What setuptools-scm (installed for `python`) derives for the repository."""
    result = subprocess.run([python, "-m", "setuptools_scm"], cwd=repo, capture_output=True, text=True)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise HarnessError(
            f"setuptools-scm cannot tell the version of {repo} (a git checkout with its history "
            f"is needed): {result.stderr.strip()[-500:]}"
        )
    return lines[-1]
