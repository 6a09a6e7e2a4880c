"""What the suite's forces_levels tests check of each level, in a process forced to it.

The level is chosen once per process (MOE_XARCH_ISA), when the library loads, so
each level needs a process of its own; under QEMU each start of Python imports
torch for 10-20 s. So this script imports torch (and not moe_xarch) once, then
forks one child per level named on its command line, in order, one at a time:

    level_runner.py DIR LEVEL [LEVEL...]

Each child sets MOE_XARCH_ISA to its level, imports moe_xarch (loading the library,
which chooses its path then), and prints, one JSON line each as it goes,
``{"level": L, "isa": moe_xarch.isa()}`` and, per method of PACKED_METHODS,
``{"level": L, "method": name, "outcome": text}``: "same answer" (the reference's,
within the method's tolerance), the op's refusal (its message), or what else went
wrong. The methods use the problems in DIR/problems.pt, which the first level's
child makes, weights packed under its level. A child's stderr goes to
DIR/<level>.stderr; when it has ended this process prints
``{"level": L, "exit": code}`` (a signal's number negated, as subprocess does).
"""

from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import sys
import traceback
from pathlib import Path

import torch

# Both 4-bit methods pack alike (packed_layout.h): one of them stands for both.
# By their moe_xarch.MoeCompMethod names: only the children may import moe_xarch.
PACKED_METHODS = {"unquant": "UNQUANT", "int8": "INT8_W8A8", "fp8": "FP8_W8A16", "int4": "INT4_W4A8"}
SAME_ANSWER = "same answer"
LEVEL_VARIABLE = "MOE_XARCH_ISA"


def _say(**fact: object) -> None:
    print(json.dumps(fact), flush=True)  # a later crash leaves the facts said so far


def _pack(path: Path) -> None:
    from moe_xarch import MoeCompMethod, reference
    from moe_xarch.testing import make_moe_problem

    problems = {}
    for name, method in PACKED_METHODS.items():
        problem = make_moe_problem(5, 64, 64, 2, 2, torch.bfloat16, MoeCompMethod[method], seed=15)
        problems[name] = {"kwargs": problem.kwargs(packed=True), "expected": problem.run(reference.fused_experts)}
    torch.save(problems, path)


def _use(name: str, saved: dict) -> str:
    import moe_xarch
    from moe_xarch import MoeCompMethod
    from moe_xarch.testing import assert_matches_reference

    try:
        actual = moe_xarch.fused_experts(**saved["kwargs"])
    except RuntimeError as error:
        return str(error)
    try:
        assert_matches_reference(actual, saved["expected"], MoeCompMethod[PACKED_METHODS[name]], torch.bfloat16)
    except AssertionError:
        return f"a wrong answer: {traceback.format_exc(limit=0).strip()}"
    return SAME_ANSWER


def _child(directory: Path, level: str, packs: bool) -> None:
    os.environ[LEVEL_VARIABLE] = level
    import moe_xarch

    _say(level=level, isa=moe_xarch.isa())
    path = directory / "problems.pt"
    if packs:
        _pack(path)
    problems = torch.load(path, weights_only=False)
    for name in PACKED_METHODS:
        _say(level=level, method=name, outcome=_use(name, problems[name]))


def _fork(directory: Path, level: str, packs: bool) -> int:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            with open(directory / f"{level}.stderr", "w") as stderr:
                os.dup2(stderr.fileno(), 2)
                faulthandler.enable()  # a crash's traceback, as pytest's own processes print
                try:
                    _child(directory, level, packs)
                    code = 0
                except BaseException:  # noqa: BLE001 - reported in its stderr, as a process's would be
                    traceback.print_exc()
                sys.stdout.flush()
                sys.stderr.flush()
        finally:
            _leave(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _leave(code: int) -> None:
    """End a child, never back into the parent's code. os._exit skips the library's
    destructors, where gcov writes its counts: under `nox -s coverage`, which sets
    GCOV_PREFIX, the C library's exit runs them."""
    if "GCOV_PREFIX" in os.environ:
        ctypes.CDLL(None).exit(code)
    os._exit(code)


def main(directory: str, *levels: str) -> None:
    for index, level in enumerate(levels):
        _say(level=level, exit=_fork(Path(directory), level, packs=index == 0))


if __name__ == "__main__":
    main(*sys.argv[1:])
