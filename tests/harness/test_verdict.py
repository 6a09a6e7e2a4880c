from __future__ import annotations

import re

import pytest

from harness.targets import TableError, parse_targets
from harness.verdict import ABSENT, Allowed, Outcome, RunId, compare, parse_allowed, read_junit

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
    from harness.targets import load_targets
    from harness.verdict import load_allowed

    load_allowed(repo_root / "pyproject.toml", load_targets(repo_root / "pyproject.toml"))
