from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import tomllib
import zipfile
from pathlib import Path

import pytest

from harness.building import build, builders
from harness.common import console
from harness.common.errors import HarnessError
from harness.plan.targets import SdistBuild
from harness.setup import images, tools
from tests.harness.wheelfiles import make_wheel, project_wheel


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    (root / "csrc").mkdir(parents=True)
    (root / "csrc" / "ops.cpp").write_text("int x;\n")
    (root / ".gitignore").write_text("/build/\n/wheelhouse/\n")
    (root / "pyproject.toml").write_text(
        '[tool.cibuildwheel]\nrepair-wheel-command = "auditwheel repair --exclude libtorch.so '
        '--exclude libc10.so -w {dest_dir} {wheel}"\n'
    )
    (root / "build").mkdir()
    (root / "build" / "CMakeCache.txt").write_text("host paths\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "csrc", "pyproject.toml"], check=True)
    (root / "untracked.txt").write_text("new file\n")
    return root


def test_source_files_are_what_git_tracks_or_would(repo):
    assert build.source_files(repo) == [".gitignore", "csrc/ops.cpp", "pyproject.toml", "untracked.txt"]


def test_inputs_hash_follows_content_and_image(repo):
    files = build.source_files(repo)
    first = build.inputs_hash(repo, files, "image:1")
    assert first == build.inputs_hash(repo, files, "image:1")
    assert first != build.inputs_hash(repo, files, "image:2")
    (repo / "csrc" / "ops.cpp").write_text("int y;\n")
    assert first != build.inputs_hash(repo, files, "image:1")


def test_stage_copies_only_the_listed_files(repo, tmp_path):
    dest = tmp_path / "staged"
    build.stage(repo, build.source_files(repo), dest)
    assert (dest / "csrc" / "ops.cpp").read_text() == "int x;\n"
    assert not (dest / "build").exists()


@pytest.mark.parametrize(
    ("name", "arch", "matches"),
    [
        ("moe_xarch-0.1.0-py3-none-manylinux_2_28_aarch64.whl", "aarch64", True),
        ("moe_xarch-0.1.0-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "x86_64", True),
        ("moe_xarch-0.1.0-py3-none-manylinux_2_28_aarch64.whl", "x86_64", False),
        ("moe_xarch-0.1.0-py3-none-linux_aarch64.whl", "aarch64", False),  # not repaired
        ("other-0.1.0-py3-none-manylinux_2_28_aarch64.whl", "aarch64", False),
    ],
)
def test_wheel_matches(name, arch, matches):
    assert build.wheel_matches(name, arch) is matches


def test_find_wheel_wants_exactly_one(tmp_path):
    with pytest.raises(HarnessError, match="nox -s build -- --arch aarch64"):
        build.find_wheel(tmp_path, "aarch64")
    wheel = project_wheel(tmp_path, "aarch64")
    assert build.find_wheel(tmp_path, "aarch64") == wheel


def test_replace_in_wheelhouse_replaces_older_wheels_of_the_arch_only(tmp_path):
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    old = wheelhouse / "moe_xarch-0.0.9-py3-none-manylinux_2_28_aarch64.whl"
    other_arch = wheelhouse / "moe_xarch-0.0.9-py3-none-manylinux_2_28_x86_64.whl"
    for path in (old, other_arch):
        path.write_bytes(b"old")
    kept = tmp_path / "kept" / "moe_xarch-0.1.0-py3-none-manylinux_2_28_aarch64.whl"
    kept.parent.mkdir()
    kept.write_bytes(b"new")
    final = build.replace_in_wheelhouse(kept, wheelhouse, "aarch64")
    assert final.read_bytes() == b"new" and kept.exists()  # the builder keeps its copy
    assert not old.exists() and other_arch.exists()
    assert not list(wheelhouse.glob(".partial-*"))


def test_partial_outputs_of_dead_runs_are_removed(tmp_path):
    dead = tmp_path / ".partial-999999999-aarch64"
    dead_file = tmp_path / ".partial-999999999-aarch64-x.whl"
    alive = tmp_path / f".partial-{os.getpid()}-x86_64"
    for directory in (dead, alive):
        directory.mkdir()
        (directory / "half.whl").write_bytes(b"")
    dead_file.write_bytes(b"")
    build.remove_partial_outputs(tmp_path)
    assert not dead.exists() and not dead_file.exists() and alive.exists()


WHEEL = "moe_xarch-0.1.0-py3-none-manylinux_2_28_aarch64.whl"


def made_by(wheel: Path) -> str:
    """Which fake build made a wheel: "<builder> <number of the run>"."""
    with zipfile.ZipFile(wheel) as archive:
        return archive.read("moe_xarch/made_by.txt").decode()


class FakeBuilder(builders.Builder):
    """Stands in for a real builder: writes a wheel into its output, fails on the
    first call of all when fail_first."""

    def __init__(self, name, runs, fail_first=True):
        self.name, self.runs, self.fail_first = name, runs, fail_first

    def identity(self, job):
        return []

    def build(self, job):
        self.runs.append(job.builder)
        make_wheel(job.output, tag="py3-none-manylinux_2_28_aarch64",
                   files={"moe_xarch/made_by.txt": f"{job.builder} {len(self.runs)}".encode()})
        if self.fail_first and len(self.runs) == 1:
            raise console.CommandFailed("build", ["cibuildwheel"], 1)


@pytest.fixture
def build_kwargs(repo, tmp_path, monkeypatch):
    audited = []
    monkeypatch.setattr(build, "check_tag", lambda wheel, *args: audited.append((wheel.name, args[2])))
    monkeypatch.setattr(build.versioning, "project_version", lambda repo, python: "0.1.0")
    monkeypatch.setattr(images, "image_exists", lambda tag: True)  # the fake build image
    return dict(repo=repo, wheelhouse=tmp_path / "wheelhouse", cache=tmp_path / "cache",
                tools=tools.Tools(["cibuildwheel"], "python"), steps=console.StepLog(), audited=audited)


def test_a_failed_build_leaves_no_wheel_and_a_good_one_is_reused(arm, build_kwargs, monkeypatch):
    images = {"build": type("Spec", (), {"tag": "moe-xarch-build:aarch64-x"})()}
    runs = []
    builder = FakeBuilder("cibuildwheel", runs)
    audited = build_kwargs.pop("audited")
    wheelhouse, cache = build_kwargs["wheelhouse"], build_kwargs["cache"]
    with pytest.raises(HarnessError, match=r"^build: cibuildwheel exited with 1 \(its output is above\)"
                       r".*: fix what it names, then run nox -s build -- --arch aarch64 again$"):
        build.build_wheel(arm, builder, images, **build_kwargs)
    assert list(wheelhouse.iterdir()) == [] and not list(cache.glob(".partial-*"))
    wheel = build.build_wheel(arm, builder, images, **build_kwargs)
    assert wheel == wheelhouse / WHEEL
    assert json.loads((cache / "aarch64-cibuildwheel" / "inputs.json").read_text())["wheel"] == WHEEL
    assert build.build_wheel(arm, builder, images, **build_kwargs) == wheel
    assert runs == ["cibuildwheel"] * 2 and build_kwargs["steps"].steps[-1].outcome == "reused"
    assert audited[-1] == (WHEEL, {"libtorch.so", "libc10.so"})
    build.build_wheel(arm, builder, images, **build_kwargs, force=True)
    assert len(runs) == 3


def test_each_builder_keeps_its_own_wheel(arm, build_kwargs, monkeypatch):
    images = {"build": type("Spec", (), {"tag": "moe-xarch-build:aarch64-x"})()}
    runs = []
    cross, cibuildwheel = (FakeBuilder(name, runs, fail_first=False) for name in ("cross", "cibuildwheel"))
    build_kwargs.pop("audited")
    wheelhouse, cache = build_kwargs["wheelhouse"], build_kwargs["cache"]
    build.build_wheel(arm, cross, images, **build_kwargs)
    build.build_wheel(arm, cibuildwheel, images, **build_kwargs)
    assert made_by(wheelhouse / WHEEL) == "cibuildwheel 2"
    assert build.built_by(wheelhouse / WHEEL, cache) == "cibuildwheel"
    # Switching back reuses the cross wheel instead of building it again.
    build.build_wheel(arm, cross, images, **build_kwargs)
    assert runs == ["cross", "cibuildwheel"] and made_by(wheelhouse / WHEEL) == "cross 1"
    assert build.built_by(wheelhouse / WHEEL, cache) == "cross"


class FakeSdistBuilder(FakeBuilder):
    """Writes an unrepaired wheel, as pip makes it from the sdist for a user."""

    repairs = False

    def build(self, job):
        self.runs.append(job.builder)
        make_wheel(job.output, tag="py3-none-linux_x86_64", files={"moe_xarch/made_by.txt": b"sdist"})


def test_an_sdist_legs_wheel_is_not_repaired_and_stays_out_of_the_wheelhouse(x86, build_kwargs):
    (leg,) = dataclasses.replace(x86, sdist_builds=(SdistBuild("trixie", ("3.13",), "torch==2.14.1"),)).sdist_legs()
    images = {"build": type("Spec", (), {"tag": "moe-xarch-build:x86_64-trixie"})()}
    runs, audited = [], build_kwargs.pop("audited")
    wheelhouse, cache = build_kwargs.pop("wheelhouse"), build_kwargs["cache"]
    builder = FakeSdistBuilder("sdist", runs)
    wheel = build.build_wheel(leg, builder, images, wheelhouse=None, **build_kwargs)
    assert wheel == cache / "x86_64-trixie-sdist-sdist" / "moe_xarch-0.1.0-py3-none-linux_x86_64.whl"
    assert not wheelhouse.exists() and audited == []  # no auditwheel show of an unrepaired wheel
    assert build.build_wheel(leg, builder, images, wheelhouse=None, **build_kwargs) == wheel and runs == ["sdist"]
    assert build_kwargs["steps"].steps[-1].name == "build x86_64-trixie-sdist (sdist)"
    assert build.wheel_matches(wheel.name, "x86_64", repaired=False) and not build.wheel_matches(wheel.name, "x86_64")


SHOW = {
    "sym_tag": "manylinux_2_34_x86_64",
    "overall_tag": "linux_x86_64",
    "external_libs": {"libc10.so": None, "libtorch_cpu.so": None},
}
EXCLUDED = {"libtorch.so", "libtorch_cpu.so", "libc10.so"}


def test_auditwheel_show_agrees_when_only_libtorch_is_outside():
    assert build.audit_problems(SHOW, "moe_xarch-0.1.0-py3-none-manylinux_2_34_x86_64.whl", EXCLUDED) == []
    assert build.platform_tag("m-0.1-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl") == (
        "manylinux_2_17_x86_64.manylinux2014_x86_64"
    )


def test_auditwheel_show_disagreements_are_named():
    problems = build.audit_problems(
        {**SHOW, "external_libs": {"libgomp.so.1": None, "libc10.so": None}},
        "moe_xarch-0.1.0-py3-none-manylinux_2_28_x86_64.whl", EXCLUDED,
    )
    assert problems == [
        "tagged manylinux_2_28_x86_64, but its symbols need manylinux_2_34_x86_64",
        "needs libraries it does not carry: libgomp.so.1",
    ]


def test_repair_excludes_come_from_the_cibuildwheel_table(repo_root):
    pyproject = tomllib.loads((repo_root / "pyproject.toml").read_text())
    assert build.repair_excludes(pyproject) >= {"libtorch.so", "libtorch_cpu.so", "libc10.so"}


def test_only_files_that_reach_the_wheel_are_build_inputs():
    files = ["CMakeLists.txt", "csrc/ops.cpp", "harness/building/build.py", "tests/kernels/t.py",
             "noxfile.py", "docs/new.md", "package/moe_xarch/__init__.py"]
    assert build.build_inputs(files) == [
        "CMakeLists.txt", "csrc/ops.cpp", "docs/new.md", "package/moe_xarch/__init__.py"
    ]


class Recording(FakeBuilder):
    """A builder whose identity is what the test sets, and that notes each call."""

    def __init__(self, runs, identity):
        super().__init__("cross", runs, fail_first=False)
        self.said, self.calls = identity, []

    def prepare(self, job):
        self.calls.append("prepare")

    def identity(self, job):
        self.calls.append("identity")
        return list(self.said)


def test_a_builders_identity_is_a_build_input_asked_after_prepare(arm, build_kwargs):
    images = {"build": type("Spec", (), {"tag": "moe-xarch-build:aarch64-x"})()}
    runs = []
    builder = Recording(runs, ["gcc 12"])
    build_kwargs.pop("audited")
    build.build_wheel(arm, builder, images, **build_kwargs)
    build.build_wheel(arm, builder, images, **build_kwargs)
    assert runs == ["cross"] and builder.calls == ["prepare", "identity"] * 2
    builder.said = ["gcc 13"]  # another compiler: another wheel
    build.build_wheel(arm, builder, images, **build_kwargs)
    assert runs == ["cross"] * 2


def test_step_names_give_back_arch_and_builder():
    assert build.BUILD_STEP.fullmatch(build.step_name("aarch64", "cross")).groups() == ("aarch64", "cross")
    assert build.BUILD_STEP.fullmatch("test aarch64 (cross) max i8mm") is None
