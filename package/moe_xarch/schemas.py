"""The canonical op schemas, read from schemas.txt (the registration reads the same file)."""

from __future__ import annotations

from pathlib import Path

SCHEMA_FILE = Path(__file__).with_name("schemas.txt")


def _read_schemas() -> dict[str, str]:
    schemas = {}
    for line in SCHEMA_FILE.read_text().splitlines():
        if line.strip():
            schemas[line.split("(", 1)[0]] = line.strip()
    return schemas


SCHEMAS: dict[str, str] = _read_schemas()
