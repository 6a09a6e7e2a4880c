"""Shared fixtures for the harness's unit tests (no network; Docker only in test_faults.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.plan.targets import parse_targets

REPO = Path(__file__).resolve().parents[2]


def table(**overrides: dict) -> dict:
    """A pyproject mapping with the two usual targets; overrides replace rows."""
    rows = {
        "x86_64": {
            "platform": "linux/amd64",
            "suite": "bookworm",
            "python-versions": ["3.11"],
            "torch": "torch==2.13.0",
            "runner": "native",
            "isa-levels": ["generic", "avx2", "avx512", "avx512_bf16"],
        },
        "aarch64": {
            "platform": "linux/arm64",
            "suite": "bookworm",
            "python-versions": ["3.11"],
            "torch": "torch==2.10.0",
            "runner": "qemu",
            "cpu-models": {"cortex-a72": "neon", "neoverse-n1": "dotprod", "max": "i8mm"},
        },
    }
    rows.update(overrides)
    return {"tool": {"moe-xarch": {"targets": rows}}}


@pytest.fixture
def repo_root() -> Path:
    return REPO


@pytest.fixture
def make_table():
    """table(**rows): a pyproject mapping; rows given replace the usual ones."""
    return table


@pytest.fixture
def targets():
    return parse_targets(table())


@pytest.fixture
def x86(targets):
    return targets["x86_64"]


@pytest.fixture
def arm(targets):
    return targets["aarch64"]
