"""What the deterministic benches (insn_count, mca) share: the check that repeated runs gave the same numbers,
and the report that states it."""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path


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


def meta(began: float, repeats: int, found: list[str]) -> dict[str, object]:
    """The report's common facts: when, how long since `began` (perf_counter), and whether the repeats agreed."""
    return {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "seconds": round(time.perf_counter() - began, 1), "repeats": repeats,
            "deterministic": not found if repeats > 1 else None, "differences": found}


def write_report(out: Path, name: str, document: dict, text: str, plot: Callable[[Path], Path],
                 counted: str = "") -> int:
    """Prints the table and writes out/<name>.json, .md and .png; says whether the repeats agreed.

    document["meta"] is meta()'s; the exit code is 1 where the repeats differed.
    """
    facts = document["meta"]
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(document, indent=2) + "\n")
    (out / f"{name}.md").write_text(text + "\n")
    try:
        path = plot(out / f"{name}.png")
    except ImportError as error:  # matplotlib absent: the numbers still stand
        print(f"no plot: {error}")
    else:
        print(f"wrote {path}")
    if facts["repeats"] > 1:
        print(f"deterministic over {facts['repeats']} runs: " + ("yes" if not facts["differences"] else "NO"))
        for line in facts["differences"]:
            print(f"  {line}")
    print(f"wrote {out / f'{name}.json'} and {out / f'{name}.md'}" + (f": {counted}" if counted else "")
          + f" in {facts['seconds']:.0f} s")
    return 1 if facts["differences"] else 0
