"""What the suite's forces_levels tests check of one level, in one process forced to it.

The level is chosen once per process (MOE_XARCH_ISA), so each level the CPU supports
needs a process of its own; under QEMU each start imports torch for 10-20 s, so one
process per level does every check (conftest.py's forced_levels fixture starts them):

    level_runner.py DIR [--pack]

prints, one JSON line each as it goes, ``{"isa": moe_xarch.isa()}`` and then, per
method of PACKED_METHODS, ``{"method": name, "outcome": text}``: "same answer" (the
reference's, within the method's tolerance), the op's refusal (its message), or what
else went wrong. The methods use the problems in DIR/problems.pt; ``--pack`` (the run
at the best level) first makes them, weights packed under this process's level.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import torch

import moe_xarch
from moe_xarch import MoeCompMethod, reference
from moe_xarch.testing import assert_matches_reference, make_moe_problem

# Both 4-bit methods pack alike (packed_layout.h): one of them stands for both.
PACKED_METHODS = {
    "unquant": MoeCompMethod.UNQUANT,
    "int8": MoeCompMethod.INT8_W8A8,
    "fp8": MoeCompMethod.FP8_W8A16,
    "int4": MoeCompMethod.INT4_W4A8,
}
SAME_ANSWER = "same answer"


def _say(**fact: str) -> None:
    print(json.dumps(fact), flush=True)  # a later crash leaves the facts said so far


def pack(path: Path) -> None:
    problems = {}
    for name, method in PACKED_METHODS.items():
        problem = make_moe_problem(5, 64, 64, 2, 2, torch.bfloat16, method, seed=15)
        problems[name] = {"kwargs": problem.kwargs(packed=True), "expected": problem.run(reference.fused_experts)}
    torch.save(problems, path)


def use(name: str, saved: dict) -> str:
    try:
        actual = moe_xarch.fused_experts(**saved["kwargs"])
    except RuntimeError as error:
        return str(error)
    try:
        assert_matches_reference(actual, saved["expected"], PACKED_METHODS[name], torch.bfloat16)
    except AssertionError:
        return f"a wrong answer: {traceback.format_exc(limit=0).strip()}"
    return SAME_ANSWER


def main(directory: str, *options: str) -> None:
    _say(isa=moe_xarch.isa())
    path = Path(directory) / "problems.pt"
    if "--pack" in options:
        pack(path)
    problems = torch.load(path, weights_only=False)
    for name in PACKED_METHODS:
        _say(method=name, outcome=use(name, problems[name]))


if __name__ == "__main__":
    main(*sys.argv[1:])
