"""The deterministic benches' shared report: what it writes, and its exit code when the repeats differ."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from benchmarks import determinism


def document(found: list[str], repeats: int = 2) -> dict:
    return {"meta": determinism.meta(time.perf_counter(), repeats, found), "results": [{"x": 1}]}


def drawn(path: Path) -> Path:
    path.write_bytes(b"png")
    return path


def test_the_report_writes_table_json_and_plot_and_says_the_repeats_agreed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert determinism.write_report(tmp_path, "b", document([]), "| t |", drawn, "1 figure") == 0
    assert json.loads((tmp_path / "b.json").read_text())["meta"]["deterministic"] is True
    assert (tmp_path / "b.md").read_text() == "| t |\n"
    assert (tmp_path / "b.png").read_bytes() == b"png"
    printed = capsys.readouterr().out
    assert "deterministic over 2 runs: yes" in printed
    assert f"wrote {tmp_path / 'b.json'} and {tmp_path / 'b.md'}: 1 figure in 0 s" in printed


def test_repeats_that_differ_fail_and_are_listed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    found = ["run 2, k: 3 cycles/iteration, first run 2"]
    assert determinism.write_report(tmp_path, "b", document(found), "| t |", drawn) == 1
    assert json.loads((tmp_path / "b.json").read_text())["meta"]["deterministic"] is False
    assert f"deterministic over 2 runs: NO\n  {found[0]}" in capsys.readouterr().out


def test_one_run_claims_nothing_and_no_matplotlib_still_writes_the_numbers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def missing(path: Path) -> Path:
        raise ImportError("No module named 'matplotlib'")

    assert determinism.write_report(tmp_path, "b", document([], repeats=1), "| t |", missing) == 0
    assert json.loads((tmp_path / "b.json").read_text())["meta"]["deterministic"] is None
    printed = capsys.readouterr().out
    assert "no plot: No module named 'matplotlib'" in printed and "deterministic over" not in printed
    assert not (tmp_path / "b.png").exists()
