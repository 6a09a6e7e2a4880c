"""The target table leaves no level of a ladder without a run, checked before any build."""

from __future__ import annotations

import importlib.util
import sys
import tomllib

import pytest

from harness import flows
from harness.plan import ladders
from harness.plan.targets import TableError, parse_targets
from tests.harness.conftest import REPO

LADDERS = ladders.declared_ladders()


def project_table() -> dict:
    with (REPO / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)


def aarch64_row(pyproject: dict) -> dict:
    return pyproject["tool"]["moe-xarch"]["targets"]["aarch64"]


def test_the_ladders_are_the_packages_declaration():
    """The level tables declare the ladders the package's oracle expects (tests/kernels
    checks each built library's against it too), read without importing the package,
    which loads the compiled library."""
    spec = importlib.util.spec_from_file_location("oracle", REPO / "package" / "moe_xarch" / "expected_kernels.py")
    assert spec and spec.loader
    oracle = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # for its dataclass
    try:
        spec.loader.exec_module(oracle)
    finally:
        del sys.modules[spec.name]
    assert LADDERS == oracle.ARCHITECTURE_LEVELS


def test_the_projects_table_runs_or_places_every_level():
    ladders.check_table(parse_targets(project_table()), LADDERS)


def test_removing_neoverse_n1_fails_naming_dotprod():
    pyproject = project_table()
    models = aarch64_row(pyproject)["cpu-models"]
    del models["neoverse-n1"]
    with pytest.raises(TableError) as error:
        ladders.check_table(parse_targets(pyproject), LADDERS)
    assert str(error.value).startswith(
        "[tool.moe-xarch.targets.aarch64]: no run of the table selects dotprod, which the aarch64 wheel ships: "
        "add a CPU model (or isa-level) that selects it, or declare where it is proven: "
        'proven-elsewhere = { dotprod = "..." }')


def test_a_level_dropped_from_a_native_targets_isa_levels_is_named():
    pyproject = project_table()
    pyproject["tool"]["moe-xarch"]["targets"]["x86_64"]["isa-levels"] = [lv for lv in LADDERS["x86_64"] if lv != "amx"]
    with pytest.raises(TableError, match="no run of the table selects amx, which the x86_64 wheel ships"):
        ladders.check_table(parse_targets(pyproject), LADDERS)


def test_a_level_declared_proven_elsewhere_passes_and_one_run_here_too_is_refused():
    pyproject = project_table()
    row = aarch64_row(pyproject)
    del row["cpu-models"]["neoverse-n1"]
    row["proven-elsewhere"] |= {"dotprod": "an Arm server's record"}
    ladders.check_table(parse_targets(pyproject), LADDERS)
    row["cpu-models"]["neoverse-n1"] = "dotprod"
    with pytest.raises(TableError, match="proven-elsewhere names dotprod, which CPU model neoverse-n1 runs here"):
        ladders.check_table(parse_targets(pyproject), LADDERS)


def test_an_unknown_level_is_named_with_the_ladder():
    pyproject = project_table()
    aarch64_row(pyproject)["proven-elsewhere"] = {"sve2": "somewhere"}
    with pytest.raises(TableError, match=r"sve2: no level of aarch64 \(its levels: generic, neon, dotprod, i8mm\)"):
        ladders.check_table(parse_targets(pyproject), LADDERS)


def test_proven_elsewhere_must_say_where():
    pyproject = project_table()
    aarch64_row(pyproject)["proven-elsewhere"] = {"generic": " "}
    with pytest.raises(TableError, match="proven-elsewhere values must say where each level's record comes from"):
        parse_targets(pyproject)


def test_the_check_runs_before_any_build(monkeypatch):
    pyproject = project_table()
    del aarch64_row(pyproject)["cpu-models"]["neoverse-n1"]
    monkeypatch.setattr(flows, "load_targets", lambda: parse_targets(pyproject))
    monkeypatch.setattr(flows, "builds_planned", lambda *_: pytest.fail("planned builds past the table check"))
    with pytest.raises(TableError, match="no run of the table selects dotprod"):
        flows.build_wheels(["--arch", "x86_64"], tools=None)  # type: ignore[arg-type]
