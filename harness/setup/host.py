"""Host set-up: the Docker daemon, QEMU user emulation, debootstrap.

CI starts from a fresh machine with none of this running, so every run checks
and, as root, does what is missing: apt-get install, start dockerd, mount
binfmt_misc, register qemu-<arch> with the fix-binary flag (F: the kernel opens
the interpreter once, so it works inside containers without a copy there).
Anything it cannot do is reported as the exact commands to run. Idempotent.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from harness.common.errors import HarnessError
from harness.common.project import NAME
from harness.plan.runners import runner_for
from harness.setup import containers

if TYPE_CHECKING:
    from harness.plan.targets import Target

BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
DOCKERD_LOG = Path(tempfile.gettempdir()) / f"{NAME}-dockerd.log"
DOCKERD_PIDFILE = Path("/var/run/docker.pid")

# The ELF header magic and mask of each emulated architecture, as QEMU's
# scripts/qemu-binfmt-conf.sh registers them.
QEMU_BINFMT = {
    "aarch64": (
        r"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00",
        r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff",
    ),
}

# command -> the Debian package that provides it
PACKAGES = {
    "docker": "docker.io",
    "dockerd": "docker.io",
    "debootstrap": "debootstrap",
    "qemu-aarch64-static": "qemu-user-static",
}


def arch() -> str:
    """This machine's architecture, as the target table names it (uname -m)."""
    return platform.machine()


class HostSetupError(HarnessError):
    """The host lacks something the harness cannot provide; the message says what to run."""


def ca_bundle() -> Path:
    """The host's CA bundle: what pip and the containers must trust here."""
    candidates = [
        os.environ.get("SSL_CERT_FILE"),
        "/etc/ssl/certs/ca-certificates.crt",  # Debian's standard location
        ssl.get_default_verify_paths().cafile,
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise HostSetupError("No CA bundle found: set SSL_CERT_FILE to the host's CA bundle")


@dataclasses.dataclass(frozen=True)
class Needs:
    debootstrap: bool  # some image starts from a debootstrap root
    emulated_arches: tuple[str, ...]  # arches run under qemu-user

    @classmethod
    def of(cls, targets: Iterable[Target]) -> Needs:
        """What building and testing these targets in containers takes of the host."""
        targets = list(targets)
        return cls(debootstrap=any(not t.base_image for t in targets),
                   emulated_arches=tuple(t.arch for t in targets if runner_for(t).emulated))


@dataclasses.dataclass(frozen=True)
class HostState:
    is_root: bool
    has_apt: bool
    docker_answers: bool
    missing_commands: tuple[str, ...]
    binfmt_in_kernel: bool
    binfmt_mounted: bool
    qemu_registrations: dict[str, str | None]  # arch -> /proc/sys/fs/binfmt_misc entry text


@dataclasses.dataclass(frozen=True)
class Action:
    command: str  # the shell command a person would run
    run: Callable[[], None]


def interpreter(arch: str) -> str:
    return f"/usr/bin/qemu-{arch}-static"


def registration_line(arch: str) -> str:
    magic, mask = QEMU_BINFMT[arch]
    return f":qemu-{arch}:M::{magic}:{mask}:{interpreter(arch)}:FPC"


def registration_ok(arch: str, entry: str | None) -> bool:
    if entry is None:
        return False
    lines = entry.splitlines()
    flags = next((line.split(":", 1)[1] for line in lines if line.startswith("flags:")), "")
    return "enabled" in lines and f"interpreter {interpreter(arch)}" in lines and "F" in flags


def docker_answers() -> bool:
    try:
        info = subprocess.run(
            ["docker", "info"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return info.returncode == 0


def observe(needs: Needs) -> HostState:
    answers = shutil.which("docker") is not None and docker_answers()
    commands = ["docker"]
    if not answers:
        commands.append("dockerd")
    if needs.debootstrap:
        commands.append("debootstrap")
    commands += [f"qemu-{arch}-static" for arch in needs.emulated_arches]
    filesystems = Path("/proc/filesystems").read_text()
    return HostState(
        is_root=os.geteuid() == 0,
        has_apt=shutil.which("apt-get") is not None,
        docker_answers=answers,
        missing_commands=tuple(c for c in commands if shutil.which(c) is None),
        binfmt_in_kernel="binfmt_misc" in filesystems,
        binfmt_mounted=(BINFMT_DIR / "register").exists(),
        qemu_registrations={
            arch: (BINFMT_DIR / f"qemu-{arch}").read_text()
            if (BINFMT_DIR / f"qemu-{arch}").exists()
            else None
            for arch in needs.emulated_arches
        },
    )


def apt_install(packages: list[str]) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *packages], check=True, env=env)


_SERVICES: list[subprocess.Popen] = []


def _start_dockerd() -> None:
    if docker_answers():  # installing docker.io may have started one
        return
    # A pid file left by a killed daemon makes a new one refuse to start.
    if DOCKERD_PIDFILE.exists():
        pid = DOCKERD_PIDFILE.read_text().strip()
        if not pid.isdigit() or not Path(f"/proc/{pid}").exists():
            DOCKERD_PIDFILE.unlink()
    with DOCKERD_LOG.open("ab") as log:
        daemon = subprocess.Popen(
            ["dockerd"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,  # outlives this run, as a service would
        )
    # Held for the life of this process: a dropped handle to a running child warns when collected.
    _SERVICES.append(daemon)
    for _ in range(60):
        if docker_answers():
            return
        if daemon.poll() is not None:
            break
        time.sleep(1)
    tail = "\n".join(DOCKERD_LOG.read_text(errors="replace").splitlines()[-20:])
    raise HostSetupError(f"dockerd did not come up; the end of {DOCKERD_LOG}:\n{tail}")


def _mount_binfmt() -> None:
    subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT_DIR)], check=True)


def _register_qemu(arch: str) -> None:
    entry = BINFMT_DIR / f"qemu-{arch}"
    if entry.exists():
        entry.write_text("-1")  # removes the entry; registering anew is the only way to add F
    (BINFMT_DIR / "register").write_text(registration_line(arch))


def plan(state: HostState) -> list[Action]:
    """What to do, in order, to bring the host from `state` to ready."""
    actions: list[Action] = []
    packages = sorted({PACKAGES[command] for command in state.missing_commands})
    if packages:
        actions.append(
            Action(
                f"apt-get update && apt-get install -y --no-install-recommends {' '.join(packages)}",
                lambda: apt_install(packages),
            )
        )
    if not state.docker_answers:
        actions.append(Action(f"dockerd > {DOCKERD_LOG} 2>&1 &", _start_dockerd))
    if state.qemu_registrations and not state.binfmt_mounted:
        actions.append(
            Action(f"mount -t binfmt_misc binfmt_misc {BINFMT_DIR}", _mount_binfmt)
        )
    for arch, entry in state.qemu_registrations.items():
        if not registration_ok(arch, entry):
            command = f"printf '%s' '{registration_line(arch)}' > {BINFMT_DIR}/register"
            if entry is not None:
                command = f"echo -1 > {BINFMT_DIR}/qemu-{arch} && {command}"
            actions.append(Action(command, lambda arch=arch: _register_qemu(arch)))
    return actions


def blockers(state: HostState, actions: list[Action]) -> list[str]:
    """Why the harness cannot carry out `actions` itself (empty: it can)."""
    reasons = []
    if actions and not state.is_root:
        reasons.append("the set-up needs root, and this is not root")
    if state.missing_commands and not state.has_apt:
        reasons.append(
            f"{', '.join(state.missing_commands)} missing and no apt-get to install them "
            f"(Debian packages: {', '.join(sorted({PACKAGES[c] for c in state.missing_commands}))})"
        )
    if state.qemu_registrations and not state.binfmt_in_kernel:
        reasons.append(
            "this kernel has no binfmt_misc, so emulated targets cannot run here: "
            "pick native targets only (-- --arch x86_64) or use a kernel with CONFIG_BINFMT_MISC"
        )
    return reasons


def ensure_host(needs: Needs) -> None:
    state = observe(needs)
    actions = plan(state)
    if not actions:
        return
    reasons = blockers(state, actions)
    if reasons:
        raise HostSetupError(
            "This host is not ready for the harness: "
            + "; ".join(reasons)
            + ".\nRun as root:\n"
            + "\n".join(f"  {action.command}" for action in actions)
        )
    for action in actions:
        print(f"host set-up: {action.command}", flush=True)
        action.run()
    leftover = plan(observe(needs))
    if leftover:
        raise HostSetupError(
            "Host set-up ran but did not take; still to do:\n"
            + "\n".join(f"  {action.command}" for action in leftover)
        )


def prepare(targets: Iterable[Target]) -> None:
    """What every session that runs these targets' containers does first: the
    host set up for them, and the containers of killed runs removed."""
    ensure_host(Needs.of(targets))
    containers.remove_stale()
