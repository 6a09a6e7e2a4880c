"""The workflows call only real nox sessions, cover every target, pin every action."""

from __future__ import annotations

import ast
import fnmatch
import re

from harness import gha
from tests.publish.support import REPO, TARGETS

WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))


def noxfile_sessions() -> set[str]:
    names = set()
    for node in ast.parse((REPO / "noxfile.py").read_text()).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            call = decorator if isinstance(decorator, ast.Call) else None
            target = call.func if call else decorator
            if isinstance(target, ast.Attribute) and target.attr == "session":
                named = [k.value.value for k in (call.keywords if call else []) if k.arg == "name"]
                names.add(named[0] if named else node.name)
    return names


def test_every_nox_session_a_workflow_calls_exists() -> None:
    sessions = noxfile_sessions()
    called = {name for path in WORKFLOWS for name in gha.nox_sessions_called(path.read_text())}
    matrix_sessions = {row["test-session"] for rows in gha.matrix(TARGETS).values() for row in rows["include"]}
    assert {"lint", "tests", "build", "gha-matrix", "publish", "test-publish", "coverage"} <= called
    assert called - {"$TEST_SESSION"} <= sessions
    assert matrix_sessions <= sessions


def test_the_session_parser_reads_the_usual_forms() -> None:
    text = 'run: nox -s lint\nrun: sudo -E "$(command -v nox)" -s build -- --arch "$ARCH"\nrun: nox -s tests matrix'
    assert gha.nox_sessions_called(text) == {"lint", "build", "tests", "matrix"}


def test_every_target_is_in_the_generated_matrix() -> None:
    generated = gha.matrix(TARGETS)
    assert {row["arch"] for row in generated["native"]["include"]} == set(TARGETS)
    assert {row["arch"] for row in generated["emulated"]["include"]} == {
        arch for arch, target in TARGETS.items() if target.runner == "qemu"}
    assert all(row["os"] == gha.RUNNERS[row["arch"]] for row in generated["native"]["include"])
    assert "ubuntu-24.04-arm" in {row["os"] for row in generated["native"]["include"]}


def test_workflows_read_the_matrix_with_fromjson_and_pin_actions_by_sha() -> None:
    ci = (REPO / ".github/workflows/ci.yml").read_text()
    assert "fromJSON(needs.matrix.outputs.json).native" in ci
    assert "fromJSON(needs.matrix.outputs.json).emulated" in ci
    for path in WORKFLOWS:
        for uses in re.findall(r"uses:\s*(\S+)", path.read_text()):
            if not uses.startswith("./"):
                assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", uses), f"{path.name}: {uses}"


def _artifact_steps(text: str, action: str) -> list[str]:
    """The name: or pattern: of every step that uses actions/<action>."""
    found, inside = [], False
    for line in text.splitlines():
        if f"actions/{action}@" in line:
            inside = True
        elif inside and line.lstrip().startswith("- "):
            inside = False
        elif inside and (match := re.match(r"\s+(?:name|pattern):\s*(.+?)\s*$", line)):
            found.append(match.group(1))
            inside = False
    return found


def test_every_downloaded_artifact_is_uploaded_for_every_target() -> None:
    """publish needs one wheel and one test record per target: the patterns that
    release.yml and the publish tests download must match the names ci.yml uploads,
    for every target (a pattern that names one target, as the upper-levels job's
    does, for that one)."""
    ci = (REPO / ".github/workflows/ci.yml").read_text()
    rows = [row for rows in gha.matrix(TARGETS).values() for row in rows["include"]]
    uploaded = {re.sub(r"\$\{\{\s*matrix\.([\w-]+)\s*\}\}", lambda m, row=row: str(row[m.group(1)]), name)
                for name in _artifact_steps(ci, "upload-artifact") for row in rows}
    for path in WORKFLOWS:
        for pattern in _artifact_steps(path.read_text(), "download-artifact"):
            matched = fnmatch.filter(uploaded, pattern)
            assert matched, f"{path.name}: no job uploads an artifact matching {pattern}"
            if pattern.startswith(("wheel-", "reports-")):
                named = pattern.split("-")[1]
                targets = {named} if named in TARGETS else set(TARGETS)
                assert {name.split("-")[1] for name in matched} == targets, f"{path.name}: {pattern}"
