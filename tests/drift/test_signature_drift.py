"""The defect this project exists to catch, caught.

An aarch64 kernel definition that keeps the old 13-argument fused_experts_cpu
(w1_bias, w2_bias, alpha, limit gone), or a registration that differs on one
architecture, must fail the aarch64 build with a message naming the op and the
architecture. Each case edits a scratch copy of the tree, cross-compiles only
the translation unit concerned, and is paired with the unedited tree compiling
the same unit, so a failure can only come from the drift.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.building import cross
from harness.plan.targets import load_targets

REPO = Path(__file__).resolve().parents[2]
ARM_OPS = "csrc/arch/arm/ops.cpp"
REGISTER = "csrc/register.cpp"
NEW_PARAMETERS = re.compile(
    r"\s*const std::optional<Tensor>& w1_bias, const std::optional<Tensor>& w2_bias,"
    r"\s*std::optional<double> alpha, std::optional<double> limit,"
)


@pytest.fixture(scope="module")
def aarch64():
    return load_targets(REPO / "pyproject.toml")["aarch64"]


@pytest.fixture(scope="module")
def torch_dir(aarch64, tmp_path_factory):
    cache = REPO / ".cache" / "cross"
    return cross.torch_dir(aarch64, cache)


def compile_unit(tree: Path, build: Path, aarch64, torch_dir, source: str):
    result = cross.compile_sources(tree, build, aarch64, torch_dir, [source])
    return result.returncode, result.stdout + result.stderr


def drop_new_parameters(tree: Path) -> None:
    path = tree / ARM_OPS
    text, count = NEW_PARAMETERS.subn("", path.read_text())
    assert count == 1, "the aarch64 definition no longer has the expected parameter list"
    text = text.replace("w1_bias, w2_bias, alpha, limit, is_vnni", "std::nullopt, std::nullopt, "
                        "std::nullopt, std::nullopt, is_vnni")
    path.write_text(text)


def register_legacy_kernel_on_aarch64(tree: Path) -> None:
    """aarch64 alone registers a kernel that kept the 13-argument signature."""
    path = tree / REGISTER
    shared = "MOE_XARCH_IMPL(m, fused_experts_cpu, moe_xarch::fused_experts_cpu);"
    legacy = (
        "#if defined(__aarch64__)\n"
        "  MOE_XARCH_IMPL(m, fused_experts_cpu, legacy_fused_experts_cpu);\n"
        "#else\n"
        f"  {shared}\n"
        "#endif"
    )
    declaration = (
        "using moe_xarch::Tensor;\n"
        "Tensor legacy_fused_experts_cpu(const Tensor&, const Tensor&, const Tensor&,\n"
        "    const Tensor&, const Tensor&, bool, int64_t, const std::optional<Tensor>&,\n"
        "    const std::optional<Tensor>&, const std::optional<Tensor>&,\n"
        "    const std::optional<Tensor>&, const std::optional<std::vector<int64_t>>&, bool);\n"
    )
    text = path.read_text()
    assert shared in text
    anchor = "STABLE_TORCH_LIBRARY(moe_xarch, m) {"
    path.write_text(text.replace(shared, legacy).replace(anchor, declaration + anchor))


@pytest.mark.parametrize(
    ("source", "edit", "where"),
    [(ARM_OPS, drop_new_parameters, "csrc/arch/arm/ops.cpp"),
     (REGISTER, register_legacy_kernel_on_aarch64, "aarch64 build")],
    ids=["aarch64-definition-with-13-arguments", "registration-differs-on-aarch64"],
)
def test_aarch64_drift_fails_the_build(tmp_path, aarch64, torch_dir, scratch_tree, source, edit, where):
    pristine_code, pristine_log = compile_unit(REPO, tmp_path / "pristine", aarch64, torch_dir, source)
    assert pristine_code == 0, pristine_log

    tree = scratch_tree(tmp_path / "tree")
    edit(tree)
    code, log = compile_unit(tree, tmp_path / "drifted", aarch64, torch_dir, source)
    assert code != 0, "the drifted aarch64 source compiled"
    errors = [line for line in log.splitlines() if "error" in line]
    assert any("fused_experts_cpu" in line for line in errors), log
    assert any(where in line for line in errors), log
