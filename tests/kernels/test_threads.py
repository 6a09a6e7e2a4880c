"""The ops parallelize on torch's own OpenMP runtime.

at::parallel_for is inline: a library built without OpenMP compiles its
parallel regions away and runs every op on one thread, which no answer shows.
So these tests read what the library links, and what the process maps.
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
def test_library_opens_openmp_parallel_regions() -> None:
    # The import of libgomp's entry point, in the dynamic symbol table.
    assert b"GOMP_parallel" in LIBRARY_PATH.read_bytes()


def test_one_openmp_runtime_in_the_process() -> None:
    """The library uses torch's libgomp: a second runtime would ignore torch.set_num_threads."""
    problem = make_moe_problem(4, 64, 32, 4, 2, torch.bfloat16, MoeCompMethod.UNQUANT, seed=3)
    moe_xarch.fused_experts(**problem.kwargs())
    maps = Path("/proc/self/maps").read_text().splitlines()
    runtimes = {line.split()[-1] for line in maps if "libgomp" in line.rsplit("/", 1)[-1]}
    assert len(runtimes) == 1, runtimes
