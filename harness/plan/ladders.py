"""Every level of every ladder gets a run: the target table, checked before any build.

A level is run where the table selects it: a native target runs each of its
isa-levels that the host has, an emulated one the level of each CPU model. A level
that no run of the table selects is named in the target's proven-elsewhere, with
where its record comes from (a machine that has it: harness/proving/prove.py); otherwise
the table is refused, naming the level. The ladders are the package's own
declaration of each architecture's levels (expected_kernels.ARCHITECTURE_LEVELS);
the publish gate then counts the levels the built library reports (harness/proving/gate.py).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

from harness.common.paths import PACKAGE_SOURCES
from harness.common.project import PACKAGE
from harness.plan.runners import runner_for
from harness.plan.targets import TableError, Target

DECLARATION = PACKAGE_SOURCES / PACKAGE / "expected_kernels.py"
LADDERS = "ARCHITECTURE_LEVELS"


def declared_ladders(path: Path = DECLARATION) -> Mapping[str, tuple[str, ...]]:
    """Each architecture's levels, lowest first, read from the package's sources (a
    literal there) without importing the package, which loads the compiled library."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == LADDERS:
            return ast.literal_eval(node.value)
    raise TableError(f"{path}: no {LADDERS} literal to read the levels from")


def selected(target: Target) -> dict[str, str]:
    """level -> the table's run that selects it."""
    if not runner_for(target).emulated:
        return {level: "the host, where it has it" for level in target.isa_levels}
    return {model.isa: f"CPU model {model.name}" for model in target.cpu_models}


def check_table(targets: Mapping[str, Target], ladders: Mapping[str, tuple[str, ...]]) -> None:
    for target in targets.values():
        ladder, runs, elsewhere = ladders[target.arch], selected(target), dict(target.proven_elsewhere)
        if unknown := [level for level in [*runs, *elsewhere] if level not in ladder]:
            raise TableError(f"{target.where}: {', '.join(unknown)}: no level of {target.arch} "
                             f"(its levels: {', '.join(ladder)})")
        if twice := [level for level in elsewhere if level in runs]:
            raise TableError(f"{target.where}: proven-elsewhere names {', '.join(twice)}, which "
                             f"{', '.join(runs[level] for level in twice)} runs here: drop it from proven-elsewhere")
        if unrun := [level for level in ladder if level not in runs and level not in elsewhere]:
            raise TableError(
                f"{target.where}: no run of the table selects {', '.join(unrun)}, which the {target.arch} wheel "
                f"ships: add a CPU model (or isa-level) that selects it, or declare where it is proven: "
                f"proven-elsewhere = {{ {unrun[0]} = \"...\" }}")
