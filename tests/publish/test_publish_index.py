"""nox -s publish against a real pypiserver: refusals, failures and re-runs.

Each test checks the message a user sees AND what the index holds afterwards.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from packaging.utils import parse_wheel_filename

from harness.building import versioning
from harness.proving import gate, records
from tests.publish.support import (
    PASSWORD,
    CuttingProxy,
    Index,
    Release,
    copy_release,
    free_port,
    make_sdist,
    make_wheel,
    passing_runs,
    publish_env,
    run_publish,
    sealed_record,
    start_index,
    uploader_env,
    write_manifest,
)


def _sha(release: Release) -> dict[str, str]:
    import hashlib

    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in release.files()}


def test_publishes_every_file_and_a_rerun_uploads_nothing(index: Index, release: Release) -> None:
    first = run_publish(release, uploader_env(index))
    assert first.returncode == 0, first.stderr
    assert index.stored() == _sha(release)
    assert "3 uploaded, 0 already there" in first.stdout
    mtimes = {p.name: p.stat().st_mtime_ns for p in index.packages.iterdir()}

    again = run_publish(release, uploader_env(index))
    assert again.returncode == 0, again.stderr
    assert "0 uploaded, 3 already there" in again.stdout
    assert {p.name: p.stat().st_mtime_ns for p in index.packages.iterdir()} == mtimes
    assert PASSWORD not in first.stdout + first.stderr + again.stdout + again.stderr


def test_no_destination_is_an_error_that_says_what_to_set(release: Release) -> None:
    result = run_publish(release, publish_env())
    assert result.returncode == 1
    assert "No destination index" in result.stderr
    assert "TWINE_REPOSITORY_URL" in result.stderr and "TWINE_REPOSITORY=" in result.stderr


def test_dry_run_shows_what_would_go_where_and_uploads_nothing(index: Index, release: Release) -> None:
    result = run_publish(release, uploader_env(index), "--dry-run")
    assert result.returncode == 0, result.stderr
    assert index.url in result.stdout
    for path in release.files():
        assert path.name in result.stdout
    for digest in _sha(release).values():
        assert digest in result.stdout
    # which machine proved each level of each wheel
    assert "| aarch64 | neon | Test CPU (qemu, test) a64fx |" in result.stdout
    assert "| x86_64 | amx | Test CPU (native, test) host |" in result.stdout
    assert "TWINE_USERNAME/TWINE_PASSWORD from the environment" in result.stdout
    assert PASSWORD not in result.stdout + result.stderr
    assert index.stored() == {}


def test_wrong_password_uploads_nothing_and_says_so(index: Index, release: Release) -> None:
    result = run_publish(release, uploader_env(index, password="not-the-password"))
    assert result.returncode == 1
    assert "refused the credentials" in result.stderr
    assert "NOT on the index" in result.stderr
    assert "not-the-password" not in result.stdout + result.stderr
    assert index.stored() == {}


def test_index_down_is_reported_before_any_upload(tmp_path: Path, release: Release) -> None:
    down = f"http://127.0.0.1:{free_port()}/"
    result = run_publish(release, publish_env(TWINE_REPOSITORY_URL=down, TWINE_USERNAME="u",
                                              TWINE_PASSWORD=PASSWORD))
    assert result.returncode == 1
    assert "is not reachable" in result.stderr and "nothing was uploaded" in result.stderr


def test_interrupted_upload_reports_the_index_state_and_a_rerun_completes(
    index: Index, release: Release
) -> None:
    proxy = CuttingProxy(index.port, whole=1)
    try:
        env = uploader_env(index)
        env["TWINE_REPOSITORY_URL"] = proxy.url
        env["MOE_XARCH_INDEX_URL"] = index.simple  # asking what is there still works
        cut = run_publish(release, env)
    finally:
        proxy.close()
    assert proxy.cut == 1
    assert cut.returncode == 1
    first, *rest = release.files()
    assert f"on the index                   {first.name}" in cut.stderr
    for path in rest:
        assert f"NOT on the index               {path.name}" in cut.stderr
    assert "Run nox -s publish again" in cut.stderr
    assert "ConnectionError" in cut.stderr and "Traceback" not in cut.stderr  # the cause, not twine's stack
    # consistent: the one file that went up is whole, nothing half-written
    assert index.stored() == {first.name: _sha(release)[first.name]}

    rerun = run_publish(release, uploader_env(index))
    assert rerun.returncode == 0, rerun.stderr
    assert "2 uploaded, 1 already there" in rerun.stdout
    assert index.stored() == _sha(release)


def test_same_version_with_other_bytes_is_refused(tmp_path: Path, index: Index, release: Release) -> None:
    assert run_publish(release, uploader_env(index)).returncode == 0
    before = index.stored()

    rebuilt = copy_release(release, tmp_path / "rebuilt")
    wheel = make_wheel(rebuilt.wheelhouse, "x86_64", payload=b"# rebuilt\n")
    rebuilt.wheels["x86_64"] = wheel
    write_manifest(rebuilt.reports, rebuilt.wheels)
    result = run_publish(rebuilt, uploader_env(index))
    assert result.returncode == 1
    assert "already on the index with different files" in result.stderr
    assert wheel.name in result.stderr and "Nothing was uploaded" in result.stderr
    assert index.stored() == before


def test_version_present_with_a_file_not_in_this_release_is_refused(
    tmp_path: Path, index: Index, release: Release
) -> None:
    assert run_publish(release, uploader_env(index)).returncode == 0
    before = index.stored()
    other = copy_release(release, tmp_path / "other")
    other.wheels["x86_64"].unlink()
    other.wheels["x86_64"] = make_wheel(other.wheelhouse, "x86_64", glibc="2_28")
    write_manifest(other.reports, other.wheels)
    result = run_publish(other, uploader_env(index))
    assert result.returncode == 1
    assert "not part of this release" in result.stderr
    assert index.stored() == before


def test_untested_or_failed_wheels_are_refused(index: Index, release: Release) -> None:
    runs = {"aarch64": [r | {"result": "FAILED: 2 failed"} if r["cpu"] == "max" else r
                        for r in passing_runs("aarch64")]}
    write_manifest(release.reports, release.wheels, runs)
    result = run_publish(release, uploader_env(index))
    assert result.returncode == 1
    assert "aarch64" in result.stderr and "max/i8mm: FAILED: 2 failed" in result.stderr

    for record in records.records_dir(release.reports).glob("x86_64-*.json"):
        record.unlink()
    result = run_publish(release, uploader_env(index))
    assert "no test record for this exact file (nox -s test-x86_64 tests it, or python -m harness.proving.prove" in result.stderr
    assert index.stored() == {}


def test_wheels_whose_runs_ran_other_tests_are_refused(index: Index, release: Release) -> None:
    """Each arch's own runs passed, but a test skipped on one aarch64 model only: the
    same-tests verdict, checked across the architectures' records, refuses the release."""
    skipped = "tests/kernels/test_a.py::test_two"
    runs = {"aarch64": [r | {"tests": r["tests"] | {skipped: "skipped"}} if r["cpu"] == "a64fx" else r
                        for r in passing_runs("aarch64")]}
    write_manifest(release.reports, release.wheels, runs)
    result = run_publish(release, uploader_env(index))
    assert result.returncode == 1
    assert f"not the same tests: {skipped}: passed on" in result.stderr
    assert "skipped on aarch64 (Test CPU (qemu, test)) CPU a64fx, ISA neon" in result.stderr

    old_record = next(records.records_dir(release.reports).glob("aarch64-*.json"))
    old_record.write_text(json.dumps({"wheels": {}}))  # the format before records carried one
    result = run_publish(release, uploader_env(index))
    assert result.returncode == 1
    assert f"{old_record}: unknown record format None; this checkout reads {records.FORMAT}" in result.stderr
    assert index.stored() == {}


def test_runs_that_did_not_run_are_not_compared(tmp_path: Path) -> None:
    """A level this CPU lacks records no tests: it is not a run that ran other tests."""
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(b"w")
    runs = passing_runs("x86_64")
    runs[-1] = runs[-1] | {"result": "not supported by this CPU", "passed": 0, "tests": {}}
    release = [sealed_record(wheel, "x86_64", runs), sealed_record(wheel, "aarch64")]
    assert gate.same_tests_problems(release, ()) == []
    runs[-1] = runs[-1] | {"result": "passed"}
    release[0] = sealed_record(wheel, "x86_64", runs)
    assert gate.same_tests_problems(release, ())[0].startswith("not the same tests: tests/kernels/test_a.py")


def test_a_missing_or_extra_wheel_is_refused(index: Index, release: Release) -> None:
    extra = make_wheel(release.wheelhouse, "x86_64", version="1.0.1")
    result = run_publish(release, uploader_env(index))
    assert result.returncode == 1
    assert "x86_64: expected exactly one wheel" in result.stderr
    os.unlink(extra)
    os.unlink(release.wheels["aarch64"])
    result = run_publish(release, uploader_env(index))
    assert "aarch64: expected exactly one wheel" in result.stderr and "found none" in result.stderr
    assert index.stored() == {}


def test_a_named_repository_from_pypirc(tmp_path: Path, index: Index, release: Release) -> None:
    pypirc = tmp_path / "pypirc"
    pypirc.write_text(f"[distutils]\nindex-servers = local\n\n[local]\nrepository = {index.url}\n"
                      f"username = uploader\n")
    env = publish_env(TWINE_REPOSITORY="local", TWINE_PASSWORD=PASSWORD)
    env["TWINE_CONFIG_FILE"] = str(pypirc)
    result = run_publish(release, env)
    assert result.returncode == 0, result.stderr
    assert index.stored() == _sha(release)
    missing = run_publish(release, env | {"TWINE_REPOSITORY": "nowhere"})
    assert missing.returncode == 1 and "Missing 'nowhere' section" in missing.stderr


def test_an_sdist_of_another_version_is_replaced_by_the_trees(index: Index, release: Release) -> None:
    """An sdist an earlier tree left in wheelhouse/ is not published: the tree's
    own is built (here at the wheels' version) in its place."""
    version = str(parse_wheel_filename(release.wheels["x86_64"].name)[1])
    release.sdist.unlink()
    stale = make_sdist(release.wheelhouse, version="0.0.1")
    result = run_publish(release, uploader_env(index) | {versioning.VARIABLE: version}, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert f"removing {stale.name}" in result.stdout and not stale.exists()
    assert release.sdist.exists() and release.sdist.name in result.stdout


def test_an_index_that_sends_the_project_to_another_server_is_refused(
    tmp_path: Path, index: Index, release: Release
) -> None:
    """pypiserver's fallback would have another index's files (PyPI's own
    moe-xarch) taken for this index's."""
    forwarding = start_index(tmp_path / "forwarding", fallback=index.simple)
    try:
        result = run_publish(release, uploader_env(forwarding))
    finally:
        forwarding.stop()
    assert result.returncode == 1
    assert "on to another server" in result.stderr and "--disable-fallback" in result.stderr
    assert forwarding.stored() == {} and index.stored() == {}
