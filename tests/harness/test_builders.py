"""The builders behind one interface, looked up from the table's names."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.building import builders, cross
from harness.plan.targets import SdistBuild, TableError, load_targets
from harness.setup import tools


def job(target, builder="cross", tmp_path=Path("/nonexistent")):
    return builders.BuildJob(target, builder, "moe-xarch-build:aarch64-x", tmp_path / "staged",
                             tmp_path / "out", tools.Tools(["cibuildwheel"], "/venv/bin/python"), "0.1.0")


def test_every_builder_the_repository_table_names_is_registered(repo_root):
    targets = load_targets(repo_root / "pyproject.toml")
    builders.check_table(targets)
    assert all(builders.BUILDERS[name].name == name for name in builders.BUILDERS)


@pytest.mark.parametrize(
    ("requested", "host", "chosen"),
    [
        ([], "x86_64", ["cross"]),  # the table's first choice, where it applies
        ([], "aarch64", ["cibuildwheel"]),  # no cross build on the target's own arch
        (["cibuildwheel"], "x86_64", ["cibuildwheel"]),
        (["cibuildwheel", "cross"], "x86_64", ["cibuildwheel", "cross"]),
    ],
)
def test_choose(arm, requested, host, chosen):
    arm = dataclasses.replace(arm, builders=("cross", "cibuildwheel"))
    assert [builder.name for builder in builders.choose(arm, requested, host)] == chosen


def test_a_cross_build_needs_a_foreign_host_and_a_toolchain(x86, arm):
    assert builders.BUILDERS["cross"].applies(arm, "x86_64")
    assert not builders.BUILDERS["cross"].applies(arm, "aarch64")
    assert not builders.BUILDERS["cross"].applies(x86, "aarch64")  # no cross toolchain for x86_64
    assert builders.BUILDERS["cibuildwheel"].applies(x86, "aarch64")


@pytest.mark.parametrize(
    ("arch", "names", "message"),
    [
        ("aarch64", ("crosss",), "unknown builder 'crosss' (did you mean 'cross'?)"),
        ("aarch64", (), "builders must name at least one of cibuildwheel-hostcc, cibuildwheel, cross"),
        ("x86_64", ("cross",), "the cross builder cannot build x86_64 on any host"),
    ],
)
def test_bad_builder_names_are_rejected_with_the_row_and_a_hint(targets, arch, names, message):
    bad = {**targets, arch: dataclasses.replace(targets[arch], builders=names)}
    with pytest.raises(TableError) as error:
        builders.check_table(bad)
    assert message in str(error.value) and f"[tool.moe-xarch.targets.{arch}]" in str(error.value)


def test_cibuildwheel_env_per_target(arm):
    env = builders.cibuildwheel_env(arm, "moe-xarch-build:aarch64-abc", ["--label=o=1"], "1.2.dev3+g4")
    assert env == {
        "CIBW_PLATFORM": "linux",
        "CIBW_ENVIRONMENT": "SETUPTOOLS_SCM_PRETEND_VERSION_FOR_MOE_XARCH=1.2.dev3+g4",
        "CIBW_ARCHS": "aarch64",
        "CIBW_BUILD": "cp311-manylinux_aarch64",
        "CIBW_MANYLINUX_AARCH64_IMAGE": "moe-xarch-build:aarch64-abc",
        "CIBW_CONTAINER_ENGINE": "docker; create_args: --label=o=1",
    }


def test_cibuildwheels_identity_is_its_pin(arm):
    assert builders.BUILDERS["cibuildwheel"].identity(job(arm, "cibuildwheel")) == [tools.CIBUILDWHEEL]


def test_the_host_compiler_builder_adds_the_carried_compiler_on_a_foreign_x86_64_host(arm, monkeypatch):
    hostcc = builders.BUILDERS["cibuildwheel-hostcc"]
    assert hostcc.applies(arm, "x86_64") and hostcc.applies(arm, "aarch64")
    monkeypatch.setattr(builders.host, "arch", lambda: "x86_64")
    env = hostcc.environment(job(arm, hostcc.name))
    assert env["CIBW_ENVIRONMENT"].endswith(" CC=/opt/host-compiler/bin/cc CXX=/opt/host-compiler/bin/c++")
    assert hostcc.identity(job(arm, hostcc.name))[1:] == ["CC=/opt/host-compiler/bin/cc", "CXX=/opt/host-compiler/bin/c++"]
    monkeypatch.setattr(builders.host, "arch", lambda: "aarch64")  # on an Arm host: the image's own gcc
    assert hostcc.environment(job(arm, hostcc.name)) == builders.BUILDERS["cibuildwheel"].environment(job(arm, "x"))
    assert hostcc.identity(job(arm, hostcc.name)) == [tools.CIBUILDWHEEL]


@pytest.fixture
def no_compiler(monkeypatch):
    """A root host with apt-get but no cross compiler; installs are recorded, not run."""
    installed = []
    monkeypatch.setattr(cross.shutil, "which", lambda name: "/usr/bin/apt-get" if name == "apt-get" else None)
    monkeypatch.setattr(cross.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cross.host, "apt_install", installed.append)
    return installed


def test_the_cross_identity_installs_nothing(arm, no_compiler):
    with pytest.raises(cross.CrossSetupError, match="aarch64-linux-gnu-g\\+\\+ is not installed"):
        builders.BUILDERS["cross"].identity(job(arm))
    assert no_compiler == []


def test_the_cross_prepare_installs_the_compiler(arm, no_compiler):
    builders.BUILDERS["cross"].prepare(job(arm))
    assert no_compiler == [["g++-aarch64-linux-gnu"]]


def test_the_cross_build_hands_the_job_to_the_cross_module(arm, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(cross, "build_wheel", lambda *args, **kwargs: calls.append((args, kwargs)))
    builders.BUILDERS["cross"].build(job(arm, tmp_path=tmp_path))
    assert calls == [((arm, tmp_path / "staged", tmp_path / "out"),
                      {"python": "/venv/bin/python", "version": "0.1.0",
                       "build_image": "moe-xarch-build:aarch64-x"})]


def trixie_leg(x86):
    build = SdistBuild("trixie", ("3.13",), "torch==2.14.1")
    (leg,) = dataclasses.replace(x86, sdist_builds=(build,)).sdist_legs()
    return leg


def test_the_sdist_builder_builds_only_an_sdist_leg_natively_and_no_row_names_it(targets):
    x86 = targets["x86_64"]
    leg = trixie_leg(x86)
    sdist = builders.BUILDERS["sdist"]
    assert sdist.applies(leg, "x86_64") and not sdist.applies(leg, "aarch64") and not sdist.applies(x86, "x86_64")
    assert not sdist.repairs and builders.BUILDERS["cross"].repairs
    bad = {**targets, "x86_64": dataclasses.replace(x86, builders=("sdist",))}
    with pytest.raises(TableError, match=r"\[tool.moe-xarch.targets.x86_64\]: the sdist builder builds the "
                                         "sdist-builds legs, not a row's wheel"):
        builders.check_table(bad)


def test_the_sdist_build_makes_the_sdist_then_its_wheel_in_the_legs_build_image(targets, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(builders.console, "run_streamed", lambda command, label, **kwargs: calls.append(command))
    monkeypatch.setattr(builders.containers, "remove", lambda name: None)
    leg = trixie_leg(targets["x86_64"])
    builders.BUILDERS["sdist"].build(job(leg, "sdist", tmp_path))
    (command,) = calls
    assert command[:3] == ["docker", "run", "--rm"] and "--network=none" in command
    assert f"--volume={tmp_path / 'staged'}:/src:ro" in command and f"--volume={tmp_path / 'out'}:/out" in command
    assert "--env=SETUPTOOLS_SCM_PRETEND_VERSION_FOR_MOE_XARCH=0.1.0" in command
    # no --sdist / --wheel: pypa/build makes the sdist, then the wheel from it
    assert "python -m build --no-isolation --skip-dependency-check --outdir /tmp/dist /tmp/src" in command[-1]
    assert "--wheel" not in command[-1] and "auditwheel" not in command[-1]
    assert (tmp_path / "out").is_dir()
