"""The determinism check of the deterministic figures: repeated runs must give the same numbers."""

from __future__ import annotations

from collections.abc import Sequence


def differences(repeats: Sequence[Sequence[dict[str, object]]], key: Sequence[str], figure: str,
                unit: str) -> list[str]:
    """Where a repeated run gave another `figure` than the first for a row (named by its `key` fields): empty
    when deterministic."""
    def name(row: dict[str, object]) -> tuple:
        return tuple(row[field] for field in key)

    first = {name(r): r[figure] for r in repeats[0]}
    found = []
    for number, rows in enumerate(repeats[1:], 2):
        figures = {name(r): r[figure] for r in rows}
        if figures.keys() != first.keys():
            found.append(f"run {number} measured other configurations")
        found += [f"run {number}, {' '.join(map(str, k))}: {figures[k]} {unit}, first run {first[k]}"
                  for k in first if k in figures and figures[k] != first[k]]
    return found
