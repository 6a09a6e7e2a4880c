"""The kernel suite on the host, once per ISA level this CPU supports.

For a nox session whose virtualenv has the package installed:

    harness.running.native.run_kernel_suite(session, session.posargs)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from harness.common.errors import HarnessError
from harness.common.project import ENV_PREFIX, SUPPORTED_ISAS
from harness.plan.runners import NATIVE
from harness.plan.targets import load_targets
from harness.setup import host


def host_torch_requirement() -> str:
    """The torch the target table names for this machine's architecture."""
    targets = load_targets()
    machine = host.arch()
    if machine not in targets:
        raise HarnessError(f"no target in the table for this host's architecture {machine}")
    return targets[machine].torch


class Session(Protocol):
    """The part of nox.Session used here."""

    def run(self, *args: str, **kwargs: object) -> object: ...


def suite_runs(levels: Sequence[str], pytest_args: Sequence[str]) -> list[tuple[dict[str, str], list[str]]]:
    """(environment, command) for each level, as the native back-end runs it."""
    return [
        (
            # Natively there is time for the whole matrix, not only its covering array.
            {**dict(NATIVE.env(level)), f"{ENV_PREFIX}_TEST_STRENGTH": "full"},
            ["python", "-m", "pytest", "tests/kernels", "-p", "no:cacheprovider", *pytest_args],
        )
        for level in levels
    ]


def run_kernel_suite(session: Session, pytest_args: Sequence[str] = ()) -> None:
    output = session.run("python", "-c", SUPPORTED_ISAS, silent=True)
    levels = str(output).split()
    print(f"kernel suite natively under: {', '.join(levels)}", flush=True)
    for env, command in suite_runs(levels, pytest_args):
        session.run(*command, env=env)
