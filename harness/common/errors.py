"""Errors a user fixes (a setting, a missing step, host set-up, a full disk), as
opposed to bugs: nox shows their message alone, without a traceback."""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class HarnessError(RuntimeError):
    """Its message says what is wrong and what to do."""


class PublishError(HarnessError):
    """Publishing refused or failed; the message says why and what to do."""


# errno -> (what happened, what to do about it)
_WRITE_FAULTS = {
    errno.ENOSPC: ("the file system is full", "free space there"),
    errno.EDQUOT: ("the disk quota is used up", "free space there"),
    errno.EROFS: ("the file system is read-only", "make it writable (remount it read-write)"),
    errno.EACCES: ("permission denied", "make it writable for this user"),
    errno.EPERM: ("operation not permitted", "make it writable for this user"),
    errno.ENOENT: ("the directory is gone (removed during the run?)", "make sure nothing removes it"),
    errno.ENOTDIR: ("it is not a directory", "remove or rename what is there"),
}


# Less free space than this where a command wrote is named as a likely cause of its failure.
LOW_SPACE_MIB = 512


def free_mib(directory: Path) -> float | None:
    """Free space on directory's file system (or its nearest existing parent's)."""
    for existing in (directory, *directory.parents):
        if existing.is_dir():
            return shutil.disk_usage(existing).free / 2**20
    return None


def low_space(*directories: Path) -> str:
    """"; only N MiB free in D" for each directory short of space, else ""."""
    return "".join(f"; only {free:.1f} MiB free in {directory} (a full disk?)" for directory in directories
                   if (free := free_mib(directory)) is not None and free < LOW_SPACE_MIB)


@contextmanager
def writing(directory: Path, rerun: str) -> Iterator[None]:
    """Turn a failed write in directory into a HarnessError that says what
    happened and what to do, ending with the command (rerun) to run again."""
    try:
        yield
    except OSError as error:
        what, fix = _WRITE_FAULTS.get(error.errno, (error.strerror or str(error), "fix that"))
        if error.errno in (errno.ENOSPC, errno.EDQUOT) and (free := free_mib(directory)) is not None:
            what += f", {free:.1f} MiB free"
        raise HarnessError(f"could not write in {directory}: {what}: {fix}, then run {rerun} again") from None
