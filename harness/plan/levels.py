"""The ISA levels as the build declares them: csrc/generic/levels.def, then an
architecture's csrc/arch/<folder>/levels.def, one MOE_LEVEL row a level, lowest
first (csrc/generic/levels.def says how a row reads). CMakeLists.txt compiles each
level's files from the same rows, and the library builds its ladder from them."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from harness.common.errors import HarnessError
from harness.common.paths import REPO

GENERIC = "csrc/generic/levels.def"
# CMakeLists.txt's moe_levels() reads a row with the same pattern.
ROW = re.compile(r'MOE_LEVEL\(([a-z0-9_]+), .+, "[^"]*", "([^"]*)"\)')


@dataclasses.dataclass(frozen=True)
class Level:
    name: str
    files: tuple[str, ...]  # its kernel files, from the repository's root


def read_table(table: str, root: Path = REPO) -> list[Level]:
    """The rows of one table (a path from root)."""
    folder = Path(table).parent.as_posix()
    levels = []
    for number, line in enumerate((root / table).read_text().splitlines(), 1):
        if not line.startswith("MOE_LEVEL"):
            continue
        if not (row := ROW.fullmatch(line)):
            raise HarnessError(f'{table}:{number}: not a MOE_LEVEL(name, test, "flags", "files") row: {line}')
        levels.append(Level(row[1], tuple(f"{folder}/{name}" for name in row[2].split())))
    return levels


def ladder(folder: str, root: Path = REPO) -> tuple[Level, ...]:
    """The levels of the architecture whose kernels are in csrc/arch/<folder>/, lowest first."""
    return (*read_table(GENERIC, root), *read_table(f"csrc/arch/{folder}/levels.def", root))


def names(folder: str, root: Path = REPO) -> tuple[str, ...]:
    """Their isa() names, lowest first."""
    return tuple(level.name for level in ladder(folder, root))


def up_to(folder: str, top: str, root: Path = REPO) -> tuple[str, ...]:
    """Their names from generic up to top: the levels of a CPU whose highest is top."""
    ladder = names(folder, root)
    return ladder[:ladder.index(top) + 1]
