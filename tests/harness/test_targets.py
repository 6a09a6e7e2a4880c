from __future__ import annotations

import pytest
from harness.plan.targets import CpuModel, TableError, load_targets, parse_targets, select


def test_the_repository_table_loads(repo_root):
    targets = load_targets(repo_root / "pyproject.toml")
    assert set(targets) == {"x86_64", "aarch64"}
    assert targets["aarch64"].runner == "qemu"
    assert {m.isa for m in targets["aarch64"].cpu_models} >= {"neon", "dotprod", "i8mm"}
    assert targets["aarch64"].builders[0] == "cibuildwheel-hostcc" and "cibuildwheel" in targets["aarch64"].builders
    assert targets["x86_64"].builders == ("cibuildwheel",)


def test_rows_become_frozen_targets(x86, arm):
    assert x86.platform == "linux/amd64" and x86.debian_arch == "amd64"
    assert x86.isa_levels == ("generic", "avx2", "avx512", "avx512_bf16")
    assert arm.cpu_models == (
        CpuModel("cortex-a72", "neon"), CpuModel("neoverse-n1", "dotprod"), CpuModel("max", "i8mm")
    )
    assert arm.python_tags == ("cp311",) and arm.glibc == (2, 36)
    with pytest.raises(AttributeError):
        arm.torch = "torch"  # type: ignore[misc]


def _row(table, arch: str, **changes) -> dict:
    row = dict(table()["tool"]["moe-xarch"]["targets"][arch])
    row.update(changes)
    return {k: v for k, v in row.items() if v is not None}


@pytest.mark.parametrize(
    ("arch", "changes", "message"),
    [
        ("aarch64", {"cpu-model": {"max": "i8mm"}}, "unknown key 'cpu-model' (did you mean 'cpu-models'?)"),
        ("aarch64", {"sutie": "bookworm"}, "did you mean 'suite'?"),
        ("aarch64", {"suite": "bookwrom"}, "unknown suite 'bookwrom' (did you mean 'bookworm'?)"),
        ("aarch64", {"runner": "qemu-user"}, "did you mean 'qemu'?"),
        ("aarch64", {"torch": None}, "missing torch"),
        ("aarch64", {"python-versions": "3.11"}, "python-versions must be a list, not str"),
        ("aarch64", {"python-versions": ["3.12"]}, "bookworm provides CPython 3.11 only"),
        ("aarch64", {"platform": "linux/amd64"}, "platform must be 'linux/arm64'"),
        ("aarch64", {"cpu-models": None}, "a qemu target needs cpu-models"),
        ("aarch64", {"isa-levels": ["neon"]}, "isa-levels apply to runner = \"native\" only"),
        ("x86_64", {"cpu-models": {"max": "x"}}, "cpu-models apply to runner = \"qemu\" only"),
        ("x86_64", {"isa-levels": []}, "a native target needs isa-levels"),
        ("aarch64", {"builders": "cross"}, "builders must be a list, not str"),
        ("aarch64", {"qemu-cpu-options": {"a72": "x=1"}}, "qemu-cpu-options: unknown CPU model 'a72'; known: cortex-a72"),
        ("aarch64", {"qemu-cpu-options": {"max": 16}}, "qemu-cpu-options values must be strings"),
    ],
)
def test_bad_rows_are_rejected_with_a_hint(make_table, arch, changes, message):
    with pytest.raises(TableError) as error:
        parse_targets(make_table(**{arch: _row(make_table, arch, **changes)}))
    assert message in str(error.value)
    assert f"[tool.moe-xarch.targets.{arch}]" in str(error.value)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"test-torch": ["torch==2.13.0"]}, "unknown key 'test-torch' (did you mean 'test-torches'?)"),
        ({"test-torches": ["torch==2.14.1"]}, "test-torches must hold 'torch==2.13.0'"),
        ({"test-torches": ["torch==2.13.0", "torch==2.13.0"]}, "test-torches names a torch twice"),
        ({"test-torches": ["torch==2.13.0", "torch>=2.14"]}, "'torch>=2.14': a torch of the target table is pinned"),
        ({"torch": "torch"}, "'torch': a torch of the target table is pinned as torch==X.Y.Z"),
        ({"sdist-builds": {"trixi": {}}}, "unknown suite 'trixi' (did you mean 'trixie'?)"),
        ({"sdist-builds": {"trixie": {"python-versions": ["3.13"]}}}, "sdist-builds.trixie: missing torch"),
        ({"sdist-builds": {"trixie": {"python-versions": ["3.11"], "torch": "torch==2.14.1"}}},
         "trixie provides CPython 3.13 only"),
        ({"sdist-builds": {"trixie": {"python-version": ["3.13"], "torch": "torch==2.14.1"}}},
         "did you mean 'python-versions'?"),
    ],
)
def test_bad_torches_and_sdist_builds_are_rejected_with_a_hint(make_table, changes, message):
    with pytest.raises(TableError) as error:
        parse_targets(make_table(x86_64=_row(make_table, "x86_64", **changes)))
    assert message in str(error.value)
    assert "[tool.moe-xarch.targets.x86_64]" in str(error.value)


def test_the_torch_axis_tests_one_wheel_in_a_test_image_per_torch(make_table):
    row = _row(make_table, "x86_64", **{"test-torches": ["torch==2.13.0", "torch==2.14.1"]})
    x86 = parse_targets(make_table(x86_64=row))["x86_64"]
    legs = x86.test_legs()
    assert legs[0] is x86 and x86.name == "x86_64" and x86.ships
    assert [(leg.name, leg.torch, leg.suite) for leg in legs[1:]] == [("x86_64-torch2.14.1", "torch==2.14.1", "bookworm")]
    assert [leg.environment for leg in legs] == ["Debian 12 · GCC 12 · Python 3.11 · torch 2.13.0",
                                                 "Debian 12 · GCC 12 · Python 3.11 · torch 2.14.1"]
    assert all(leg.ships for leg in legs) and x86.sdist_legs() == []


def test_an_sdist_build_is_a_leg_with_its_own_images_and_a_wheel_that_does_not_ship(make_table):
    row = _row(make_table, "x86_64", **{"sdist-builds": {"trixie": {"python-versions": ["3.13"],
                                                                     "torch": "torch==2.14.1"}}})
    x86 = parse_targets(make_table(x86_64=row))["x86_64"]
    (leg,) = x86.sdist_legs()
    assert (leg.arch, leg.name, leg.suite, leg.python_tags, leg.glibc) == (
        "x86_64", "x86_64-trixie-sdist", "trixie", ("cp313",), (2, 41))
    assert leg.environment == "Debian 13 · GCC 14 · Python 3.13 · torch 2.14.1"
    assert leg.builders == ("sdist",) and leg.from_sdist and not leg.ships
    assert leg.isa_levels == x86.isa_levels and leg.test_legs() == [leg] and leg.sdist_legs() == []


def test_the_repository_table_has_a_debian_13_toolchain_and_names_each_torch(repo_root):
    targets = load_targets(repo_root / "pyproject.toml")
    (trixie,) = targets["x86_64"].sdist_legs()
    assert trixie.environment.startswith("Debian 13 · GCC 14 · Python 3.13 · torch ")
    assert targets["x86_64"].torch in targets["x86_64"].test_torches
    assert targets["aarch64"].test_torches == (targets["aarch64"].torch,)


def test_a_models_qemu_options_go_with_it_into_qemu_cpu(make_table):
    row = _row(make_table, "aarch64", **{"qemu-cpu-options": {"max": "sve-default-vector-length=16"}})
    models = parse_targets(make_table(aarch64=row))["aarch64"].cpu_models
    assert [m.qemu_cpu for m in models] == ["cortex-a72", "neoverse-n1", "max,sve-default-vector-length=16"]
    assert [m.name for m in models] == ["cortex-a72", "neoverse-n1", "max"]


def test_unknown_architecture_is_rejected(make_table):
    with pytest.raises(TableError, match="unknown architecture 'arm64'"):
        parse_targets(make_table(arm64=_row(make_table, "aarch64")))


def test_unknown_top_level_key_is_rejected(make_table):
    data = make_table()
    data["tool"]["moe-xarch"]["target"] = {}
    with pytest.raises(TableError, match="did you mean 'targets'"):
        parse_targets(data)


def test_select_defaults_to_all_and_rejects_unknown(targets):
    assert [t.arch for t in select(targets, [])] == ["x86_64", "aarch64"]
    assert [t.arch for t in select(targets, ["aarch64"])] == ["aarch64"]
    with pytest.raises(TableError, match="did you mean 'aarch64'"):
        select(targets, ["aarch46"])
