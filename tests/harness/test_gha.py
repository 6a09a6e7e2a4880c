"""The CI matrix as the workflows read it: what `nox -s gha-matrix` prints.

ci.yml's matrix job captures the session's stdout into a step output
(`echo "json=$(nox -s gha-matrix)"`) and the native and emulated jobs read it
with fromJSON. So these tests run the session itself, as a process, and parse
what it printed: every target of the table in the native jobs, every qemu
target in the emulated jobs (one per builder of its row, each with every CPU
model), and every key the jobs read present in each row.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from harness.building import builders
from harness.plan.targets import Target, load_targets
from tests.harness.conftest import REPO

WORKFLOW = Path(".github") / "workflows" / "ci.yml"
# A job of ci.yml: its name at two spaces, up to the next one.
JOB = re.compile(r"^  ([\w-]+):\n((?:(?!  \S).*\n|\n)*)", re.MULTILINE)
FROM_JSON = re.compile(r"matrix: \$\{\{ fromJSON\(needs\.matrix\.outputs\.json\)\.(\w+) \}\}")
# matrix.<key> in an expression; needs.matrix.outputs is the matrix job's output, not a key.
MATRIX_KEY = re.compile(r"(?<![\w.])matrix\.([\w-]+)")


def printed_matrix(repo: Path) -> str:
    """The stdout of `nox -s gha-matrix` in the tree `repo` (the nox running these tests)."""
    result = subprocess.run([sys.executable, "-m", "nox", "--noxfile", str(repo / "noxfile.py"), "-s", "gha-matrix"],
                            cwd=repo, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def keys_read(workflow: str) -> dict[str, set[str]]:
    """{part of the matrix (native, emulated): the matrix keys the job reading it uses}."""
    parts = {}
    for job, text in JOB.findall(workflow.split("\njobs:\n", 1)[1]):
        if part := FROM_JSON.search(text):
            parts[part.group(1)] = set(MATRIX_KEY.findall(text))
    return parts


def matrix_problems(printed: str, targets: Mapping[str, Target], keys: Mapping[str, set[str]]) -> list[str]:
    """What the printed matrix lacks, for a workflow that reads `keys`; [] when nothing."""
    lines = printed.strip().splitlines()
    if len(lines) != 1:
        return [f"not one line of JSON (a step output is one line): {len(lines)} lines"]
    matrix = json.loads(lines[0])
    problems = [f"no '{part}' matrix, which a job reads" for part in keys if part not in matrix]
    rows = {part: matrix.get(part, {}).get("include", []) for part in keys}
    for part, part_rows in rows.items():
        problems += [f"{part} row {row} lacks {sorted(keys[part] - set(row))}"
                     for row in part_rows if not keys[part] <= set(row)]
    native = [row.get("arch") for row in rows.get("native", [])]
    for arch, target in targets.items():
        if native.count(arch) != 1:
            problems.append(f"{arch}: {native.count(arch)} native jobs, not 1")
        emulated = {row.get("builder"): row for row in rows.get("emulated", []) if row.get("arch") == arch}
        expected = list(target.builders) if target.runner == "qemu" else []
        if sorted(emulated) != sorted(expected) or len(emulated) != sum(
                row.get("arch") == arch for row in rows.get("emulated", [])):
            problems.append(f"{arch}: emulated jobs of builders {sorted(emulated)}, not one of each of {expected}")
        models = [model.name for model in target.cpu_models]
        problems += [f"{arch} emulated by {builder}: CPU models {row.get('cpu-models')!r}, not {' '.join(models)!r}"
                     for builder, row in emulated.items() if str(row.get("cpu-models", "")).split() != models]
    return problems


def test_the_printed_matrix_has_every_target_as_the_workflows_read_it() -> None:
    targets = load_targets(REPO / "pyproject.toml")
    keys = keys_read((REPO / WORKFLOW).read_text())
    assert set(keys) == {"native", "emulated"} and all(keys.values()), keys
    assert matrix_problems(printed_matrix(REPO), targets, keys) == []


def test_the_printed_native_jobs_build_with_each_targets_first_builder() -> None:
    targets = load_targets(REPO / "pyproject.toml")
    native = json.loads(printed_matrix(REPO))["native"]["include"]
    assert {row["arch"]: row["builder"] for row in native} == {
        arch: builders.choose(target, [], arch)[0].name for arch, target in targets.items()}


def test_the_check_names_what_a_matrix_leaves_out(arm) -> None:
    keys = {"native": {"arch", "os"}, "emulated": {"arch", "builder", "cpu-models"}}
    emulated = [{"arch": "aarch64", "builder": builder, "cpu-models": " ".join(m.name for m in arm.cpu_models)}
                for builder in arm.builders]
    whole = {"native": {"include": [{"arch": "aarch64", "os": "ubuntu-24.04-arm"}]}, "emulated": {"include": emulated}}
    assert matrix_problems(json.dumps(whole), {"aarch64": arm}, keys) == []
    assert matrix_problems(json.dumps(whole, indent=1), {"aarch64": arm}, keys)[0].startswith("not one line")
    no_native = {**whole, "native": {"include": []}}
    assert matrix_problems(json.dumps(no_native), {"aarch64": arm}, keys) == ["aarch64: 0 native jobs, not 1"]
    one_model = {**whole, "emulated": {"include": [{**emulated[0], "cpu-models": arm.cpu_models[0].name},
                                                  *emulated[1:]]}}
    assert [p.split(":")[0] for p in matrix_problems(json.dumps(one_model), {"aarch64": arm}, keys)] == [
        f"aarch64 emulated by {arm.builders[0]}"]
    twice = {**whole, "emulated": {"include": emulated + emulated[:1]}}
    assert matrix_problems(json.dumps(twice), {"aarch64": arm}, keys)[0].startswith(
        "aarch64: emulated jobs of builders")
    no_keys = {**whole, "native": {"include": [{"arch": "aarch64"}]}}
    assert matrix_problems(json.dumps(no_keys), {"aarch64": arm}, keys) == [
        "native row {'arch': 'aarch64'} lacks ['os']"]
