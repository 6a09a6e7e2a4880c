"""The GitHub Actions matrix, generated from the target table.

`nox -s gha-matrix` prints it as JSON; the workflows read it with fromJSON, so
adding a target to the target table adds its CI jobs. Every target
builds and tests on a runner of its own architecture ("native"); a target whose
table runner is qemu also gets "emulated" jobs on an x86_64 runner, one per
builder in its row (cibuildwheel with the carried compiler, the cross build,
cibuildwheel fully under QEMU): the paths this
harness takes on a developer's machine (CPU models via QEMU_CPU).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.building import builders
from harness.common.paths import PYPROJECT
from harness.plan.runners import runner_for
from harness.plan.targets import Target, load_targets

# GitHub's hosted runner images per architecture.
RUNNERS = {"x86_64": "ubuntu-24.04", "aarch64": "ubuntu-24.04-arm"}
EMULATING_RUNNER = RUNNERS["x86_64"]


def matrix(targets: Mapping[str, Target]) -> dict[str, Any]:
    native = [
        {"arch": arch, "os": RUNNERS[arch], "test-session": target.test_session, "mode": "native",
         "builder": builders.choose(target, [], arch)[0].name}
        for arch, target in targets.items()
    ]
    emulated = [
        {"arch": arch, "os": EMULATING_RUNNER, "test-session": target.test_session, "mode": "qemu",
         "builder": builder, "cpu-models": " ".join(model.name for model in target.cpu_models)}
        for arch, target in targets.items()
        if runner_for(target).emulated
        for builder in target.builders
    ]
    return {"native": {"include": native}, "emulated": {"include": emulated}}


def matrix_json(pyproject: Path = PYPROJECT) -> str:
    return json.dumps(matrix(load_targets(pyproject)), separators=(",", ":"))


NOX_CALL = re.compile(r"""\bnox["')]*\s+(?:-[^s\s]\S*\s+)*(?:-s|--sessions?)\s+(.*)""")


def nox_sessions_called(text: str) -> set[str]:
    """Session names after every `nox ... -s` in a workflow's commands (comments ignored)."""
    names: set[str] = set()
    for line in text.splitlines():
        code = line.split(" #", 1)[0]
        if code.lstrip().startswith("#"):
            continue
        for match in NOX_CALL.finditer(code):
            for word in match.group(1).split():
                if word in ("--", "&&", "||", ";", "|", ">>", ">") or word.startswith("-"):
                    break
                names.add(word.strip("'\"`)"))
    return names
