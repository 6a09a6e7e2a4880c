"""build_support/torch_pin.py: the one place the oldest supported torch is named."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from build_support import torch_pin

REPO = Path(__file__).resolve().parents[2]


def test_target_version_encodes_the_oldest_torch_as_torch_does() -> None:
    # torch/csrc/stable/version.h: TORCH_VERSION_2_10_0 (((0ULL + 2) << 56) | ((0ULL + 10) << 48))
    major, minor = torch_pin.OLDEST
    assert int(torch_pin.target_version(), 16) == (major << 56) | (minor << 48)
    assert torch_pin.REQUIREMENT == f"torch>={major}.{minor}"


@pytest.mark.parametrize("version", ["2.10.0", "2.13.0+cpu", "2.14.1+cu130", "3.0.0"])
def test_every_build_torch_from_the_oldest_on_gives_the_same_requirement(monkeypatch, version: str) -> None:
    monkeypatch.setattr(torch_pin, "built_against", lambda: version)
    assert torch_pin.torch_requirement() == torch_pin.REQUIREMENT


def test_a_build_torch_older_than_the_oldest_is_refused_by_name(monkeypatch) -> None:
    monkeypatch.setattr(torch_pin, "built_against", lambda: "2.9.1")
    with pytest.raises(RuntimeError, match=r"needs torch >= 2\.10 .* has 2\.9\.1"):
        torch_pin.torch_requirement()


def test_the_cli_prints_the_target_version_and_refuses_anything_else() -> None:
    script = str(REPO / "build_support" / "torch_pin.py")
    printed = subprocess.run([sys.executable, script, "--target-version"], capture_output=True, text=True, check=True)
    assert re.fullmatch(r"0x[0-9a-f]{16}\n", printed.stdout)
    refused = subprocess.run([sys.executable, script], capture_output=True, text=True)
    assert refused.returncode == 2 and "--target-version" in refused.stderr
