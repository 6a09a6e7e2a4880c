"""A record from any machine: which levels a run tests, and what the environment
account (docker/environment.py) reads of the library and the CPU."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from harness.common.errors import HarnessError
from harness.common.paths import DOCKER
from harness.plan.runners import planned_runs
from harness.plan.targets import load_targets
from harness.proving import prove
from harness.setup import host
from tests.harness.conftest import REPO

spec = importlib.util.spec_from_file_location("environment", DOCKER / "environment.py")
assert spec and spec.loader
environment = importlib.util.module_from_spec(spec)
spec.loader.exec_module(environment)

X86 = ["generic", "avx2", "avx512", "avx512_bf16", "amx"]


def test_every_level_the_cpu_has_by_default():
    assert prove.levels_to_run(X86, ["generic", "avx2"], "") == ["generic", "avx2"]
    assert prove.levels_to_run(X86, X86, "") == X86


def test_levels_limits_the_run_in_ladder_order():
    assert prove.levels_to_run(X86, X86, "amx, generic") == ["generic", "amx"]


@pytest.mark.parametrize(("asked", "problem"), [
    ("avx512", "--levels avx512: this CPU cannot run it; it runs generic, avx2"),
    ("sve", "--levels sve: the library has no such level; it has generic, avx2, avx512, avx512_bf16, amx"),
])
def test_a_level_the_cpu_or_library_lacks_is_refused(asked, problem):
    with pytest.raises(HarnessError, match=problem):
        prove.levels_to_run(X86, ["generic", "avx2"], asked)


def test_an_emulated_target_runs_natively_one_run_per_level():
    arm = prove.native_target(load_targets(REPO / "pyproject.toml")["aarch64"], ["generic", "neon"])
    assert [(run.cpu, run.isa, dict(run.env)["MOE_XARCH_ISA"]) for run in planned_runs(arm, ["generic", "neon"])] == [
        ("host", "generic", "generic"), ("host", "neon", "neon")]


def test_a_wrong_wheel_is_refused_without_a_traceback(tmp_path):
    wheel = tmp_path / "moe_xarch-0.1-py3-none-manylinux_2_28_riscv64.whl"
    wheel.write_bytes(b"")
    result = subprocess.run([sys.executable, "-m", "harness.proving.prove", "--wheel", str(wheel), "--out", str(tmp_path / "o")],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr == f"prove: --wheel {wheel.name}: not a moe_xarch wheel for this machine's {host.arch()}\n"


def test_the_cpu_is_named_with_its_flags():
    x86 = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu avx2 amx_tile\n\n" \
          "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu avx2 amx_tile\n"
    assert environment.cpu_description(x86) == ("Intel(R) Xeon(R) Platinum 8480+", ["amx_tile", "avx2", "fpu"])
    arm = "processor\t: 0\nFeatures\t: fp asimd i8mm\nCPU implementer\t: 0x41\nCPU part\t: 0xd49\n"
    assert environment.cpu_description(arm) == ("CPU implementer 0x41 CPU part 0xd49", ["asimd", "fp", "i8mm"])
