#!/bin/bash
# Runs nox from a venv of its own (created on first use), so that a fresh
# machine needs nothing but python3: ./nox.sh -s matrix
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv-nox"
if [[ ! -x "$venv/bin/nox" ]]; then
  echo "nox.sh: installing nox into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet "nox==2026.10.20"
fi
cd "$here"
exec "$venv/bin/nox" "$@"
