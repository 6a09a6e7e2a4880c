from __future__ import annotations

import subprocess
import sys

import pytest

from harness.building import versioning
from harness.common.errors import HarnessError


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                   check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "moe-xarch"\ndynamic = ["version"]\n'
                                             "[tool.setuptools_scm]\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "pyproject.toml")
    git(tmp_path, "commit", "-q", "-m", "first")
    return tmp_path


def test_a_tagged_commit_has_the_tags_version(repo):
    git(repo, "tag", "v1.2.3")
    assert versioning.project_version(repo, sys.executable) == "1.2.3"


def test_commits_after_a_tag_are_dev_versions_of_the_next(repo):
    git(repo, "tag", "v1.2.3")
    git(repo, "commit", "-q", "--allow-empty", "-m", "second")
    assert versioning.project_version(repo, sys.executable).startswith("1.2.4.dev1+g")


def test_no_git_history_is_a_clear_error(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.setuptools_scm]\n')
    with pytest.raises(HarnessError, match="a git checkout with its history is needed"):
        versioning.project_version(tmp_path, sys.executable)
