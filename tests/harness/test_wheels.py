from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from harness.setup.wheels import (
    download_closure,
    pip_download_command,
    pip_install_target_command,
    platform_tags,
    requirement_lines,
)
from tests.harness.wheelfiles import make_wheel


def test_platform_tags_cover_every_older_manylinux(x86, arm):
    tags = platform_tags(arm)
    assert tags[0] == "manylinux_2_36_aarch64" and "manylinux_2_17_aarch64" in tags
    assert "manylinux_2_16_aarch64" not in tags and "manylinux2014_aarch64" in tags
    x86_tags = platform_tags(x86)
    assert "manylinux_2_5_x86_64" in x86_tags and "manylinux1_x86_64" in x86_tags


class FakeIndex:
    """Stands in for `pip download --no-deps`: writes the requested wheels."""

    def __init__(self, packages: dict[str, tuple[str, list[str]]]):
        self.packages = packages

    def __call__(self, command: list[str]) -> None:
        at = next(i for i, arg in enumerate(command) if arg.startswith("--dest="))
        dest = Path(command[at].split("=", 1)[1])
        for requirement in command[at + 1:]:
            name = Requirement(requirement).name
            version, requires = self.packages[name]
            make_wheel(dest, name, version, requires=requires)


TORCH_REQUIRES = [
    "filelock",
    "sympy>=1.13",
    "nvidia_cublas==12.8; platform_system == 'Linux' and platform_machine == 'x86_64'",
    "setuptools; python_version >= '3.12'",
    "optree; extra == 'optree'",
]


def test_dependencies_follow_the_targets_markers_not_the_hosts(tmp_path, arm, x86):
    packages = {
        "torch": ("2.10.0", TORCH_REQUIRES),
        "filelock": ("3.0", []),
        "sympy": ("1.14", ["mpmath"]),
        "mpmath": ("1.3", []),
        "nvidia_cublas": ("12.8", []),
        "pytest": ("9.2.0", []),
    }
    wheels = download_closure(["torch==2.10.0", "pytest==9.2.0"], tmp_path / "arm", arm, run=FakeIndex(packages))
    assert sorted(p.name.split("-")[0] for p in wheels) == ["filelock", "mpmath", "pytest", "sympy", "torch"]
    wheels = download_closure(["torch==2.10.0"], tmp_path / "x86", x86, run=FakeIndex(packages))
    assert "nvidia_cublas" in [p.name.split("-")[0] for p in wheels]


def test_extras_bring_their_dependencies(tmp_path, arm):
    packages = {"torch": ("2.10.0", TORCH_REQUIRES), "filelock": ("3.0", []),
                "sympy": ("1.14", []), "optree": ("0.13", [])}
    wheels = download_closure(["torch[optree]==2.10.0"], tmp_path, arm, run=FakeIndex(packages))
    assert "optree" in [p.name.split("-")[0] for p in wheels]


def test_a_conflicting_requirement_is_an_error(tmp_path, arm):
    packages = {"a": ("1.0", ["b>=2"]), "b": ("1.0", [])}
    with pytest.raises(RuntimeError, match="conflicts with the 1.0 already chosen for b"):
        download_closure(["a", "b==1.0"], tmp_path, arm, run=FakeIndex(packages))


def test_pip_download_command_pins_the_target(tmp_path, arm):
    command = pip_download_command(["torch==2.10.0"], tmp_path, arm, "3.11")
    assert command[1:5] == ["-m", "pip", "download", "--no-deps"]
    assert "--only-binary=:all:" in command and "--python-version=3.11" in command
    assert "--abi=cp311" in command and "--platform=manylinux_2_28_aarch64" in command
    assert command[-1] == "torch==2.10.0"


def test_another_pythons_wheels_install_for_it_uncompiled_and_unchecked_against_the_hosts(tmp_path, x86, monkeypatch):
    """A Debian 13 image's cp313 wheels, installed by the host's Python of another version."""
    trixie = dataclasses.replace(x86, suite="trixie", python_versions=("3.13",))
    monkeypatch.setattr(sys, "version_info", (3, 11, 7))
    command = pip_install_target_command([tmp_path / "networkx-3.7-py3-none-any.whl"], tmp_path / "site", trixie)
    assert "--python-version=3.13" in command and "--abi=cp313" in command
    assert "--no-compile" in command and "--ignore-requires-python" in command
    same = pip_install_target_command([], tmp_path / "site", dataclasses.replace(trixie, python_versions=("3.11",)))
    assert "--no-compile" not in same and "--ignore-requires-python" not in same


def test_requirement_lines_skip_comments(tmp_path):
    path = tmp_path / "requirements.txt"
    path.write_text("# pinned\npytest==9.2.0  # runner\n\npytest-xdist==3.8.0\n")
    assert requirement_lines(path) == ["pytest==9.2.0", "pytest-xdist==3.8.0"]
