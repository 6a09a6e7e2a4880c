from __future__ import annotations

import os
import signal
import subprocess

import pytest

from harness.setup import containers


def test_owner_is_alive_only_for_a_running_pid_of_this_boot():
    boot = containers.boot_id()
    assert containers.owner_alive(containers.owner(), boot)
    assert not containers.owner_alive(f"other-boot:{os.getpid()}", boot)
    assert not containers.owner_alive(f"{boot}:999999999", boot)
    assert not containers.owner_alive("", boot)


def test_container_names_are_docker_legal_and_per_process():
    name = containers.container_name("test", "aarch64-max/i8mm")
    assert name == f"moe-xarch-test-aarch64-max-i8mm-{os.getpid()}"


def test_remove_stale_removes_only_containers_of_dead_runs(monkeypatch):
    boot = containers.boot_id()
    listing = (
        f"moe-xarch-test-a-1\t{boot}:999999999\n"
        f"cibuildwheel-x\t{containers.owner()}\n"
        f"moe-xarch-test-b-2\told-boot:{os.getpid()}\n"
    )
    calls = []

    def fake_run(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 0, stdout=listing)

    monkeypatch.setattr(subprocess, "run", fake_run)
    assert containers.remove_stale() == ["moe-xarch-test-a-1", "moe-xarch-test-b-2"]
    assert f"--filter=label={containers.OWNER_LABEL}" in calls[0]
    assert calls[1] == ["docker", "rm", "--force", "moe-xarch-test-a-1", "moe-xarch-test-b-2"]


def test_sigterm_becomes_system_exit_so_cleanup_runs(monkeypatch):
    removed = []
    monkeypatch.setattr(containers, "remove_owned", lambda: removed.append(True))
    cleaned = []
    with pytest.raises(SystemExit) as stop:
        with containers.terminate_as_exit():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
            finally:
                cleaned.append(True)
    assert stop.value.code == 128 + signal.SIGTERM and cleaned == [True] and removed == [True]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
