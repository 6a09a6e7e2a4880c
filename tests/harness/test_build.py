from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path

import pytest

from harness import build, console
from harness.errors import HarnessError


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


def test_cibuildwheel_env_per_target(arm):
    env = build.cibuildwheel_env(arm, "moe-kernels-build:aarch64-abc", ["--label=o=1"])
    assert env == {
        "CIBW_PLATFORM": "linux",
        "CIBW_ARCHS": "aarch64",
        "CIBW_BUILD": "cp311-manylinux_aarch64",
        "CIBW_MANYLINUX_AARCH64_IMAGE": "moe-kernels-build:aarch64-abc",
        "CIBW_CONTAINER_ENGINE": "docker; create_args: --label=o=1",
    }


@pytest.mark.parametrize(
    ("name", "arch", "matches"),
    [
        ("moe_kernels-0.1.0-py3-none-manylinux_2_28_aarch64.whl", "aarch64", True),
        ("moe_kernels-0.1.0-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "x86_64", True),
        ("moe_kernels-0.1.0-py3-none-manylinux_2_28_aarch64.whl", "x86_64", False),
        ("moe_kernels-0.1.0-py3-none-linux_aarch64.whl", "aarch64", False),  # not repaired
        ("other-0.1.0-py3-none-manylinux_2_28_aarch64.whl", "aarch64", False),
    ],
)
def test_wheel_matches(name, arch, matches):
    assert build.wheel_matches(name, arch) is matches


def test_find_wheel_wants_exactly_one(tmp_path):
    with pytest.raises(HarnessError, match="nox -s build -- --arch aarch64"):
        build.find_wheel(tmp_path, "aarch64")
    wheel = tmp_path / "moe_kernels-0.1.0-py3-none-manylinux_2_28_aarch64.whl"
    wheel.write_bytes(b"")
    assert build.find_wheel(tmp_path, "aarch64") == wheel


def test_publish_replaces_older_wheels_of_the_arch_only(tmp_path):
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    old = wheelhouse / "moe_kernels-0.0.9-py3-none-manylinux_2_28_aarch64.whl"
    other_arch = wheelhouse / "moe_kernels-0.0.9-py3-none-manylinux_2_28_x86_64.whl"
    for path in (old, other_arch):
        path.write_bytes(b"old")
    built = wheelhouse / ".partial-1-aarch64" / "moe_kernels-0.1.0-py3-none-manylinux_2_28_aarch64.whl"
    built.parent.mkdir()
    built.write_bytes(b"new")
    final = build.publish(built, wheelhouse, "aarch64")
    assert final.read_bytes() == b"new" and not built.exists()
    assert not old.exists() and other_arch.exists()


def test_partial_outputs_of_dead_runs_are_removed(tmp_path):
    dead = tmp_path / ".partial-999999999-aarch64"
    alive = tmp_path / f".partial-{os.getpid()}-x86_64"
    for directory in (dead, alive):
        directory.mkdir()
        (directory / "half.whl").write_bytes(b"")
    build.remove_partial_outputs(tmp_path)
    assert not dead.exists() and alive.exists()


def test_a_failed_build_leaves_no_wheel_and_a_good_one_is_reused(repo, tmp_path, arm, monkeypatch):
    wheelhouse, stamps = tmp_path / "wheelhouse", tmp_path / "stamps"
    images = {"build": type("Spec", (), {"tag": "moe-kernels-build:aarch64-x"})()}
    runs = []

    def fake_cibuildwheel(argv, label, *, cwd, env, **kwargs):
        runs.append(argv)
        out = Path(argv[argv.index("--output-dir") + 1])
        out.mkdir(parents=True)
        (out / "moe_kernels-0.1.0-py3-none-manylinux_2_28_aarch64.whl").write_bytes(b"whl")
        if len(runs) == 1:
            raise console.CommandFailed(label, argv, 1)
        return 0

    monkeypatch.setattr(console, "run_streamed", fake_cibuildwheel)
    audited = []
    monkeypatch.setattr(build, "check_tag", lambda wheel, *args: audited.append((wheel.name, args[2])))
    kwargs = dict(repo=repo, wheelhouse=wheelhouse, stamps=stamps, cibuildwheel=["cibuildwheel"],
                  steps=console.StepLog())
    with pytest.raises(console.CommandFailed):
        build.build_wheel(arm, images, **kwargs)
    assert list(wheelhouse.iterdir()) == []
    wheel = build.build_wheel(arm, images, **kwargs)
    assert wheel.parent == wheelhouse and json.loads((stamps / "aarch64.json").read_text())["wheel"] == wheel.name
    assert build.build_wheel(arm, images, **kwargs) == wheel
    assert len(runs) == 2 and kwargs["steps"].steps[-1].outcome == "reused"
    assert audited[-1] == (wheel.name, {"libtorch.so", "libc10.so"})
    build.build_wheel(arm, images, **kwargs, force=True)
    assert len(runs) == 3


SHOW = {
    "sym_tag": "manylinux_2_34_x86_64",
    "overall_tag": "linux_x86_64",
    "external_libs": {"libc10.so": None, "libtorch_cpu.so": None},
}
EXCLUDED = {"libtorch.so", "libtorch_cpu.so", "libc10.so"}


def test_auditwheel_show_agrees_when_only_libtorch_is_outside():
    assert build.audit_problems(SHOW, "moe_kernels-0.1.0-py3-none-manylinux_2_34_x86_64.whl", EXCLUDED) == []
    assert build.platform_tag("m-0.1-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl") == (
        "manylinux_2_17_x86_64.manylinux2014_x86_64"
    )


def test_auditwheel_show_disagreements_are_named():
    problems = build.audit_problems(
        {**SHOW, "external_libs": {"libgomp.so.1": None, "libc10.so": None}},
        "moe_kernels-0.1.0-py3-none-manylinux_2_28_x86_64.whl", EXCLUDED,
    )
    assert problems == [
        "tagged manylinux_2_28_x86_64, but its symbols need manylinux_2_34_x86_64",
        "needs libraries it does not carry: libgomp.so.1",
    ]


def test_repair_excludes_come_from_the_cibuildwheel_table(repo_root):
    pyproject = tomllib.loads((repo_root / "pyproject.toml").read_text())
    assert build.repair_excludes(pyproject) >= {"libtorch.so", "libtorch_cpu.so", "libc10.so"}


def test_only_files_that_reach_the_wheel_are_build_inputs():
    files = ["CMakeLists.txt", "csrc/ops.cpp", "harness/build.py", "tests/kernels/t.py",
             "noxfile.py", "docs/new.md", "package/moe_kernels/__init__.py"]
    assert build.build_inputs(files) == [
        "CMakeLists.txt", "csrc/ops.cpp", "docs/new.md", "package/moe_kernels/__init__.py"
    ]
