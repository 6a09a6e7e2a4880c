from __future__ import annotations

import re

import pytest

from harness.plan.targets import TableError, parse_targets
from harness.plan.verdict import (
    ABSENT,
    EVERY_RUN,
    PER_ARCH,
    PER_CPU,
    Allowed,
    Outcome,
    RunId,
    compare,
    designated,
    parse_allowed,
    read_junit,
)

# What pytest 9 writes with -o junit_family=xunit1 (checked against real runs).
JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest"
 errors="1" failures="2" skipped="2" tests="7" time="0.1">
<testcase classname="tests.kernels.test_a" name="test_ok[bf16]" file="tests/kernels/test_a.py" line="1" time="0"/>
<testcase classname="tests.kernels.test_a" name="test_skip" file="tests/kernels/test_a.py" line="3" time="0">
 <skipped type="pytest.skip" message="aarch64-only skip">/src/tests/kernels/test_a.py:4: aarch64-only skip</skipped>
</testcase>
<testcase classname="tests.kernels.test_a" name="test_xfail" file="tests/kernels/test_a.py" line="5" time="0">
 <skipped type="pytest.xfail" message="known bad"/></testcase>
<testcase classname="tests.kernels.test_a" name="test_xpass" file="tests/kernels/test_a.py" line="7" time="0">
 <failure message="[XPASS(strict)] known bad">[XPASS(strict)] known bad</failure></testcase>
<testcase classname="tests.kernels.test_a.TestK" name="test_m[a.b]" file="tests/kernels/test_a.py" line="9" time="0">
 <failure message="AssertionError: numbers differ&#10;  second line">long text</failure></testcase>
<testcase classname="tests.kernels.test_a" name="test_err" file="tests/kernels/test_a.py" line="11" time="0">
 <error message="failed on setup with &quot;RuntimeError: fixture broke&quot;">trace</error></testcase>
<testcase classname="tests.kernels.test_a" name="test_teardown" file="tests/kernels/test_a.py" line="13" time="0"/>
<testcase classname="tests.kernels.test_a" name="test_teardown" file="tests/kernels/test_a.py" line="13" time="0">
 <error message="failed on teardown with &quot;OSError&quot;">trace</error></testcase>
</testsuite></testsuites>"""


def test_read_junit_classifies_every_outcome_with_its_reason(tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    prefix = "tests/kernels/test_a.py::"
    assert read_junit(path) == {
        prefix + "test_ok[bf16]": Outcome("passed"),
        prefix + "test_skip": Outcome("skipped", "aarch64-only skip"),
        prefix + "test_xfail": Outcome("xfailed", "known bad"),
        prefix + "test_xpass": Outcome("xpassed", "[XPASS(strict)] known bad"),
        prefix + "TestK::test_m[a.b]": Outcome("failed", "AssertionError: numbers differ"),
        prefix + "test_err": Outcome("error", 'failed on setup with "RuntimeError: fixture broke"'),
        prefix + "test_teardown": Outcome("error", 'failed on teardown with "OSError"'),
    }


X86_AVX2 = RunId("x86_64", "cibuildwheel", "host", "avx2")
X86_AVX512 = RunId("x86_64", "cibuildwheel", "host", "avx512")
A64FX = RunId("aarch64", "cross", "a64fx", "neon")
N1 = RunId("aarch64", "cross", "neoverse-n1", "dotprod")
PASSED = Outcome("passed")
SKIPPED = Outcome("skipped", "aarch64-only skip")


def test_a_test_skipped_on_one_run_only_is_a_drift_naming_both_runs():
    verdict = compare({X86_AVX2: {"t::a": PASSED, "t::b": PASSED}, A64FX: {"t::a": SKIPPED, "t::b": PASSED}})
    assert not verdict.ok and verdict.tests == 2
    (drift,) = verdict.drifts
    assert str(drift) == ("t::a: passed on x86_64 (cibuildwheel) CPU host, ISA avx2, "
                          "skipped on aarch64 (cross) CPU a64fx, ISA neon: aarch64-only skip")


@pytest.mark.parametrize("other", [Outcome("xfailed", "r"), Outcome("error", "r"), ABSENT, SKIPPED])
def test_passed_against_anything_but_passed_or_failed_is_a_drift(other):
    outcomes = {X86_AVX2: {"t::a": PASSED}, N1: {"t::a": other} if other is not ABSENT else {}}
    assert [d.outcome for d in compare(outcomes).drifts] == [other]


def test_a_failure_is_its_runs_failure_not_a_drift():
    assert compare({X86_AVX2: {"t::a": PASSED}, A64FX: {"t::a": Outcome("failed", "x")}}).ok


def test_the_same_outcome_everywhere_is_no_drift_and_a_test_missing_somewhere_is():
    assert compare({X86_AVX2: {"t::a": SKIPPED}, A64FX: {"t::a": SKIPPED}}).ok
    (drift,) = compare({X86_AVX2: {"t::a": SKIPPED}, A64FX: {}}).drifts
    assert drift.run == A64FX and drift.outcome == ABSENT and drift.reference == X86_AVX2


def allowance(**overrides):
    fields = {"test": "t::a*", "arch": "aarch64", "outcome": "skipped", "reason": "x86-only instruction"}
    return Allowed(**{**fields, **overrides})


def test_an_allowance_excuses_its_runs_only_when_the_test_passes_on_none_of_them():
    skipped_on_arm = {X86_AVX2: {"t::a1": PASSED}, A64FX: {"t::a1": SKIPPED}, N1: {"t::a1": SKIPPED}}
    verdict = compare(skipped_on_arm, [allowance()])
    assert verdict.ok and [(run, test) for _, run, test in verdict.excused] == [(A64FX, "t::a1"), (N1, "t::a1")]
    # the arch's own runs disagree: not excused
    passed_on_n1 = {**skipped_on_arm, N1: {"t::a1": PASSED}}
    assert [d.run for d in compare(passed_on_n1, [allowance()]).drifts] == [A64FX]
    assert compare(passed_on_n1, [allowance(cpu_models=("a64fx",))]).ok
    # another outcome, another test, another arch: not excused
    assert not compare(skipped_on_arm, [allowance(outcome="xfailed")]).ok
    assert not compare(skipped_on_arm, [allowance(test="t::b")]).ok
    assert not compare(skipped_on_arm, [allowance(arch="x86_64")]).ok


def test_x86_levels_never_differ_even_with_an_allowance_for_the_arch():
    levels = {X86_AVX2: {"t::a": PASSED}, X86_AVX512: {"t::a": SKIPPED}}
    (drift,) = compare(levels, [allowance(arch="x86_64")]).drifts
    assert (drift.reference, drift.run) == (X86_AVX2, X86_AVX512)


def table(targets_table, *rows):
    data = targets_table()
    data["tool"]["moe-xarch"]["allowed-differences"] = list(rows)
    return data


def test_allowed_differences_parse_into_frozen_entries(make_table):
    data = table(make_table, {"test": "tests/kernels/t.py::t", "arch": "aarch64", "outcome": "absent",
                              "reason": "why", "cpu-models": ["max"]})
    (entry,) = parse_allowed(data, parse_targets(data))
    assert entry == Allowed("tests/kernels/t.py::t", "aarch64", "absent", "why", ("max",))
    assert parse_allowed(make_table(), parse_targets(make_table())) == ()


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"tset": "x"}, "unknown key 'tset' (did you mean 'test'?)"),
        ({"reason": 3}, "reason must be a str, not int"),
        ({"outcome": "failed"}, "unknown outcome 'failed'"),
        ({"arch": "riscv64"}, "unknown architecture 'riscv64'"),
        ({"reason": " "}, "reason must say why"),
        ({"arch": "x86_64", "cpu-models": ["host"]}, "cpu-models apply to an emulated target; x86_64 runs natively"),
        ({"cpu-models": ["a64fxx"]}, "unknown CPU model 'a64fxx'"),
    ],
)
def test_allowed_differences_reject_what_they_cannot_mean(make_table, row, message):
    good = {"test": "t", "arch": "aarch64", "outcome": "skipped", "reason": "why"}
    data = table(make_table, {**good, **row})
    with pytest.raises(TableError, match=r"allowed-differences\]\] #1: .*" + re.escape(message)):
        parse_allowed(data, parse_targets(data))
    missing = table(make_table, {"test": "t"})
    with pytest.raises(TableError, match="missing arch, outcome, reason"):
        parse_allowed(missing, parse_targets(missing))


def test_the_projects_table_parses(repo_root):
    from harness.plan.targets import load_targets
    from harness.plan.verdict import load_allowed

    load_allowed(repo_root / "pyproject.toml", load_targets(repo_root / "pyproject.toml"))


# --- the parts of the suite: tests once per CPU model, once per architecture -----------

X86_GENERIC = RunId("x86_64", "cibuildwheel", "host", "generic")
MAX = RunId("aarch64", "cross", "max", "i8mm")
ONCE = Outcome("passed", scope=PER_ARCH)
PER_MODEL = Outcome("passed", scope=PER_CPU)


def split_runs(**changes):
    """A matrix as the harness runs it: every test of every run on every run, the
    per-CPU test on each CPU model's first run, the per-arch one on each arch's first."""
    every = {"t::kernel": PASSED}
    runs = {
        X86_GENERIC: {**every, "t::forces": PER_MODEL, "t::reference": ONCE},
        X86_AVX2: dict(every),
        A64FX: {**every, "t::forces": PER_MODEL, "t::reference": ONCE},
        N1: {**every, "t::forces": PER_MODEL},
        MAX: {**every, "t::forces": PER_MODEL},
    }
    for run, outcomes in changes.items():
        runs[globals()[run]] = outcomes(runs[globals()[run]])
    return runs


def without(test):
    return lambda outcomes: {t: o for t, o in outcomes.items() if t != test}


def test_each_run_designates_its_parts_in_plan_order():
    other_builder = RunId("aarch64", "cibuildwheel", "a64fx", "neon")
    assert designated([X86_GENERIC, X86_AVX2, A64FX, N1, other_builder]) == {
        X86_GENERIC: (EVERY_RUN, PER_CPU, PER_ARCH), X86_AVX2: (EVERY_RUN,),
        A64FX: (EVERY_RUN, PER_CPU, PER_ARCH), N1: (EVERY_RUN, PER_CPU),
        other_builder: (EVERY_RUN, PER_CPU, PER_ARCH),  # each builder's wheel is tested whole
    }


def test_a_matrix_split_as_planned_is_the_same_everywhere():
    verdict = compare(split_runs())
    assert verdict.ok and verdict.tests == 3


def test_a_kernel_test_missing_on_one_cpu_model_names_the_test_and_the_run():
    (drift,) = compare(split_runs(N1=without("t::kernel"))).drifts
    assert (drift.test, drift.run, drift.outcome) == ("t::kernel", N1, ABSENT)
    assert str(drift).startswith("t::kernel: passed on x86_64 (cibuildwheel) CPU host, ISA generic, "
                                 "absent on aarch64 (cross) CPU neoverse-n1, ISA dotprod")


def test_a_per_cpu_test_missing_on_one_cpu_model_is_a_drift():
    (drift,) = compare(split_runs(MAX=without("t::forces"))).drifts
    assert (drift.test, drift.run) == ("t::forces", MAX)
    assert str(drift).startswith("t::forces (once per CPU model): passed on")


@pytest.mark.parametrize("run", ["A64FX", "X86_GENERIC"])
def test_a_level_independent_test_missing_on_its_archs_designated_run_is_a_drift(run):
    (drift,) = compare(split_runs(**{run: without("t::reference")})).drifts
    assert (drift.test, drift.run, drift.outcome) == ("t::reference", globals()[run], ABSENT)
    assert "t::reference (once per architecture): passed on " in str(drift)


def test_a_level_independent_test_skipped_on_its_designated_run_is_a_drift():
    (drift,) = compare(split_runs(A64FX=lambda o: {**o, "t::reference": Outcome("skipped", "why", PER_ARCH)})).drifts
    assert (drift.run, drift.outcome.outcome) == (A64FX, "skipped")


def test_a_once_only_test_that_ran_on_another_run_too_is_a_drift_naming_that_run():
    (drift,) = compare(split_runs(N1=lambda o: {**o, "t::reference": ONCE})).drifts
    assert drift.run == N1
    assert str(drift) == ("t::reference (once per architecture): ran on aarch64 (cross) CPU neoverse-n1, ISA dotprod, "
                          "which does not run once per architecture tests (its designated run does)")
    (drift,) = compare(split_runs(X86_AVX2=lambda o: {**o, "t::forces": PER_MODEL})).drifts
    assert drift.run == X86_AVX2  # x86_64: one CPU, so one run of the per-CPU tests


def test_a_test_declared_otherwise_on_one_architecture_is_a_drift():
    # marked level-independent on x86_64 only: it would dodge aarch64's other CPU models
    runs = split_runs(X86_GENERIC=lambda o: {**o, "t::kernel": ONCE}, X86_AVX2=without("t::kernel"))
    drifts = compare(runs).drifts
    assert [(drift.test, drift.run) for drift in drifts] == [("t::kernel", run) for run in (A64FX, N1, MAX)]
    assert str(drifts[0]) == ("t::kernel (once per architecture): runs once per architecture on x86_64 (cibuildwheel) "
                              "CPU host, ISA generic, every run on aarch64 (cross) CPU a64fx, ISA neon: "
                              "one declaration for every run")


def test_a_designated_run_without_a_report_leaves_the_others_undesignated():
    runs = split_runs()
    del runs[X86_GENERIC]  # crashed: its own row fails; the others are not asked for its part
    assert compare(runs, planned=[X86_GENERIC, X86_AVX2, A64FX, N1, MAX]).ok
    # without the plan, avx2 would be taken for x86_64's first run
    assert {(d.test, d.run) for d in compare(runs).drifts} == {("t::reference", X86_AVX2), ("t::forces", X86_AVX2)}


def test_an_allowance_excuses_a_once_only_test_on_its_designated_run():
    runs = split_runs(A64FX=lambda o: {**o, "t::reference": Outcome("skipped", "x86 only", PER_ARCH)})
    verdict = compare(runs, [allowance(test="t::reference")])
    assert verdict.ok and [(run, test) for _, run, test in verdict.excused] == [(A64FX, "t::reference")]
    absent = split_runs(A64FX=without("t::reference"))
    assert compare(absent, [allowance(test="t::reference", outcome="absent")]).ok
    assert not compare(absent, [allowance(test="t::reference", outcome="absent", cpu_models=("max",))]).ok


def test_read_junit_takes_the_scope_from_the_markers_property(tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text(
        '<testsuite tests="3"><testcase classname="tests.t" name="test_a" file="tests/t.py">'
        '<properties><property name="markers" value="canary level_independent parametrize"/></properties>'
        '</testcase><testcase classname="tests.t" name="test_b" file="tests/t.py">'
        '<properties><property name="markers" value="forces_levels"/></properties></testcase>'
        '<testcase classname="tests.t" name="test_b" file="tests/t.py"><error message="teardown"/></testcase>'
        '<testcase classname="tests.t" name="test_c" file="tests/t.py"/></testsuite>')
    assert read_junit(path) == {"tests/t.py::test_a": ONCE, "tests/t.py::test_b": Outcome("error", "teardown", PER_CPU),
                                "tests/t.py::test_c": PASSED}


def test_the_tolerances_of_every_run_are_compared_with_the_first_run_that_compared_each():
    from harness.plan.verdict import compare_tolerances

    bf16, loose = {"rtol": 0.02, "atol": 0.02}, {"rtol": 0.4, "atol": 0.4}
    assert compare_tolerances([("x86", {"UNQUANT/bfloat16": bf16}), ("arm", {"UNQUANT/bfloat16": bf16}),
                               ("canary", {})]) == ()
    drifts = compare_tolerances([("x86", {"UNQUANT/bfloat16": bf16}), ("arm", {"UNQUANT/bfloat16": loose}),
                                 ("none", None), ("later", {"FP8_W8A16/bfloat16": loose})])
    assert [str(drift) for drift in drifts] == [
        "tolerance of UNQUANT/bfloat16: atol 0.4, rtol 0.4 on arm, atol 0.02, rtol 0.02 on x86",
        "tolerances: none recorded on none, 1 on x86"]
    assert compare_tolerances([("a", None), ("b", None)]) == ()


def test_each_environment_of_an_arch_designates_its_own_runs():
    """One wheel under two torches (or a second toolchain): the once-only parts run under each."""
    newer = RunId("x86_64", "cibuildwheel", "host", "generic", "torch 2.14.1")
    newer_avx2 = RunId("x86_64", "cibuildwheel", "host", "avx2", "torch 2.14.1")
    assert designated([X86_GENERIC, X86_AVX2, newer, newer_avx2]) == {
        X86_GENERIC: (EVERY_RUN, PER_CPU, PER_ARCH), X86_AVX2: (EVERY_RUN,),
        newer: (EVERY_RUN, PER_CPU, PER_ARCH), newer_avx2: (EVERY_RUN,)}
    assert str(newer) == "x86_64 (cibuildwheel) CPU host, ISA generic, torch 2.14.1"


def test_a_test_that_passes_under_one_torch_and_is_skipped_under_another_is_a_drift():
    newer = RunId("x86_64", "cibuildwheel", "host", "avx2", "torch 2.14.1")
    test = "tests/kernels/test_a.py::test_one"
    verdict = compare({X86_AVX2: {test: Outcome("passed")}, newer: {test: Outcome("skipped", "old torch")}})
    assert [str(drift) for drift in verdict.drifts] == [
        f"{test}: passed on {X86_AVX2}, skipped on {newer}: old torch"]
