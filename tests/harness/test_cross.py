from __future__ import annotations

import os
from pathlib import Path

from harness.building import cross
from tests.harness.wheelfiles import elf_header, make_wheel


def test_cross_env_points_cmake_the_pin_and_the_tag_at_the_target(arm, tmp_path):
    env = cross.cross_env(tmp_path, arm, tmp_path / "torch")
    assert env["CMAKE_TOOLCHAIN_FILE"] == str(tmp_path / "cmake" / "aarch64-linux-gnu.cmake")
    assert env["MOE_TORCH_DIR"] == str(tmp_path / "torch")
    assert env["_PYTHON_HOST_PLATFORM"] == "linux-aarch64"


def test_the_toolchain_file_the_env_names_exists(arm, repo_root):
    assert cross.toolchain_file(repo_root, arm).is_file()
    assert cross.compiler(arm) == "aarch64-linux-gnu-g++"


def test_repair_is_cibuildwheels_repair_command(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[tool.cibuildwheel]\nrepair-wheel-command = "auditwheel repair --exclude libtorch.so '
        '-w {dest_dir} {wheel}"\n'
    )
    assert cross.repair_command(pyproject, "/raw/m.whl", "/out") == [
        "auditwheel", "repair", "--exclude", "libtorch.so", "-w", "/out", "/raw/m.whl"
    ]


def test_pip_wheel_builds_without_isolation_or_dependencies(tmp_path):
    argv = cross.pip_wheel_command("py", tmp_path / "tree", tmp_path / "out")
    assert argv[:4] == ["py", "-m", "pip", "wheel"]
    assert {"--no-build-isolation", "--no-deps"} <= set(argv) and argv[-1] == str(tmp_path / "tree")


def fake_torch_wheel(directory: Path) -> Path:
    return make_wheel(directory, "torch", "2.10.0", "cp311-cp311-manylinux_2_28_aarch64", files={
        "torch/version.py": b"__version__ = '2.10.0'\n",
        "torch/include/c10/x.h": b"",
        "torch/lib/libc10.so": elf_header("aarch64"),
        "torch/_C/big.py": b"",  # not needed to compile: left out
    })


def test_torch_dir_unpacks_headers_libraries_and_version_once(arm, tmp_path, monkeypatch):
    downloads = []

    def fake_run(argv, **kwargs):
        downloads.append(argv)
        (dest,) = [arg.removeprefix("--dest=") for arg in argv if arg.startswith("--dest=")]
        fake_torch_wheel(Path(dest))

    monkeypatch.setattr(cross.subprocess, "run", fake_run)
    torch = cross.torch_dir(arm, tmp_path)
    assert (torch / "version.py").is_file() and (torch / "include" / "c10" / "x.h").is_file()
    assert (torch / "lib" / "libc10.so").is_file() and not (torch / "_C").exists()
    assert cross.torch_dir(arm, tmp_path) == torch and len(downloads) == 1
    assert sorted(os.listdir(tmp_path)) == ["torch-2.10.0-aarch64"]
