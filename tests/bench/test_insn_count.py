"""The instruction-count bench's host side: the plugin's marks, the per-call figures, the repeats' check.

No emulation here: the counts are made up, the parsing and arithmetic are what is tested.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import insn_count

NEON = insn_count.Level("aarch64", "a64fx", "neon")
WORKER = {"isa": "neon", "torch": "2.10.0+cpu", "regions": [
    {"shape": "s", "method": "int8", "tokens": 1, "active_experts": 2, "weight_bytes": 1000, "macs": 4000,
     "marks": [0, 1, 2]},
    {"shape": "s", "method": "bf16", "tokens": 4, "active_experts": 3, "weight_bytes": 3000, "macs": 9000,
     "marks": [3, 4, 5]},
]}
MARKS_TEXT = "mark 0 100\nmark 1 130\nmark 2 2130\nmark 3 5000\nmark 4 5030\nmark 5 14030\ntotal 20000\n"


def test_marks_parsed_with_the_total() -> None:
    marks, total = insn_count.parse_marks(MARKS_TEXT)
    assert marks == {0: 100, 1: 130, 2: 2130, 3: 5000, 4: 5030, 5: 14030}
    assert total == 20000
    assert insn_count.parse_marks("mark 7 1\n") == ({7: 1}, None)  # the process died before its exit


def test_a_line_that_is_not_a_mark_names_its_number() -> None:
    with pytest.raises(ValueError, match=r"line 2: expected 'mark ID COUNT'.*'insns: 5'"):
        insn_count.parse_marks("mark 0 1\ninsns: 5\n")


def test_one_call_is_the_region_less_an_empty_region() -> None:
    assert insn_count.per_call({0: 100, 1: 130, 2: 2130}, [0, 1, 2]) == (1970, 30)
    with pytest.raises(ValueError, match=r"marks \[2\] are missing"):
        insn_count.per_call({0: 100, 1: 130}, [0, 1, 2])


def test_figures_per_call_per_weight_byte_and_per_mac() -> None:
    rows = insn_count.figures(NEON, WORKER, insn_count.parse_marks(MARKS_TEXT)[0])
    assert [(r["method"], r["tokens"], r["instructions"], r["region_overhead"]) for r in rows] == [
        ("int8", 1, 1970, 30), ("bf16", 4, 8970, 30)]
    assert rows[0]["per_weight_byte"] == pytest.approx(1.97)
    assert rows[0]["per_mac"] == pytest.approx(1970 / 4000)
    assert rows[1]["per_weight_byte"] == pytest.approx(2.99)
    assert {r["isa"] for r in rows} == {"neon"} and {r["isa_reported"] for r in rows} == {"neon"}


def test_repeats_that_differ_are_named() -> None:
    rows = insn_count.figures(NEON, WORKER, insn_count.parse_marks(MARKS_TEXT)[0])
    assert insn_count.compare_repeats([rows, [dict(r) for r in rows]]) == []
    changed = [dict(r) for r in rows]
    changed[1]["instructions"] += 35
    assert insn_count.compare_repeats([rows, changed]) == [
        "run 2, aarch64 neon s bf16 4: 9005 instructions, first run 8970"]
    assert insn_count.compare_repeats([rows, rows[:1]]) == ["run 2 measured other configurations"]


def test_table_has_a_row_per_figure() -> None:
    rows = insn_count.figures(NEON, WORKER, insn_count.parse_marks(MARKS_TEXT)[0])
    lines = insn_count.format_table(rows).splitlines()
    assert lines[0].startswith("| arch | cpu | isa | shape | method | M | experts | instructions/call")
    assert len(lines) == 2 + len(rows)
    assert "| 1,970 | 1.970 | 0.4925 | 2.03 |" in lines[2]
    assert all(line.count("|") == 12 for line in lines)


def test_levels_follow_the_target_table() -> None:
    models = (SimpleNamespace(name="a64fx", isa="neon"), SimpleNamespace(name="max", isa="i8mm"))
    emulated = SimpleNamespace(arch="aarch64", runner="qemu", cpu_models=models, isa_levels=())
    assert insn_count.planned_levels(emulated) == [NEON, insn_count.Level("aarch64", "max", "i8mm")]
    native = SimpleNamespace(arch="x86_64", runner="native", cpu_models=(),
                             isa_levels=("generic", "avx2", "avx512", "amx"))
    levels = insn_count.planned_levels(native)
    assert [lv.isa for lv in levels] == ["generic", "avx2"]  # TCG has no AVX-512
    assert levels[1].env() == {"MOE_XARCH_ISA": "avx2"} and NEON.env() == {}


def test_the_run_counts_one_thread_with_fixed_seeds(tmp_path: Path) -> None:
    command = insn_count.docker_command(NEON, platform="linux/arm64", image="img", wheel=tmp_path / "w.whl",
                                        bundle=tmp_path / "b", report_dir=tmp_path / "r",
                                        worker_args=["--tokens", "1"])
    assert "--env=OMP_NUM_THREADS=1" in command and "--env=PYTHONHASHSEED=0" in command
    script = command[command.index("-c") + 1]
    assert "-cpu a64fx -seed 0 -R " in script and "libinsn_regions.so,out=/report/marks.txt" in script
    assert command[-2:] == ["--tokens", "1"]


def test_plugin_image_tag_follows_its_files(tmp_path: Path) -> None:
    (tmp_path / "insn_regions.c").write_text("one")
    first = insn_count.plugin_image_tag("repo", "repo-base:x86_64-1", tmp_path)
    assert first.startswith("repo-qemu-plugin:")
    assert insn_count.plugin_image_tag("repo", "repo-base:x86_64-2", tmp_path) != first
    (tmp_path / "insn_regions.c").write_text("two")
    assert insn_count.plugin_image_tag("repo", "repo-base:x86_64-1", tmp_path) != first


def test_plot_is_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rows = insn_count.figures(NEON, WORKER, insn_count.parse_marks(MARKS_TEXT)[0])
    path = insn_count.plot(rows, tmp_path / "insn.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_host_is_set_up_before_any_image(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh machine has no Docker daemon running: bench-insn starts what the host lacks, as the test sessions do."""
    order = []
    monkeypatch.setattr(insn_count.host, "prepare", lambda targets: order.append(("host", list(targets))))

    def images_stop(target: object, *args: object, **kwargs: object) -> None:
        order.append(("images", target.arch))
        raise SystemExit("no images in a unit test")

    monkeypatch.setattr(insn_count.images, "ensure_images", images_stop)
    with pytest.raises(SystemExit):
        insn_count.main(["--arch", "aarch64"])
    assert [step for step, _ in order] == ["host", "images"]
    assert "aarch64" in [target.arch for target in order[0][1]]
