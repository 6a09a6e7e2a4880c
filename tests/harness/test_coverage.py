from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.building import cross
from harness.plan import runners
from harness.plan.targets import load_targets
from harness.running import coverage


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
    assert "target_compile_options(_ops PRIVATE --coverage -fprofile-update=atomic)" in cmake
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
        "csrc/generic/levels.def": 'MOE_LEVEL(generic, true, "", "gemm_generic.cpp")\n',
        "csrc/arch/arm/levels.def": '// a comment\nMOE_LEVEL(neon, f.asimd, "-march=armv8-a", "gemm_neon.cpp")\n'
                                    'MOE_LEVEL(i8mm, f.i8mm && f.bf16, "-march=x", "gemm_i8mm.cpp")\n',
        "csrc/arch/x86/levels.def": "",
        "csrc/generic/gemm_generic.cpp": "a\n",
        "csrc/arch/arm/gemm_i8mm.cpp": "a\nk tail\n",
        "csrc/arch/arm/gemm_neon.cpp": "a\nb\n",
        "csrc/core/methods.cpp": "// coverage: unreachable: method_name is asked only of a method check_method\n"
                                 "//   accepted (0 to 4)\ndefault: return \"unknown\";\nok\nnever\n",
    }.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


def test_gaps_are_own_files_per_level_and_shared_files_over_every_run(tmp_path):
    write_sources(tmp_path)
    fc = coverage.FileCoverage
    runs = {
        # neon's own file fully run; i8mm's run misses line 2 of its own file
        "neon": {"csrc/arch/arm/gemm_neon.cpp": fc({1: 1, 2: 1}), "csrc/arch/arm/gemm_i8mm.cpp": fc({1: 0, 2: 0}),
                 "csrc/core/methods.cpp": fc({3: 0, 4: 1, 5: 0})},
        "i8mm": {"csrc/arch/arm/gemm_i8mm.cpp": fc({1: 4, 2: 0}), "csrc/core/methods.cpp": fc({3: 0, 4: 0, 5: 0})},
    }
    found = coverage.gaps("aarch64", runs, sources=tmp_path)
    assert [(g.level, g.file, g.line, g.text) for g in found] == [
        ("i8mm", "csrc/arch/arm/gemm_i8mm.cpp", 2, "k tail"),
        ("all", "csrc/core/methods.cpp", 3, 'default: return "unknown";'),
        ("all", "csrc/core/methods.cpp", 5, "never"),
    ]
    assert [g.line for g in coverage.unexplained(found)] == [2, 5]
    assert found[1].reason == "method_name is asked only of a method check_method accepted (0 to 4)"


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
    assert argv[argv.index("--gcov-suspicious-hits-threshold") + 1] == "0"


LEVELS = {"x86_64": ["generic", "avx2", "avx512_bf16", "amx"], "aarch64": ["neon", "i8mm"]}


def marked(tmp_path: Path, files: dict[str, str]) -> dict[str, dict[int, list[coverage.Reason]]]:
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    return coverage.read_markers(tmp_path, LEVELS)


def reasons_of(tmp_path: Path, text: str, arch: str = "x86_64", ran: tuple[str, ...] = ()) -> dict[int, str]:
    markers = marked(tmp_path, {"csrc/a.cpp": text})
    return coverage.reasons(arch, text.splitlines(), ran, markers.get("csrc/a.cpp"))


def test_a_marker_explains_the_line_after_it_on_the_arch_it_names(tmp_path):
    text = ("x\n"
            "// coverage: unreachable on x86_64: the default level: every x86 run\n"
            "//   forces its level\n"
            "if (level.supported) best = &level;\n"
            "y\n")
    assert reasons_of(tmp_path, text) == {4: "the default level: every x86 run forces its level"}
    assert reasons_of(tmp_path, text, "aarch64") == {}


def test_a_closing_brace_is_the_scopes_exception_cleanup_in_every_file(tmp_path):
    assert reasons_of(tmp_path, "f() {\n  x;\n  }\n}  // namespace\n") == {3: coverage.EXCEPTION_CLEANUP}


def test_a_begin_and_end_explain_every_line_between_and_blocks_nest(tmp_path):
    text = ("a\n"
            "// coverage: begin unreachable: outer\n"
            "f() {\n"
            "  x;\n"
            "  // coverage: begin unreachable on x86_64: inner\n"
            "  y;\n"
            "  // coverage: end\n"
            "}\n"
            "// coverage: end\n"
            "b\n")
    assert reasons_of(tmp_path, text) == {3: "outer", 4: "outer", 5: "outer", 6: "outer", 7: "outer",
                                          8: coverage.EXCEPTION_CLEANUP}
    markers = marked(tmp_path, {"csrc/a.cpp": text})["csrc/a.cpp"]
    assert [r.text for r in markers[6]] == ["outer", "inner"]


def test_a_named_reason_is_given_once_and_used_with_its_arch_and_levels(tmp_path):
    files = {"csrc/a.cpp": "// coverage: unreachable on x86_64 unless avx512_bf16 or amx ran (tiles): no tiles here\n"
                           "tiles();\n",
             "csrc/b.h": "// coverage: begin unreachable (tiles)\n"
                         "// coverage: begin unreachable on aarch64: x86 only\n"
                         "line();\n"
                         "// coverage: end\n"}
    markers = marked(tmp_path, files)
    b = markers["csrc/b.h"]
    assert [(r.text, r.arch, r.unless_ran) for r in b[3]] == [
        ("no tiles here", "x86_64", ("avx512_bf16", "amx")), ("x86 only", "aarch64", ())]
    assert coverage.reasons("x86_64", ["", "", "line();"], ["avx2"], b) == {3: "no tiles here"}
    assert coverage.reasons("x86_64", ["", "", "line();"], ["avx2", "amx"], b) == {}
    assert coverage.reasons("aarch64", ["", "", "line();"], ["i8mm"], b) == {3: "x86 only"}


def test_a_reason_for_a_level_this_cpu_lacks_lapses_once_the_level_ran(tmp_path):
    text = "// coverage: unreachable on x86_64 unless amx ran: no AMX here\namx();\n"
    assert reasons_of(tmp_path, text, ran=("generic",)) == {2: "no AMX here"}
    assert reasons_of(tmp_path, text, ran=("generic", "amx")) == {}
    either = "// coverage: unreachable unless avx512_bf16 or amx ran: no tile level here\ntiles();\n"
    assert reasons_of(tmp_path, either, ran=("avx2",)) == {2: "no tile level here"}
    assert reasons_of(tmp_path, either, ran=("avx2", "avx512_bf16")) == {}


@pytest.mark.parametrize(("text", "line", "what"), [
    ("a\n// coverage: unreachable\nb\n", 2, "gives its reason"),
    ("a\n// coverage: unrechable: why\nb\n", 2, "malformed"),
    ("a\n//coverage: unreachable: why\nb\n", 2, "malformed"),
    ("a\n// coverage: unreachable on riscv: why\nb\n", 2, "unknown arch 'riscv'"),
    ("a\n// coverage: unreachable on x86_64 unless avx9 ran: why\nb\n", 2, "unknown level 'avx9'"),
    ("a\n// coverage: unreachable on aarch64 unless amx ran: why\nb\n", 2, "unknown level 'amx'"),
    ("a\nb;  // coverage: unreachable: why\n", 2, "on a line of its own"),
    # the line it explained is gone: the marker now stands before a blank line, a lone brace, or the file's end
    ("f() {\n  // coverage: unreachable: why\n\n  x;\n", 2, "covers no line"),
    ("f() {\n  // coverage: unreachable: why\n}\n", 2, "lone closing brace"),
    ("a\n// coverage: unreachable: why\n", 2, "the file ends"),
    ("a\n// coverage: begin unreachable: why\nb\n", 2, "without its `end`"),
    ("a\n// coverage: begin unreachable: why\n// coverage: end\nb\n", 3, "has no line"),
    ("a\n// coverage: end\n", 2, "without a `begin`"),
    ("// coverage: begin unreachable: a\n// coverage: unreachable: b\nc\n// coverage: end\n", 2, "all `begin`s"),
    ("// coverage: unreachable (n)\n// and more\nc\n", 2, "without its own reason"),
    ("a\n// coverage: unreachable (nowhere)\nb\n", 2, "no marker gives the reason (nowhere)"),
    ("// coverage: unreachable (n): one\na\n// coverage: unreachable (n): two\nb\n", 3, "given again"),
])
def test_a_malformed_or_stale_marker_is_an_error_naming_file_and_line(tmp_path, text, line, what):
    with pytest.raises(coverage.MarkerError, match=rf"^csrc/core/x\.cpp:{line}: .*{re.escape(what)}"):
        marked(tmp_path, {"csrc/core/x.cpp": text})


def test_the_sources_markers_parse_and_explain_the_lines_no_run_here_reaches(repo_root):
    markers = coverage.read_markers(repo_root)
    for path, lines in markers.items():
        assert coverage.is_kernel_file(path), path
        text = (repo_root / path).read_text().splitlines()
        code = [n for n in lines if text[n - 1].strip() and not text[n - 1].strip().startswith("//")]
        assert code, path
    dispatch = (repo_root / "csrc/core/dispatch.cpp").read_text().splitlines()
    default = [n for n, line in enumerate(dispatch, 1) if "if (level.supported) best = &level;" in line]
    why = coverage.reasons("x86_64", dispatch, ["avx2"], markers["csrc/core/dispatch.cpp"])
    assert [why.get(n) for n in default] == [
        "the default (best) level: every x86 run forces its level with MOE_XARCH_ISA"]
    assert not coverage.reasons("aarch64", dispatch, ["neon"], markers["csrc/core/dispatch.cpp"]).get(default[0])


def test_the_runs_select_the_tests_the_test_sessions_plan_gives_them(repo_root):
    targets = load_targets(repo_root / "pyproject.toml")
    arm = runners.selections(runners.planned_runs(targets["aarch64"]), coverage.BUILDER)
    assert arm == {"aarch64-a64fx-neon": [], "aarch64-neoverse-n1-dotprod": ["-m", "not level_independent"],
                   "aarch64-max-i8mm": ["-m", "not level_independent"]}
    x86 = runners.selections(runners.planned_runs(targets["x86_64"], ["generic", "avx2"]), coverage.BUILDER)
    assert x86 == {"x86_64-host-generic": [], "x86_64-host-avx2": ["-m", "not forces_levels and not level_independent"]}


def test_the_emulated_runs_set_the_host_up_first_as_the_test_sessions_do(monkeypatch, tmp_path):
    """On a fresh machine Docker, QEMU's registration and debootstrap come before the build."""
    from harness.setup import containers, host

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
