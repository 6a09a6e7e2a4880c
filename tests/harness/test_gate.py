"""The publish gate: every level a wheel's library reports needs a passing run of
those bytes, from any machine; the refusal names each level that has none."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.common.errors import HarnessError, PublishError
from harness.plan.targets import load_targets
from harness.proving import gate, records
from harness.publishing import publish
from tests.harness.conftest import REPO
from tests.publish.support import make_sdist, make_wheel, passing_runs, publish_env, sealed_record

TARGETS = load_targets(REPO / "pyproject.toml")
X86 = TARGETS["x86_64"]
LADDER = ("generic", "avx2", "avx512", "avx512_bf16", "amx")
TESTS = ("tests/kernels/test_a.py::test_one", "tests/kernels/test_a.py::test_two")


def x86_record(wheel: Path, cpu: str, results: dict[str, str], tests: dict[str, str] | None = None) -> dict:
    """A record of the x86_64 wheel from the machine ``cpu``: level -> its run's result."""
    runs = [{"cpu": "host", "isa": level, "isa_reported": level if result != "not supported by this CPU" else "",
             "passed": 2, "failed": 0, "skipped": 0, "result": result,
             "tests": dict.fromkeys(TESTS, "passed") | (tests or {}) if result == "passed" else {},
             "scopes": {}, "kernels": {}}
            for level, result in results.items()]
    record = sealed_record(wheel, "x86_64", runs, LADDER, producer="prove")
    record["where"]["cpu"] = cpu
    return records.seal({key: value for key, value in record.items() if key not in ("format", "digest")})


AVX2_HOST = dict(zip(LADDER, ["passed", "passed", *["not supported by this CPU"] * 3], strict=True))
AMX_HOST = dict.fromkeys(LADDER, "passed")


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    return make_wheel(tmp_path / "wheelhouse", "x86_64")


def test_an_avx2_only_hosts_record_leaves_avx512_avx512_bf16_and_amx_unproven(wheel):
    mine = [x86_record(wheel, "AMD EPYC 7763", AVX2_HOST)]
    (problem,) = gate.problems(X86, mine, {})
    assert problem.startswith("ships levels no record proves: avx512, avx512_bf16, amx (python -m harness.proving.prove")
    assert [(level.level, level.proof) for level in gate.levels(X86, mine, {})] == [
        ("generic", "AMD EPYC 7763 (native, prove) host"), ("avx2", "AMD EPYC 7763 (native, prove) host"),
        ("avx512", "UNPROVEN"), ("avx512_bf16", "UNPROVEN"), ("amx", "UNPROVEN")]


def test_a_record_of_the_same_wheel_from_an_amx_machine_proves_its_levels(wheel):
    mine = [x86_record(wheel, "AMD EPYC 7763", AVX2_HOST), x86_record(wheel, "Xeon 8480", AMX_HOST)]
    assert gate.problems(X86, mine, {}) == []
    proofs = {level.level: level.proven_by for level in gate.levels(X86, mine, {})}
    assert proofs["generic"] == ("AMD EPYC 7763 (native, prove) host", "Xeon 8480 (native, prove) host")
    assert proofs["amx"] == ("Xeon 8480 (native, prove) host",)


def test_a_record_of_other_bytes_proves_nothing_of_this_wheel(wheel, tmp_path):
    other = make_wheel(tmp_path / "other", "x86_64", payload=b"# rebuilt\n")
    every = [x86_record(wheel, "AMD EPYC 7763", AVX2_HOST), x86_record(other, "Xeon 8480", AMX_HOST)]
    mine = gate.of_wheel(every, records.sha256(wheel))
    assert gate.problems(X86, mine, {})[0].startswith("ships levels no record proves: avx512, avx512_bf16, amx")


def test_a_failed_run_anywhere_refuses_though_another_machine_passed(wheel):
    failed = AMX_HOST | {"avx512_bf16": "FAILED: 1 failed"}
    mine = [x86_record(wheel, "Xeon 8480", AMX_HOST), x86_record(wheel, "Xeon 6980P", failed)]
    assert gate.problems(X86, mine, {}) == ["Xeon 6980P (native, prove) host/avx512_bf16: FAILED: 1 failed"]


def test_no_record_at_all_says_how_to_make_one():
    assert gate.problems(X86, [], {}) == [
        f"no test record for this exact file (nox -s test-x86_64 tests it, or {gate.PROVE})"]


def test_records_that_disagree_on_the_levels_are_refused(wheel):
    one = x86_record(wheel, "Xeon 8480", AMX_HOST)
    fewer = records.seal({key: value for key, value in one.items() if key not in ("format", "digest")}
                         | {"levels": list(LADDER[:4])})
    assert gate.problems(X86, [one, fewer], {}) == [
        "its records disagree on the levels it ships: generic, avx2, avx512, avx512_bf16 / "
        "generic, avx2, avx512, avx512_bf16, amx"]


def test_an_untested_emulated_cpu_model_is_named():
    arm = TARGETS["aarch64"]
    mine = [{"arch": "aarch64", "levels": ["generic", "neon", "dotprod", "i8mm"], "producer": "test-arm64",
             "where": {"cpu": "x", "runner": "qemu"},
             "runs": [run for run in passing_runs("aarch64") if run["cpu"] != "neoverse-n1"]}]
    assert gate.problems(arm, mine, {}) == [
        "CPU model neoverse-n1 (dotprod) was not tested",
        f"ships levels no record proves: dotprod ({gate.PROVE}; or, knowingly, --allow-untested-level LEVEL "
        "--reason WHY)"]


def test_an_allowed_untested_level_passes_with_its_reason_shown_and_kept(wheel, tmp_path):
    mine = [x86_record(wheel, "AMD EPYC 7763", AVX2_HOST | {"avx512": "passed", "avx512_bf16": "passed"})]
    untested = gate.untested_levels(["amx"], ["no AMX machine this week"])
    assert gate.problems(X86, mine, untested) == []
    rows = gate.levels(X86, mine, untested)
    assert rows[-1].proof == "UNTESTED, allowed: no AMX machine this week"
    assert "| x86_64 | amx | UNTESTED, allowed: no AMX machine this week |" in gate.table(rows)
    (kept,) = gate.keep_untested([rows[-1]], {"x86_64": records.sha256(wheel)}, tmp_path / "reports")
    assert kept == tmp_path / "reports" / "untested" / f"x86_64-{records.sha256(wheel)[:12]}.json"
    assert json.loads(kept.read_text())["levels"] == {"amx": "no AMX machine this week"}
    # the allowance covers the level it names only
    assert gate.problems(X86, [x86_record(wheel, "AMD EPYC 7763", AVX2_HOST)], untested)[0].startswith(
        "ships levels no record proves: avx512, avx512_bf16 (")


@pytest.mark.parametrize(("levels", "reasons", "problem"), [
    (["amx"], [], "--reason: give one for every --allow-untested-level (1) or one for all, not 0"),
    (["amx", "avx512"], ["a", "b", "c"], "give one for every --allow-untested-level (2) or one for all, not 3"),
    (["amx"], ["  "], "--reason: say why the level may ship without a run"),
    ([], ["why"], "--reason: give it with --allow-untested-level LEVEL"),
])
def test_an_allowance_needs_a_reason(levels, reasons, problem):
    with pytest.raises(HarnessError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        gate.untested_levels(levels, reasons)


def test_one_reason_serves_every_level_named():
    assert gate.untested_levels(["avx512", "amx"], ["why"]) == {"avx512": "why", "amx": "why"}


def test_the_same_tests_are_proven_across_machines(wheel):
    skipped = {TESTS[1]: "skipped"}
    xeon = x86_record(wheel, "Xeon 8480", AMX_HOST, tests=skipped)
    epyc = x86_record(wheel, "AMD EPYC 7763", AVX2_HOST)
    assert gate.same_tests_problems([epyc, x86_record(wheel, "Xeon 8480", AMX_HOST)], ()) == []
    drifts = gate.same_tests_problems([epyc, xeon], ())
    assert drifts[0] == (f"not the same tests: {TESTS[1]}: passed on x86_64 (AMD EPYC 7763 (native, prove)) CPU "
                         "host, ISA generic, torch 2.13.0, skipped on x86_64 (Xeon 8480 (native, prove)) CPU host, "
                         "ISA generic, torch 2.13.0")
    assert len(drifts) == len(LADDER)


def x86_record_with_torch(wheel: Path, torch: str, tests: dict[str, str] | None = None) -> dict:
    record = x86_record(wheel, "Xeon 8480", AMX_HOST, tests=tests)
    record["where"]["torch"] = torch
    return records.seal({key: value for key, value in record.items() if key not in ("format", "digest")})


def test_one_wheel_under_two_torches_runs_every_part_under_each_and_the_same_tests(wheel):
    """Each torch's record designates its own runs (the once-per-architecture part runs under both)."""
    once = {TESTS[0]: "passed"}
    older, newer = x86_record_with_torch(wheel, "2.13.0+cpu"), x86_record_with_torch(wheel, "2.14.1")
    for record in (older, newer):
        record["runs"][0]["scopes"] = {TESTS[0]: "once per architecture"}
        record["runs"][0]["tests"] |= once
        for run in record["runs"][1:]:
            del run["tests"][TESTS[0]]
    assert gate.same_tests_problems([older, newer], ()) == []
    assert records.record_name(older) != records.record_name(newer)
    del newer["runs"][0]["tests"][TESTS[0]]  # the once-only part left out under 2.14.1
    drifts = gate.same_tests_problems([older, newer], ())
    assert len(drifts) == 1 and "ISA generic, torch 2.14.1" in drifts[0] and "absent" in drifts[0]


# --- through publish -----------------------------------------------------------------------


@pytest.fixture
def release(tmp_path: Path) -> tuple[Path, Path, dict[str, Path]]:
    """(wheelhouse, reports, wheels): aarch64 fully proven; x86_64 by an AVX2-only host."""
    wheelhouse, reports = tmp_path / "wheelhouse", tmp_path / "reports"
    wheels = {arch: make_wheel(wheelhouse, arch) for arch in TARGETS}
    make_sdist(wheelhouse)
    records.store(sealed_record(wheels["aarch64"], "aarch64"), reports, "the test")
    records.store(x86_record(wheels["x86_64"], "AMD EPYC 7763", AVX2_HOST), reports, "the test")
    return wheelhouse, reports, wheels


def dry_run(wheelhouse: Path, reports: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`nox -s publish -- --dry-run ...`, as the session runs it (no destination set)."""
    return subprocess.run(
        [sys.executable, "-m", "harness.publishing.publish", "--dry-run", "--wheelhouse", str(wheelhouse),
         "--reports", str(reports), *args],
        cwd=REPO, env=publish_env(), capture_output=True, text=True, timeout=120)


def test_publish_refuses_naming_each_unproven_level_until_a_record_proves_them(release, tmp_path):
    wheelhouse, reports, wheels = release
    result = dry_run(wheelhouse, reports)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "x86_64" in line]
    assert "is not tested: ships levels no record proves: avx512, avx512_bf16, amx (" in line

    # a record made on an AMX machine, added as `nox -s records -- add` adds it
    made = tmp_path / "there" / "record.json"
    made.parent.mkdir()
    made.write_text(json.dumps(x86_record(wheels["x86_64"], "Xeon 8480", AMX_HOST)))
    records.add([made], wheelhouse, reports)
    artifacts = publish.collect(TARGETS, wheelhouse, records.load_records(reports))
    assert sorted(a.arch for a in artifacts) == ["", "aarch64", "x86_64"]


def test_publish_lets_a_named_level_through_with_its_reason_only(release):
    wheelhouse, reports, _ = release
    untested = gate.untested_levels(["avx512", "avx512_bf16", "amx"], ["no such machine"])
    assert len(publish.collect(TARGETS, wheelhouse, records.load_records(reports), untested=untested)) == 3
    with pytest.raises(PublishError, match="ships levels no record proves: amx"):
        publish.collect(TARGETS, wheelhouse, records.load_records(reports), untested={"avx512": "a", "avx512_bf16": "b"})
    with pytest.raises(PublishError, match=r"--allow-untested-level avx513: no wheel ships that level \(they ship: amx"):
        publish.collect(TARGETS, wheelhouse, records.load_records(reports), untested=untested | {"avx513": "typo"})


def test_publish_refuses_an_edited_record_naming_it(release):
    wheelhouse, reports, _ = release
    (path,) = records.records_dir(reports).glob("x86_64-*.json")
    record = json.loads(path.read_text())
    record["runs"][2]["result"] = "passed"  # avx512, "not supported by this CPU" where it ran
    path.write_text(json.dumps(record))
    result = dry_run(wheelhouse, reports)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"publish: {path}: its content does not match its digest")


def test_the_levels_table_of_the_wheelhouse_names_each_levels_proof_and_what_is_missing(release, tmp_path):
    wheelhouse, reports, wheels = release
    text = gate.levels_table(wheelhouse, reports, REPO / "pyproject.toml")
    assert "| x86_64 | avx2 | AMD EPYC 7763 (native, prove) host |" in text
    assert "| x86_64 | amx | UNPROVEN |" in text
    assert "| aarch64 | generic | Test CPU (qemu, test) host |" in text
    assert f"{wheels['x86_64'].name}: ships levels no record proves: avx512, avx512_bf16, amx (" in text
    assert gate.levels_table(tmp_path / "none", reports) == f"no wheel in {tmp_path / 'none'} (nox -s build makes them)"
