"""The level tables as the harness reads them (harness/plan/levels.py)."""

from __future__ import annotations

import pytest

from harness.common.errors import HarnessError
from harness.plan import levels


def write_tables(root, arm: str) -> None:
    (root / "csrc/generic").mkdir(parents=True)
    (root / "csrc/generic/levels.def").write_text('MOE_LEVEL(generic, true, "", "a.cpp b.cpp")\n')
    (root / "csrc/arch/arm").mkdir(parents=True)
    (root / "csrc/arch/arm/levels.def").write_text(arm)


def test_a_ladder_is_generic_then_the_arch_table_with_each_levels_files(tmp_path):
    write_tables(tmp_path, '// MOE_LEVEL(not, a, "row", "")\n'
                           'MOE_LEVEL(neon, f.asimd, "-march=armv8-a", "gemm_neon.cpp")\n'
                           'MOE_LEVEL(i8mm, f.i8mm && f.bf16, "neon -march=x", "")\n')
    assert levels.ladder("arm", tmp_path) == (
        levels.Level("generic", ("csrc/generic/a.cpp", "csrc/generic/b.cpp")),
        levels.Level("neon", ("csrc/arch/arm/gemm_neon.cpp",)),
        levels.Level("i8mm", ()))
    assert levels.names("arm", tmp_path) == ("generic", "neon", "i8mm")


def test_a_malformed_row_is_named_with_its_table_and_line(tmp_path):
    write_tables(tmp_path, 'MOE_LEVEL(neon, f.asimd, "-march=armv8-a", "gemm_neon.cpp")\n'
                           'MOE_LEVEL(dotprod, f.asimddp, -march=armv8.2-a, "gemm_dotprod.cpp")\n')
    with pytest.raises(HarnessError, match=r"^csrc/arch/arm/levels.def:2: not a MOE_LEVEL\(name, test, "):
        levels.ladder("arm", tmp_path)

