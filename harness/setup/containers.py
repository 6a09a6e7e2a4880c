"""The harness's containers: labelled with the run that owns them, so that a run
can remove what a killed earlier run left behind without touching a concurrent
run's containers (or anyone else's).

`docker run --rm` removes a container when it exits, but killing the docker
client does not stop the container, and a killed cibuildwheel never removes its
own: both are found here by label and removed at the start of the next run.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.common.project import NAME

OWNER_LABEL = f"org.{NAME}.owner"  # "<boot id>:<pid>" of the harness process


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def owner() -> str:
    return f"{boot_id()}:{os.getpid()}"


def owner_alive(value: str, current_boot: str) -> bool:
    """Whether the harness process that labelled a container still runs."""
    boot, _, pid = value.partition(":")
    return boot == current_boot and pid.isdigit() and Path(f"/proc/{pid}").exists()


def label_args() -> list[str]:
    return [f"--label={OWNER_LABEL}={owner()}"]


def container_name(*parts: str) -> str:
    """A docker-legal container name, unique to this process."""
    name = "-".join([NAME, *parts, str(os.getpid())])
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", name)


def remove_stale() -> list[str]:
    """Remove containers whose owning run is gone; return their names."""
    listing = subprocess.run(
        ["docker", "ps", "--all", f"--filter=label={OWNER_LABEL}",
         "--format", f'{{{{.Names}}}}\t{{{{.Label "{OWNER_LABEL}"}}}}'],
        check=True, capture_output=True, text=True,
    ).stdout
    current_boot = boot_id()
    stale = [
        name
        for name, _, value in (line.partition("\t") for line in listing.splitlines() if line)
        if not owner_alive(value, current_boot)
    ]
    if stale:
        print(f"removing containers left by a killed run: {', '.join(stale)}", flush=True)
        subprocess.run(["docker", "rm", "--force", *stale], check=True, stdout=subprocess.DEVNULL)
    return stale


def remove_owned() -> None:
    """Remove this run's own containers (an interrupted cibuildwheel leaves its own)."""
    listing = subprocess.run(
        ["docker", "ps", "--all", "--quiet", f"--filter=label={OWNER_LABEL}={owner()}"],
        capture_output=True, text=True,
    ).stdout.split()
    if listing:
        subprocess.run(["docker", "rm", "--force", *listing], stdout=subprocess.DEVNULL)


def remove(name: str) -> None:
    subprocess.run(
        ["docker", "rm", "--force", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


@contextmanager
def terminate_as_exit() -> Iterator[None]:
    """Turn SIGTERM into SystemExit for the duration, so that `finally` blocks
    (container removal, temporary directories) run when CI or a user kills the run."""

    def exit_on_term(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_on_term)
    try:
        yield
    except BaseException:
        remove_owned()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
