from __future__ import annotations

import dataclasses
import shutil

import pytest

from harness.common.paths import DOCKER
from harness.setup import host, images
from harness.setup.images import debian_mirror, docker_build_command, image_specs


@pytest.fixture
def docker_dir(tmp_path):
    """A copy of docker/ that a test may change."""
    return shutil.copytree(DOCKER, tmp_path / "docker")


@pytest.fixture
def ca(tmp_path):
    path = tmp_path / "ca.crt"
    path.write_text("-----BEGIN CERTIFICATE-----\n")
    return path


def tags(target, docker_dir, ca):
    return {role: spec.tag for role, spec in image_specs(target, docker_dir, ca).items()}


def test_tags_are_stable_and_chained(arm, docker_dir, ca):
    first = tags(arm, docker_dir, ca)
    assert first == tags(arm, docker_dir, ca)
    assert first["base"].startswith("moe-xarch-base:aarch64-bookworm-")
    specs = image_specs(arm, docker_dir, ca)
    assert specs["test"].parent == first["base"] and specs["build"].parent == first["test"]


@pytest.mark.parametrize(
    ("change", "rebuilt"),
    [
        ("Dockerfile.build", {"build"}),
        ("requirements-build.txt", {"build"}),
        ("Dockerfile.test", {"test", "build"}),
        ("requirements-test.txt", {"test", "build"}),
        ("install-debian-packages.sh", {"test", "build"}),
        ("Dockerfile.base", {"base", "test", "build"}),
        ("debian-packages.txt", {"base", "test", "build"}),
    ],
)
def test_changing_an_input_retags_that_image_and_its_children(arm, docker_dir, ca, change, rebuilt):
    before = tags(arm, docker_dir, ca)
    with (docker_dir / change).open("a") as file:
        # requirement lists hash by their requirements, other files by their bytes
        file.write("\nextra-tool==1.0\n" if change.startswith("requirements") else "\n# changed\n")
    after = tags(arm, docker_dir, ca)
    assert {role for role in before if before[role] != after[role]} == rebuilt


def test_target_settings_retag_only_the_images_they_reach(arm, docker_dir, ca):
    before = tags(arm, docker_dir, ca)
    other_torch = tags(dataclasses.replace(arm, torch="torch==2.9.1"), docker_dir, ca)
    assert other_torch["base"] == before["base"] and other_torch["test"] != before["test"]
    other_cpus = tags(dataclasses.replace(arm, cpu_models=()), docker_dir, ca)
    assert other_cpus == before  # test runs, not images
    ca.write_text("another bundle")
    assert tags(arm, docker_dir, ca)["base"] != before["base"]


def test_a_registry_base_replaces_debootstrap(arm, docker_dir, ca):
    specs = image_specs(dataclasses.replace(arm, base_image="debian:bookworm"), docker_dir, ca)
    assert "base" not in specs and specs["test"].parent == "debian:bookworm"


def test_docker_build_command(arm, docker_dir, ca, tmp_path):
    spec = image_specs(arm, docker_dir, ca)["test"]
    command = docker_build_command(spec, tmp_path)
    assert command[:3] == ["docker", "build", "--platform=linux/arm64"]
    assert f"--tag={spec.tag}" in command and command[-1] == str(tmp_path)
    assert f"--build-arg=BASE_IMAGE={spec.parent}" in command
    assert "--build-arg=PYTHON_TAG=cp311" in command and "--build-arg=PYTHON_VERSION=3.11" in command


def test_debootstrap_command_takes_the_package_list(arm, tmp_path):
    packages = images.debian_packages(DOCKER)
    assert {"python3", "g++"} <= set(packages)
    command = images.debootstrap_command(arm, tmp_path, "http://mirror.invalid/debian", packages)
    assert command[:3] == ["debootstrap", "--arch=arm64", "--variant=minbase"]
    assert command[3] == f"--include={','.join(packages)}"
    assert command[-3:] == ["bookworm", str(tmp_path), "http://mirror.invalid/debian"]


DEB822 = """\
Types: deb
URIs: http://mirror.invalid/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.invalid/debian-security
Suites: bookworm-security
Components: main
"""


def test_mirror_from_deb822_sources(tmp_path, monkeypatch):
    monkeypatch.delenv("MOE_XARCH_DEBIAN_MIRROR", raising=False)
    sources = tmp_path / "debian.sources"
    sources.write_text(DEB822)
    assert debian_mirror("bookworm", [sources]) == "http://mirror.invalid/debian"


def test_mirror_from_one_line_sources(tmp_path, monkeypatch):
    monkeypatch.delenv("MOE_XARCH_DEBIAN_MIRROR", raising=False)
    sources = tmp_path / "sources.list"
    sources.write_text(
        "deb https://other.invalid/apt cloud-sdk-bookworm main\n"
        "# deb http://old.invalid/debian bookworm main\n"
        "deb [arch=amd64] http://mirror.invalid/debian bookworm main contrib\n"
    )
    assert debian_mirror("bookworm", [sources]) == "http://mirror.invalid/debian"


def test_a_release_the_host_does_not_list_comes_from_the_mirror_of_one_it_does(tmp_path, monkeypatch):
    monkeypatch.delenv("MOE_XARCH_DEBIAN_MIRROR", raising=False)
    sources = tmp_path / "debian.sources"
    sources.write_text(DEB822)
    assert debian_mirror("trixie", [sources]) == "http://mirror.invalid/debian"


def test_no_mirror_says_what_to_set(tmp_path, monkeypatch):
    monkeypatch.delenv("MOE_XARCH_DEBIAN_MIRROR", raising=False)
    with pytest.raises(host.HostSetupError, match="MOE_XARCH_DEBIAN_MIRROR"):
        debian_mirror("trixie", [tmp_path / "missing.list"])
    monkeypatch.setenv("MOE_XARCH_DEBIAN_MIRROR", "http://set.invalid/debian")
    assert debian_mirror("trixie", []) == "http://set.invalid/debian"


def test_remove_tree_removes_a_plain_directory(tmp_path):
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "hostname").write_text("x")
    images.remove_tree(root)
    assert not root.exists()
    images.remove_tree(root)  # absent: nothing to do
