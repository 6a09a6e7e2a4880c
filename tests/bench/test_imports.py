"""benchmarks/ imports without a circle: each module's own imports, at any depth (a function's too), form no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def own_imports(source: str, modules: set[str]) -> set[str]:
    """The benchmarks modules a module's source imports, wherever the import statement stands."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "benchmarks":
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[1] for alias in node.names if alias.name.startswith("benchmarks.")}
    return found & modules


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each import cycle once, as the modules along it, starting from its smallest name."""
    found: set[tuple[str, ...]] = set()

    def walk(path: list[str]) -> None:
        for module in sorted(graph[path[-1]]):
            if module in path:
                cycle = path[path.index(module):]
                start = cycle.index(min(cycle))
                found.add(tuple(cycle[start:] + cycle[:start]))
            else:
                walk([*path, module])

    for module in graph:
        walk([module])
    return [list(cycle) for cycle in sorted(found)]


def import_graph() -> dict[str, set[str]]:
    modules = {path.stem for path in BENCHMARKS.glob("*.py")}
    return {path.stem: own_imports(path.read_text(), modules) for path in BENCHMARKS.glob("*.py")}


def test_cycles_are_found_wherever_the_import_stands() -> None:
    ab = "from benchmarks.moe_bench import METHODS\n"
    moe_bench = "def main():\n    from benchmarks import ab\n"
    modules = {"ab", "moe_bench", "plot"}
    graph = {"ab": own_imports(ab, modules), "moe_bench": own_imports(moe_bench, modules), "plot": set()}
    assert graph == {"ab": {"moe_bench"}, "moe_bench": {"ab"}, "plot": set()}
    assert cycles(graph) == [["ab", "moe_bench"]]


def test_benchmarks_import_no_circle() -> None:
    graph = import_graph()
    assert {"moe_bench", "ab", "workload", "contenders", "rooflines", "report"} <= set(graph)
    assert cycles(graph) == []
    # The A/B reads the workload and the contenders; the bench's CLI is not one of its parts.
    assert "moe_bench" not in graph["ab"]
