"""The ops parallelize on torch's own threads.

The library's parallel regions are torch's parallel_for, reached through the
stable ABI, so torch.set_num_threads rules them. A library that lost them would
run every op on one thread, which no answer shows: so these tests read what the
library imports, and what the process maps.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import moe_xarch
from moe_xarch import MoeCompMethod
from moe_xarch._library import LIBRARY_PATH
from moe_xarch.testing import make_moe_problem


@pytest.mark.level_independent
def test_library_runs_its_parallel_regions_on_torch() -> None:
    # The import of the stable ABI's parallel_for, in the dynamic symbol table.
    assert b"torch_parallel_for" in LIBRARY_PATH.read_bytes()


def test_one_openmp_runtime_in_the_process() -> None:
    """Only torch's libgomp: a second runtime would ignore torch.set_num_threads."""
    problem = make_moe_problem(4, 64, 32, 4, 2, torch.bfloat16, MoeCompMethod.UNQUANT, seed=3)
    moe_xarch.fused_experts(**problem.kwargs())
    maps = Path("/proc/self/maps").read_text().splitlines()
    runtimes = {line.split()[-1] for line in maps if "libgomp" in line.rsplit("/", 1)[-1]}
    assert len(runtimes) == 1, runtimes
