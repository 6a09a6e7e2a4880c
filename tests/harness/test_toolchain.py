from __future__ import annotations

import shlex

import pytest
from harness.building import builders, toolchain
from harness.common.errors import HarnessError
from harness.plan.targets import load_targets


def test_on_an_x86_64_host_the_build_compiles_with_the_carried_compiler(arm):
    assert toolchain.applies(arm, "x86_64")
    assert toolchain.compiler_variables(arm, "x86_64") == {
        "CC": f"{toolchain.PREFIX}/bin/cc", "CXX": f"{toolchain.PREFIX}/bin/c++"}


def test_on_the_targets_own_arch_the_image_compiles_with_its_own_gcc(arm, x86):
    assert toolchain.applies(arm, "aarch64") and toolchain.compiler_variables(arm, "aarch64") == {}
    assert toolchain.applies(x86, "x86_64") and toolchain.compiler_variables(x86, "x86_64") == {}


def test_a_host_the_carried_compiler_cannot_run_on_is_refused_by_name(x86):
    assert not toolchain.applies(x86, "aarch64")
    with pytest.raises(HarnessError, match="carries a compiler for x86_64 hosts, not for this aarch64 machine"):
        toolchain.compiler_variables(x86, "aarch64")


def test_the_compiler_joins_cibuildwheels_environment_without_replacing_it(arm):
    env = builders.cibuildwheel_env(arm, "image:tag", [], "1.2.3")
    changed = toolchain.with_host_compiler(env, arm, "x86_64")
    assigned = dict(item.split("=", 1) for item in shlex.split(changed["CIBW_ENVIRONMENT"]))
    assert assigned == {**dict(item.split("=", 1) for item in shlex.split(env["CIBW_ENVIRONMENT"])),
                        **toolchain.compiler_variables(arm, "x86_64")}
    assert {k: v for k, v in changed.items() if k != "CIBW_ENVIRONMENT"} == {
        k: v for k, v in env.items() if k != "CIBW_ENVIRONMENT"}
    assert toolchain.with_host_compiler(env, arm, "aarch64") == env


def test_the_build_image_installs_the_compiler_where_the_builder_looks(repo_root):
    dockerfile = (repo_root / "docker" / "Dockerfile.build").read_text()
    assert f"install-host-compiler.sh /tmp/harness/host-compiler-packages.txt {toolchain.PREFIX} " in dockerfile


def test_the_builder_is_the_aarch64_default_on_x86_64_and_on_arm(repo_root):
    arm = load_targets(repo_root / "pyproject.toml")["aarch64"]
    assert [b.name for b in builders.choose(arm, [], "x86_64")] == [toolchain.NAME]
    assert [b.name for b in builders.choose(arm, [], "aarch64")] == [toolchain.NAME]
