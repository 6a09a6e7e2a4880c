"""Every level of every ladder gets a run: the target table, checked before any build.

A level is run where the table selects it: a native target runs each of its
isa-levels that the host has, an emulated one the level of each CPU model. A level
that no run of the table selects is named in the target's proven-elsewhere, with
where its record comes from (a machine that has it: harness/proving/prove.py); otherwise
the table is refused, naming the level. The ladders are the build's own declaration
of each architecture's levels (the level tables, harness/plan/levels.py); the publish
gate then counts the levels the built library reports (harness/proving/gate.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from harness.plan import levels
from harness.plan.runners import runner_for
from harness.plan.targets import ARCHES, TableError, Target


def declared_ladders() -> Mapping[str, tuple[str, ...]]:
    """Each architecture's levels, lowest first, as the level tables declare them."""
    return {arch: levels.names(spec.sources) for arch, spec in ARCHES.items()}


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
