"""Running commands with visible progress, and timing each step of a run.

Long steps (debootstrap, docker build, an emulated compile) print every line of
their output prefixed with the step's label and the time since it started, so
a CI log shows what is happening and for how long.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path


class CommandFailed(RuntimeError):
    def __init__(self, label: str, argv: Sequence[str], returncode: int, first_error: str = ""):
        said = f"; first error: {first_error}" if first_error else ""
        super().__init__(f"{label}: {argv[0]} exited with {returncode}{said}")
        self.argv = list(argv)
        self.returncode = returncode
        self.first_error = first_error


# A compiler's or CMake's error line (gcc, clang, ld through collect2, cmake).
_ERROR_LINE = re.compile(r"\berror:|^CMake Error")


def first_error_line(line: str) -> str:
    """line if it reports an error, with the build tree's path before csrc/ dropped."""
    if not _ERROR_LINE.search(line):
        return ""
    return re.sub(r"\S*/(?=csrc/)", "", line.strip())


def clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes:02d}:{seconds:02d}"


_running: set[int] = set()  # sessions (leader pids) of the commands running now, in any thread


def session_members(session: int, proc: Path = Path("/proc")) -> list[int]:
    """The processes of a session: every process a command started, whatever group it is in."""
    members = []
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)"
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[3]) == session:
            members.append(int(stat.parent.name))
    return members


def kill_session(session: int) -> None:
    # Killing the leader alone leaves debootstrap's chroot or the compilers running, and
    # ninja gives each compiler a process group of its own: the session holds them all.
    for pid in [session, *session_members(session)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def stop_all() -> None:
    """Kill every command still running (an interrupted run's background work)."""
    for session in list(_running):
        kill_session(session)


def _kill(process: subprocess.Popen[str]) -> None:
    kill_session(process.pid)
    process.wait()


def run_streamed(
    argv: Sequence[str],
    label: str,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    check: bool = True,
    timeout: float | None = None,
) -> int:
    """Run argv, echoing each output line as `[label mm:ss] line`; return its exit code.

    On timeout the process is killed and the exit code is 124 (as timeout(1)). A
    failure raised (check) names the output's first error line, a compiler's above all.
    """
    start = time.monotonic()
    print(f"[{label} 00:00] $ {shlex.join(argv)}", flush=True)
    full_env = {**os.environ, **env} if env is not None else None
    with subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=full_env,
        cwd=cwd,
        text=True,
        errors="replace",
        bufsize=1,
        start_new_session=True,  # its own session, so that all of it can be stopped
    ) as process:

        first_error = ""

        def echo() -> None:
            nonlocal first_error
            assert process.stdout is not None
            for line in process.stdout:
                print(f"[{label} {clock(time.monotonic() - start)}] {line.rstrip()}", flush=True)
                first_error = first_error or first_error_line(line)

        # A thread echoes, so that a silent, hung process still meets its timeout.
        echoer = threading.Thread(target=echo, daemon=True)
        echoer.start()
        _running.add(process.pid)
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(process)
            returncode = 124
        except BaseException:  # interrupted: stop the children before the pipe closes
            _kill(process)
            echoer.join()
            raise
        finally:
            _running.discard(process.pid)
        echoer.join()
    if check and returncode != 0:
        raise CommandFailed(label, argv, returncode, first_error)
    return returncode


@dataclasses.dataclass
class StepTime:
    name: str
    seconds: float
    outcome: str  # "done", "reused" or "failed"


@dataclasses.dataclass
class StepLog:
    """The wall time of every step of a run, for the closing summary."""

    steps: list[StepTime] = dataclasses.field(default_factory=list)
    started: float = dataclasses.field(default_factory=time.monotonic)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[StepTime]:
        """Time a step; the body may set `.outcome = "reused"` when it skipped the work."""
        print(f"==> {name}", flush=True)
        record = StepTime(name, 0.0, "done")
        start = time.monotonic()
        try:
            yield record
        except BaseException:
            record.outcome = "failed"
            raise
        finally:
            record.seconds = time.monotonic() - start
            self.steps.append(record)
            print(f"<== {name}: {record.outcome} in {clock(record.seconds)}", flush=True)

    def table(self) -> str:
        lines = ["| step | outcome | wall time |", "| --- | --- | ---: |"]
        lines += [f"| {s.name} | {s.outcome} | {clock(s.seconds)} |" for s in self.steps]
        # Steps can overlap (images made in the background), so the total is wall time.
        lines.append(f"| total (wall time) | | {clock(time.monotonic() - self.started)} |")
        return "\n".join(lines)


@contextlib.contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on lock_path: two runs never build the same thing at
    once, and a killed run's lock goes with its process."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            note(f"waiting for another run to finish with {lock_path.name}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def note(message: str) -> None:
    print(f"--- {message}", file=sys.stderr, flush=True)
