from __future__ import annotations

import pytest
from harness.targets import CpuModel, TableError, load_targets, parse_targets, select


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
        ("x86_64", {"isa-levels": None}, "a native target needs isa-levels"),
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
