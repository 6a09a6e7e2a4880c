from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import coverage, cross, runners
from harness.targets import load_targets


def test_counts_land_under_the_prefix_at_the_objects_path_inside_the_build_dir(tmp_path):
    build_dir = tmp_path / "build" / "coverage" / "x86_64"
    env = coverage.gcov_env("/report/gcda", build_dir)
    gcda = build_dir / "CMakeFiles" / "_ops.dir" / "csrc" / "core" / "packing.cpp.gcda"
    # GCOV_PREFIX_STRIP drops that many leading directories of the absolute path
    kept = Path(*gcda.parts[1 + int(env["GCOV_PREFIX_STRIP"]):])
    assert Path(env["GCOV_PREFIX"]) / kept == Path("/report/gcda/CMakeFiles/_ops.dir/csrc/core/packing.cpp.gcda")


def test_the_build_setting_is_the_cmake_option_that_adds_coverage(repo_root, tmp_path):
    settings = coverage.config_settings(tmp_path)
    assert settings == ["-C", "cmake.define.MOE_XARCH_COVERAGE=ON", "-C", f"build-dir={tmp_path}"]
    cmake = (repo_root / "CMakeLists.txt").read_text()
    assert "option(MOE_XARCH_COVERAGE" in cmake
    assert "target_compile_options(_ops PRIVATE --coverage)" in cmake
    assert "target_link_options(_ops PRIVATE --coverage)" in cmake


def test_the_cross_build_passes_the_settings_to_the_backend(tmp_path):
    argv = cross.pip_wheel_command("py", tmp_path / "tree", tmp_path / "out", ["-C", "x=1"])
    assert argv[argv.index("-C") + 1] == "x=1" and argv[-1] == str(tmp_path / "tree")


def test_every_level_of_the_table_has_its_own_kernel_files(repo_root):
    targets = load_targets(repo_root / "pyproject.toml")
    levels = [("x86_64", level) for level in targets["x86_64"].isa_levels]
    levels += [("aarch64", model.isa) for model in targets["aarch64"].cpu_models]
    declared = coverage.level_sources(repo_root)
    for arch, level in levels:
        files = coverage.own_files(arch, level, declared)
        assert files, (arch, level)
        for path in files:
            assert (repo_root / path).is_file() and coverage.is_kernel_file(path), (arch, level, path)


def test_a_levels_own_files_are_those_the_build_compiles_for_it(repo_root):
    declared = coverage.level_sources(repo_root)
    assert coverage.own_files("x86_64", "avx512", declared) == [
        "csrc/arch/x86/gemm_avx512.cpp", "csrc/arch/x86/gemm_int4_avx512.cpp", "csrc/arch/x86/gemm_mxfp4_avx512.cpp"]
    assert coverage.own_files("x86_64", "generic", declared) == [
        "csrc/generic/gemm_generic.cpp", "csrc/generic/gemm_int4_generic.cpp"]
    assert coverage.own_files("aarch64", "i8mm", declared) == ["csrc/arch/arm/gemm_i8mm.cpp"]
    # every kernel file the build compiles for a level is some level's own
    compiled = {path for path in declared if coverage.is_kernel_file(path)}
    assert compiled == set(declared)


def test_shared_files_are_the_arch_header_and_the_driver():
    files = ["csrc/arch/x86/kernels_x86.h", "csrc/arch/arm/kernels_arm.h", "csrc/core/packing.cpp",
             "csrc/arch/x86/gemm_avx2.cpp"]
    assert coverage.shared_files("aarch64", files) == ["csrc/arch/arm/kernels_arm.h", "csrc/core/packing.cpp"]
    assert not coverage.is_kernel_file("csrc/register.cpp")


def gcovr_json(*files: tuple[str, list[tuple[int, str, int, list[int]]]]) -> dict:
    """(file, [(line, function, count, branch counts)]) as gcovr writes them."""
    return {"files": [
        {"file": name, "lines": [
            {"line_number": n, "function_name": f, "count": c,
             "branches": [{"branchno": i, "count": b} for i, b in enumerate(branches)]}
            for n, f, c, branches in lines]}
        for name, lines in files]}


def test_instantiations_of_a_line_are_merged_and_their_branches_kept_apart():
    data = gcovr_json(
        ("csrc/arch/x86/kernels_x86.h", [(10, "f<1>", 0, [0, 0]), (10, "f<2>", 3, [3, 0]), (11, "f<1>", 0, [])]),
        ("csrc/register.cpp", [(1, "g", 0, [])]),
    )
    files = coverage.parse_gcovr(data)
    assert list(files) == ["csrc/arch/x86/kernels_x86.h"]
    header = files["csrc/arch/x86/kernels_x86.h"]
    assert header.uncovered() == [11]
    assert header.summary() == {"lines": 2, "lines_hit": 1, "branches": 4, "branches_hit": 1}


def write_sources(root: Path) -> None:
    for path, text in {
        "CMakeLists.txt": "moe_level_source(csrc/generic/gemm_generic.cpp generic)\n",
        "csrc/arch/arm/sources.cmake": "moe_level_source(csrc/arch/arm/gemm_neon.cpp neon -march=armv8-a)\n"
                                       "  moe_level_source(csrc/arch/arm/gemm_i8mm.cpp i8mm\n  -march=x)\n",
        "csrc/generic/gemm_generic.cpp": "a\n",
        "csrc/arch/arm/gemm_i8mm.cpp": "a\nk tail\n",
        "csrc/arch/arm/gemm_neon.cpp": "a\nb\n",
        "csrc/core/methods.cpp": "default: return \"unknown\";\nok\nnever\n",
    }.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


def test_gaps_are_own_files_per_level_and_shared_files_over_every_run(tmp_path):
    write_sources(tmp_path)
    fc = coverage.FileCoverage
    runs = {
        # neon's own file fully run; i8mm's run misses line 2 of its own file
        "neon": {"csrc/arch/arm/gemm_neon.cpp": fc({1: 1, 2: 1}), "csrc/arch/arm/gemm_i8mm.cpp": fc({1: 0, 2: 0}),
                 "csrc/core/methods.cpp": fc({1: 0, 2: 1, 3: 0})},
        "i8mm": {"csrc/arch/arm/gemm_i8mm.cpp": fc({1: 4, 2: 0}), "csrc/core/methods.cpp": fc({1: 0, 2: 0, 3: 0})},
    }
    found = coverage.gaps("aarch64", runs, sources=tmp_path)
    assert [(g.level, g.file, g.line, g.text) for g in found] == [
        ("i8mm", "csrc/arch/arm/gemm_i8mm.cpp", 2, "k tail"),
        ("all", "csrc/core/methods.cpp", 1, 'default: return "unknown";'),
        ("all", "csrc/core/methods.cpp", 3, "never"),
    ]
    assert [g.line for g in coverage.unexplained(found)] == [2, 3]
    assert "check_method" in found[1].reason


def test_the_report_has_a_cell_per_file_and_level_and_lists_the_gaps(tmp_path):
    write_sources(tmp_path)
    fc = coverage.FileCoverage
    runs = {"aarch64": {"i8mm": {"csrc/arch/arm/gemm_i8mm.cpp": fc({1: 4, 2: 0}, {(1, "f", 0): 1, (1, "f", 1): 0})}}}
    found = coverage.gaps("aarch64", runs["aarch64"], sources=tmp_path)
    text = coverage.write_report(runs, found, {"x86_64 amx": "this CPU lacks it"}, out=tmp_path / "out")
    assert "csrc/arch/arm/gemm_i8mm.cpp  50% / 50%" in text
    assert "x86_64 amx: not run (this CPU lacks it)" in text
    assert "aarch64 i8mm csrc/arch/arm/gemm_i8mm.cpp:2: k tail  -- NOT EXPLAINED" in text
    saved = json.loads((tmp_path / "out" / "coverage.json").read_text())
    assert saved["files"]["aarch64"]["i8mm"]["csrc/arch/arm/gemm_i8mm.cpp"]["lines_hit"] == 1
    assert saved["gaps"][0]["line"] == 2
    assert "| csrc/arch/arm/gemm_i8mm.cpp | 50% / 50% |" in (tmp_path / "out" / "coverage.md").read_text()


def test_each_run_reads_the_builds_notes_with_the_arch_gcov(tmp_path):
    build_dir, gcda = tmp_path / "build", tmp_path / "run"
    (build_dir / "CMakeFiles" / "o").mkdir(parents=True)
    (build_dir / "CMakeFiles" / "o" / "x.cpp.gcno").write_text("notes")
    coverage.copy_notes(build_dir, gcda)
    assert (gcda / "CMakeFiles" / "o" / "x.cpp.gcno").read_text() == "notes"
    argv = coverage.gcovr_command("gcovr", "aarch64-linux-gnu-gcov", gcda, tmp_path / "o.json", root=tmp_path)
    assert argv[argv.index("--gcov-executable") + 1] == "aarch64-linux-gnu-gcov"
    assert argv[-1] == str(gcda) and argv[argv.index("--json") + 1] == str(tmp_path / "o.json")


def test_a_reason_holds_only_on_the_arch_it_names():
    text = ["x", "    if (level.supported) best = &level;"]
    assert "MOE_XARCH_ISA" in coverage.reasons("x86_64", "csrc/core/dispatch.cpp", text)[2]
    assert coverage.reasons("aarch64", "csrc/core/dispatch.cpp", text) == {}
    assert coverage.reasons("x86_64", "csrc/core/packing.cpp", text) == {}


def test_a_reason_can_hold_for_the_lines_after_the_one_it_matches():
    rule = coverage.Unreachable("a.cpp", r"^if \(tiles\) \{$", "why", lines=3)
    text = ["a", "if (tiles) {", "  b;", "  c;", "}", "if (tiles) {"]
    assert coverage.reasons("x86_64", "a.cpp", text, unreachable=[rule]) == {2: "why", 3: "why", 4: "why", 6: "why", 7: "why", 8: "why"}


def test_the_runs_select_the_tests_the_test_sessions_plan_gives_them(repo_root):
    targets = load_targets(repo_root / "pyproject.toml")
    arm = runners.selections(runners.planned_runs(targets["aarch64"]), coverage.BUILDER)
    assert arm == {"aarch64-a64fx-neon": [], "aarch64-neoverse-n1-dotprod": ["-m", "not level_independent"],
                   "aarch64-max-i8mm": ["-m", "not level_independent"]}
    x86 = runners.selections(runners.planned_runs(targets["x86_64"], ["generic", "avx2"]), coverage.BUILDER)
    assert x86 == {"x86_64-host-generic": [], "x86_64-host-avx2": ["-m", "not forces_levels and not level_independent"]}


def test_a_reason_for_a_level_this_cpu_lacks_lapses_once_the_level_ran():
    rule = coverage.Unreachable("a.cpp", r"^amx$", "no AMX here", missing_levels=("amx",))
    assert coverage.reasons("x86_64", "a.cpp", ["amx"], ["generic"], unreachable=[rule]) == {1: "no AMX here"}
    assert coverage.reasons("x86_64", "a.cpp", ["amx"], ["generic", "amx"], unreachable=[rule]) == {}
    either = coverage.Unreachable("a.cpp", r"^tiles$", "no tile level here", missing_levels=("avx512_bf16", "amx"))
    assert coverage.reasons("x86_64", "a.cpp", ["tiles"], ["avx2"], unreachable=[either]) == {1: "no tile level here"}
    assert coverage.reasons("x86_64", "a.cpp", ["tiles"], ["avx2", "avx512_bf16"], unreachable=[either]) == {}


def test_every_reason_matches_lines_of_the_sources(repo_root):
    """A rule whose text no longer matches (the code moved on) would explain nothing: say so."""
    sources = [p.relative_to(repo_root).as_posix() for p in (repo_root / "csrc").rglob("*")
               if p.is_file() and coverage.is_kernel_file(p.relative_to(repo_root).as_posix())]
    for rule in coverage.UNREACHABLE:
        arch = "aarch64" if rule.arch == "aarch64" else "x86_64"
        matched = [path for path in sources if coverage.reasons(
            arch, path, (repo_root / path).read_text().splitlines(), unreachable=[rule])]
        assert matched, rule


def test_the_emulated_runs_set_the_host_up_first_as_the_test_sessions_do(monkeypatch, tmp_path):
    """On a fresh machine Docker, QEMU's registration and debootstrap come before the build."""
    from harness import containers, host

    (target,) = [t for t in load_targets().values() if t.runner == "qemu"]
    calls = []
    monkeypatch.setattr(host, "ensure_host", lambda needs: calls.append(needs))
    monkeypatch.setattr(containers, "remove_stale", lambda: calls.append("remove_stale") or [])

    def stop(*args, **kwargs):
        raise RuntimeError("stop here")

    monkeypatch.setattr(cross, "ensure_compiler", stop)
    with pytest.raises(RuntimeError, match="stop here"):
        coverage.emulated_runs(target, tmp_path, [], coverage.Outcome())
    assert calls == [host.Needs.of([target]), "remove_stale"]


def test_an_arch_header_is_checked_over_the_runs_of_the_levels_that_include_it(tmp_path):
    """avx512_reduce.h is compiled under the AVX-512 levels alone: on a CPU without them no run
    reaches it, which the report says, rather than calling its lines unreached."""
    write_sources(tmp_path)
    (tmp_path / "csrc/arch/arm/gemm_i8mm.cpp").write_text('#include "arch/arm/mmla.h"\na\n')
    (tmp_path / "csrc/arch/arm/mmla.h").write_text('#include "arch/arm/zip.h"\nx\n')
    (tmp_path / "csrc/arch/arm/zip.h").write_text("y\n")
    fc = coverage.FileCoverage
    assert coverage.included("csrc/arch/arm/gemm_i8mm.cpp", tmp_path) == {"csrc/arch/arm/mmla.h",
                                                                          "csrc/arch/arm/zip.h"}
    neon_only = {"neon": {"csrc/arch/arm/zip.h": fc({1: 0}), "csrc/arch/arm/gemm_neon.cpp": fc({1: 1, 2: 1})}}
    assert coverage.gaps("aarch64", neon_only, sources=tmp_path) == []
    assert coverage.unchecked("aarch64", neon_only, sources=tmp_path) == {
        "aarch64 csrc/arch/arm/mmla.h": "only i8mm include it, and none of them ran",
        "aarch64 csrc/arch/arm/zip.h": "only i8mm include it, and none of them ran"}
    both = {**neon_only, "i8mm": {"csrc/arch/arm/zip.h": fc({1: 0})}}
    assert [(g.level, g.file, g.line) for g in coverage.gaps("aarch64", both, sources=tmp_path)] == [
        ("all", "csrc/arch/arm/zip.h", 1)]
    assert coverage.unchecked("aarch64", both, sources=tmp_path) == {}
