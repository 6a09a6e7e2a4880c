"""A CI matrix that leaves a target out of what the workflows read, caught.

harness/gha.py's matrix() still has every target, so tests of it pass; but the
JSON `nox -s gha-matrix` prints, which ci.yml's jobs read with fromJSON, is made
by matrix_json(). A scratch copy of the tree whose matrix_json() drops the aarch64
target must fail tests/harness/test_gha.py's check of the printed matrix, naming
the target and the jobs it lost.
"""

from __future__ import annotations

from harness.plan.targets import load_targets
from tests.drift.support import drift_source
from tests.harness.test_gha import WORKFLOW, keys_read, matrix_problems, printed_matrix

SOURCE = "harness/gha.py"
PRISTINE = "return json.dumps(matrix(load_targets(pyproject)), separators=(\",\", \":\"))"
DRIFTED = ("return json.dumps(matrix({arch: target for arch, target in load_targets(pyproject).items()\n"
           "                           if arch != \"aarch64\"}), separators=(\",\", \":\"))")


def test_a_printed_matrix_without_the_aarch64_target_fails_naming_it(tmp_path, scratch_tree):
    tree = scratch_tree(tmp_path / "tree")
    targets = load_targets(tree / "pyproject.toml")
    keys = keys_read((tree / WORKFLOW).read_text())
    assert matrix_problems(printed_matrix(tree), targets, keys) == []

    drift_source(tree, SOURCE, PRISTINE, DRIFTED)
    problems = matrix_problems(printed_matrix(tree), targets, keys)
    aarch64 = targets["aarch64"]
    assert problems == ["aarch64: 0 native jobs, not 1",
                        f"aarch64: emulated jobs of builders [], not one of each of {list(aarch64.builders)}"]
