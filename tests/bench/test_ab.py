"""The A/B's own checks, apart from timing (which needs a second build)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("moe_xarch")

from benchmarks import ab  # noqa: E402


def test_builds_at_different_levels_are_refused_by_name() -> None:
    with pytest.raises(SystemExit, match="this build runs at avx2, the baseline at amx"):
        ab.same_level({"this": "avx2", "baseline": "amx"})


def test_builds_at_one_level_pass() -> None:
    assert ab.same_level({"this": "amx", "baseline": "amx"}) is None
