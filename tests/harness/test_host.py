from __future__ import annotations

import pytest

from harness.setup import host
from harness.setup.host import HostState, blockers, plan, registration_line, registration_ok

GOOD_ENTRY = "enabled\ninterpreter /usr/bin/qemu-aarch64-static\nflags: POCF\noffset 0\n"
DEBIAN_ENTRY = "enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: POC\n"


def state(**changes) -> HostState:
    ready = dict(
        is_root=True, has_apt=True, docker_answers=True, missing_commands=(),
        binfmt_in_kernel=True, binfmt_mounted=True, qemu_registrations={"aarch64": GOOD_ENTRY},
    )
    ready.update(changes)
    return HostState(**ready)


def commands(s: HostState) -> list[str]:
    return [action.command for action in plan(s)]


def test_a_ready_host_needs_nothing():
    assert plan(state()) == []


def test_a_fresh_machine_gets_everything_in_order():
    fresh = state(
        docker_answers=False,
        missing_commands=("dockerd", "debootstrap", "qemu-aarch64-static"),
        binfmt_mounted=False,
        qemu_registrations={"aarch64": None},
    )
    got = commands(fresh)
    assert got[0] == (
        "apt-get update && apt-get install -y --no-install-recommends "
        "debootstrap docker.io qemu-user-static"
    )
    assert got[1].startswith("dockerd > ")
    assert got[2] == "mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc"
    assert got[3] == f"printf '%s' '{registration_line('aarch64')}' > /proc/sys/fs/binfmt_misc/register"
    assert blockers(fresh, plan(fresh)) == []


def test_a_registration_without_fix_binary_is_replaced():
    got = commands(state(qemu_registrations={"aarch64": DEBIAN_ENTRY}))
    assert got == [
        "echo -1 > /proc/sys/fs/binfmt_misc/qemu-aarch64 && "
        f"printf '%s' '{registration_line('aarch64')}' > /proc/sys/fs/binfmt_misc/register"
    ]


def test_registration_checks_interpreter_flags_and_state():
    assert registration_ok("aarch64", GOOD_ENTRY)
    assert not registration_ok("aarch64", DEBIAN_ENTRY)
    assert not registration_ok("aarch64", GOOD_ENTRY.replace("enabled", "disabled"))
    assert not registration_ok("aarch64", None)


def test_registration_line_is_qemus_aarch64_entry_with_fpc():
    line = registration_line("aarch64")
    assert line.startswith(r":qemu-aarch64:M::\x7fELF\x02\x01\x01")
    assert line.endswith(":/usr/bin/qemu-aarch64-static:FPC")


def test_native_only_runs_leave_binfmt_alone():
    assert plan(state(binfmt_mounted=False, qemu_registrations={})) == []


def test_not_root_is_told_what_to_run():
    s = state(is_root=False, docker_answers=False)
    assert blockers(s, plan(s)) == ["the set-up needs root, and this is not root"]


def test_no_apt_names_the_packages():
    s = state(has_apt=False, missing_commands=("debootstrap",))
    (reason,) = blockers(s, plan(s))
    assert "no apt-get" in reason and "debootstrap" in reason


def test_no_binfmt_in_kernel_says_to_pick_native_targets():
    s = state(binfmt_in_kernel=False, binfmt_mounted=False, qemu_registrations={"aarch64": None})
    assert any("--arch x86_64" in reason for reason in blockers(s, plan(s)))


def test_ensure_host_raises_with_the_commands(monkeypatch):
    s = state(is_root=False, docker_answers=False)
    monkeypatch.setattr(host, "observe", lambda needs: s)
    with pytest.raises(host.HostSetupError) as error:
        host.ensure_host(host.Needs(debootstrap=True, emulated_arches=("aarch64",)))
    assert "Run as root:\n  dockerd > " in str(error.value)


def test_ensure_host_runs_the_plan_then_checks_again(monkeypatch):
    states = iter([state(docker_answers=False), state()])
    monkeypatch.setattr(host, "observe", lambda needs: next(states))
    started = []
    monkeypatch.setattr(host, "_start_dockerd", lambda: started.append(True))
    host.ensure_host(host.Needs(debootstrap=False, emulated_arches=()))
    assert started == [True]


def test_prepare_sets_up_the_host_for_the_targets_then_removes_stale_containers(monkeypatch):
    steps = []
    monkeypatch.setattr(host, "ensure_host", lambda needs: steps.append(("host", needs)))
    monkeypatch.setattr(host.containers, "remove_stale", lambda: steps.append(("stale", None)) or [])
    target = type("T", (), {"arch": "aarch64", "base_image": None, "runner": "qemu"})()
    monkeypatch.setattr(host, "runner_for", lambda t: type("R", (), {"emulated": True})())
    host.prepare([target])
    assert steps == [("host", host.Needs(debootstrap=True, emulated_arches=("aarch64",))), ("stale", None)]


def test_ca_bundle_prefers_ssl_cert_file(tmp_path, monkeypatch):
    bundle = tmp_path / "bundle.crt"
    bundle.write_text("x")
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    assert host.ca_bundle() == bundle


def test_the_needs_of_targets_are_debootstrap_for_a_root_of_its_own_and_qemu_for_emulated_ones():
    from harness.plan.targets import load_targets

    targets = load_targets()
    emulated = [t for t in targets.values() if t.runner == "qemu"]
    needs = host.Needs.of(targets.values())
    assert needs.emulated_arches == tuple(t.arch for t in emulated) and emulated
    assert needs.debootstrap == any(not t.base_image for t in targets.values())
    assert host.Needs.of([]) == host.Needs(debootstrap=False, emulated_arches=())
