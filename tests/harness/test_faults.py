"""Faults the harness cannot fix itself end in one message that says what happened
and what to do (a HarnessError, which nox prints alone), leave no half-written
file, and a run after the fault is fixed recovers.

Real faults: tmpfs mounts that are full or read-only (so these tests run as
root, as the harness does), damaged and foreign zip files, pip itself, and a
Docker image removed while in use (Docker is set up as the harness does it).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import struct
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from packaging.utils import parse_wheel_filename

from harness.building import build, builders, cross
from harness.common import console
from harness.common.errors import HarnessError
from harness.plan.targets import Target, load_targets
from harness.proving import records
from harness.publishing import publish
from harness.setup import host, images, tools, wheels
from harness.setup.images import image_in_use
from harness.setup.wheels import download_closure, read_wheel
from tests.harness.wheelfiles import elf_header, make_wheel, project_wheel, truncate
from tests.publish.support import make_sdist, publish_env, write_manifest
from tests.publish.support import make_wheel as release_wheel

REPO = Path(__file__).resolve().parents[2]
BUILD_AGAIN = "run nox -s build -- --arch x86_64"


def one_message(error: pytest.ExceptionInfo[HarnessError], *says: str) -> str:
    """The error is one line that names what happened and what to do."""
    message = str(error.value)
    assert "\n" not in message, message
    for part in says:
        assert part in message, (part, message)
    return message


# --- a full, read-only or missing wheelhouse --------------------------------------------


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """mount(size, read_only=False): a real tmpfs of that size; unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.fail("mounting a tmpfs needs root; the harness runs as root")
    mounted: list[Path] = []

    def make(size: str, read_only: bool = False) -> Path:
        point = tmp_path / f"wheelhouse-{len(mounted)}"
        point.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], check=True)
        mounted.append(point)
        return point

    yield make
    for point in mounted:
        subprocess.run(["umount", str(point)], check=True)


def remount(point: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(point)], check=True)


@pytest.fixture
def big_wheel(tmp_path: Path) -> Path:
    """The builder's kept wheel, larger than a 1 MiB file system."""
    return make_wheel(tmp_path / "kept", tag="py3-none-manylinux_2_28_x86_64",
                      files={"moe_xarch/blob.bin": os.urandom(2 << 20)})


def test_a_full_wheelhouse_is_one_message_leaves_nothing_and_a_rerun_recovers(mount, big_wheel):
    wheelhouse = mount("1m")
    with pytest.raises(HarnessError) as error:
        build.replace_in_wheelhouse(big_wheel, wheelhouse, "x86_64")
    one_message(error, str(wheelhouse), "the file system is full", "MiB free", "free space there",
                "nox -s build -- --arch x86_64 again")
    assert list(wheelhouse.iterdir()) == []  # no .partial-* file, no half wheel
    remount(wheelhouse, "size=8m")  # space freed
    final = build.replace_in_wheelhouse(big_wheel, wheelhouse, "x86_64")
    assert final.read_bytes() == big_wheel.read_bytes()
    assert [p.name for p in wheelhouse.iterdir()] == [big_wheel.name]


def test_a_read_only_wheelhouse_is_one_message_and_a_rerun_recovers(mount, big_wheel):
    wheelhouse = mount("8m", read_only=True)
    with pytest.raises(HarnessError) as error:
        build.replace_in_wheelhouse(big_wheel, wheelhouse, "x86_64")
    one_message(error, str(wheelhouse), "read-only", "make it writable", "nox -s build -- --arch x86_64 again")
    remount(wheelhouse, "rw")
    assert list(wheelhouse.iterdir()) == []
    assert build.replace_in_wheelhouse(big_wheel, wheelhouse, "x86_64").read_bytes() == big_wheel.read_bytes()


def test_a_missing_wheelhouse_is_made_again_by_a_build_and_named_by_a_test(tmp_path, big_wheel):
    wheelhouse = tmp_path / "wheelhouse"
    with pytest.raises(HarnessError) as error:
        build.find_wheel(wheelhouse, "x86_64")
    one_message(error, str(wheelhouse), "found: none", "nox -s build -- --arch x86_64")
    assert build.replace_in_wheelhouse(big_wheel, wheelhouse, "x86_64") == wheelhouse / big_wheel.name
    assert build.find_wheel(wheelhouse, "x86_64") == wheelhouse / big_wheel.name


@dataclasses.dataclass(frozen=True)
class FakeSpec:
    """An image spec: all build_wheel reads of one is its tag."""

    tag: str


def build_target() -> Target:
    return load_targets(REPO / "pyproject.toml")["x86_64"]


# --- damaged and foreign wheels ---------------------------------------------------------------


def flip_a_byte(path: Path) -> Path:
    """Change the first data byte of a stored member: the zip opens, that member's CRC fails."""
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.file_size and i.compress_type == zipfile.ZIP_STORED)
    data = bytearray(path.read_bytes())
    name_length, extra_length = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    data[info.header_offset + 30 + name_length + extra_length] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def not_a_zip(path: Path) -> Path:
    path.write_bytes(b"<html>502 Bad Gateway</html>")  # what a proxy may hand over
    return path


def foreign(path: Path, *, name: str = "moe_xarch", version: str | None = None, tag: str | None = None,
            so_arch: str | None = None) -> Path:
    """Put at path a well-formed wheel that differs from what path's name says in the
    fields given (another project, version, tag, or shared objects of another arch)."""
    _, file_version, _, tags = parse_wheel_filename(path.name)
    (file_tag,) = tags
    arch = file_tag.platform.split("_", 3)[-1]
    other = make_wheel(path.parent.parent / "foreign", name, version or str(file_version), tag or str(file_tag),
                       files={f"{name}/_C.so": elf_header(so_arch or arch)})
    return other.replace(path)


# Each damage turns the project's good x86_64 wheel at a path into a bad file there.
DAMAGES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "truncated": (truncate, "is not a whole wheel, truncated or damaged"),
    "not a zip": (not_a_zip, "is not a whole wheel, truncated or damaged"),
    "bit flipped": (flip_a_byte, "is corrupt ("),
    "another project's": (lambda p: foreign(p, name="other_project"), "holds other_project "),
    "another version's": (lambda p: foreign(p, version="0.0.1"), "holds moe_xarch 0.0.1, not what its name says"),
    "tagged for another arch inside": (lambda p: foreign(p, tag="py3-none-manylinux_2_28_aarch64"),
                                       "is tagged py3-none-manylinux_2_28_aarch64 inside"),
    "another arch's code": (lambda p: foreign(p, so_arch="aarch64"),
                            "holds shared objects that are not x86_64 code"),
}


@pytest.fixture(params=list(DAMAGES))
def damage(request) -> tuple[Callable[[Path], Path], str]:
    return DAMAGES[request.param]


def test_read_wheel_accepts_a_good_wheel_and_returns_its_metadata(tmp_path):
    wheel = make_wheel(tmp_path, requires=["torch==2.13.*"], tag="py3-none-manylinux_2_28_x86_64")
    metadata = read_wheel(wheel, "unused", project="moe_xarch", arch="x86_64")
    assert metadata.get_all("Requires-Dist") == ["torch==2.13.*"]


def test_a_foreign_file_name_is_named(tmp_path):
    wheel = make_wheel(tmp_path, "other_project", tag="py3-none-manylinux_2_28_aarch64")
    with pytest.raises(HarnessError) as error:
        read_wheel(wheel, "do this", project="moe_xarch")
    one_message(error, str(wheel), "a wheel of other-project, not of moe_xarch: do this")
    with pytest.raises(HarnessError) as error:
        read_wheel(wheel, "do this", arch="x86_64")
    one_message(error, "is not tagged for x86_64: do this")


def test_a_damaged_wheel_before_the_test_session_is_named_and_a_build_replaces_it(tmp_path, damage):
    hurt, what = damage
    kept = project_wheel(tmp_path / "kept", "x86_64")
    wheelhouse = tmp_path / "wheelhouse"
    wheel = hurt(build.put(kept, wheelhouse, "unused"))
    with pytest.raises(HarnessError) as error:
        build.find_wheel(wheelhouse, "x86_64")
    one_message(error, str(wheel), what, f"{BUILD_AGAIN}, which replaces it")
    build.replace_in_wheelhouse(kept, wheelhouse, "x86_64")  # what nox -s build does with its kept wheel
    assert build.find_wheel(wheelhouse, "x86_64").read_bytes() == kept.read_bytes()


class FunctionBuilder(builders.Builder):
    """A builder whose build is the function a test gives it."""

    name = "cibuildwheel"

    def __init__(self, run: Callable[[builders.BuildJob], object]) -> None:
        self.run = run

    def identity(self, job: builders.BuildJob) -> list[str]:
        return []

    def build(self, job: builders.BuildJob) -> None:
        self.run(job)


def fake_builder(runs: list[str]) -> Callable[[builders.BuildJob], None]:
    def run(job: builders.BuildJob) -> None:
        runs.append(job.builder)
        project_wheel(job.output, "x86_64")

    return run


@pytest.fixture
def build_wheel(tmp_path, monkeypatch, repo_root):
    """build_wheel(): build.build_wheel of the x86_64 target with a fake builder
    (build_wheel.builder; its .run is what it does); returns (wheel, runs so far)."""
    runs: list[str] = []
    monkeypatch.setattr(images, "image_exists", lambda tag: True)
    monkeypatch.setattr(build, "check_tag", lambda *args: None)
    monkeypatch.setattr(build.versioning, "project_version", lambda repo, python: "0.1.0")
    monkeypatch.setattr(build, "source_files", lambda repo: ["pyproject.toml"])
    builder = FunctionBuilder(fake_builder(runs))

    def run() -> tuple[Path, list[str]]:
        wheel = build.build_wheel(build_target(), builder, {"build": FakeSpec("b")}, repo=repo_root,
                                  wheelhouse=tmp_path / "wheelhouse", cache=tmp_path / "cache",
                                  tools=tools.Tools([], "python"), steps=console.StepLog())
        return wheel, list(runs)

    run.builder = builder  # type: ignore[attr-defined]
    return run


def test_a_damaged_wheel_in_the_builders_cache_is_built_again(tmp_path, build_wheel, damage, capsys):
    hurt, what = damage
    wheel, runs = build_wheel()
    kept = tmp_path / "cache" / "x86_64-cibuildwheel" / wheel.name
    assert build_wheel()[1] == runs == ["cibuildwheel"]  # reused while whole
    hurt(kept)
    wheel, runs = build_wheel()
    assert runs == ["cibuildwheel"] * 2
    noted = capsys.readouterr().err
    assert f"{kept} {what}" in noted and noted.rstrip().endswith("building it again")
    read_wheel(wheel, "unused", project="moe_xarch", arch="x86_64")
    assert wheel.read_bytes() == kept.read_bytes()


def test_a_half_written_build_stamp_builds_again(tmp_path, build_wheel):
    build_wheel()
    (tmp_path / "cache" / "x86_64-cibuildwheel" / "inputs.json").write_text('{"inputs": "ab')
    assert build_wheel()[1] == ["cibuildwheel"] * 2


def test_a_builder_that_makes_another_archs_code_is_stopped(tmp_path, build_wheel):
    build_wheel.builder.run = lambda job: project_wheel(job.output, "x86_64", so_arch="aarch64")
    with pytest.raises(HarnessError) as error:
        build_wheel()
    one_message(error, "holds shared objects that are not x86_64 code", "cibuildwheel made it so")
    assert not list((tmp_path / "wheelhouse").iterdir())
    assert not list((tmp_path / "cache").glob(".partial-*"))


def test_a_builder_failing_on_a_full_cache_is_one_message_naming_the_space(mount, tmp_path, build_wheel):
    cache = mount("1m")
    (tmp_path / "cache").symlink_to(cache)

    def builder_filling_the_disk(job: builders.BuildJob) -> None:
        job.output.mkdir(parents=True)
        with pytest.raises(OSError), (job.output / "big.o").open("wb") as file:
            file.write(os.urandom(2 << 20))  # as a compiler would, until the disk is full
        raise console.CommandFailed("build x86_64", ["cibuildwheel"], 1)

    build_wheel.builder.run = builder_filling_the_disk
    with pytest.raises(HarnessError) as error:
        build_wheel()
    one_message(error, "build x86_64: cibuildwheel exited with 1 (its output is above)",
                f"MiB free in {tmp_path / 'cache'} (a full disk?)", "nox -s build -- --arch x86_64 again")
    assert not list(cache.glob(".partial-*"))
    remount(cache, "size=8m")
    build_wheel.builder.run = fake_builder([])
    wheel, _ = build_wheel()
    assert build.find_wheel(tmp_path / "wheelhouse", "x86_64") == wheel


def test_a_read_only_build_cache_is_one_message_and_a_rerun_recovers(mount, tmp_path, build_wheel):
    cache = mount("8m", read_only=True)
    (tmp_path / "cache").symlink_to(cache)
    with pytest.raises(HarnessError) as error:
        build_wheel()
    one_message(error, str(tmp_path / "cache"), "read-only", "nox -s build -- --arch x86_64 again")
    remount(cache, "rw")
    wheel, runs = build_wheel()
    assert runs == ["cibuildwheel"] and build.find_wheel(tmp_path / "wheelhouse", "x86_64") == wheel


# --- publish -- --dry-run ---------------------------------------------------------------------


@pytest.fixture
def release(tmp_path: Path) -> tuple[Path, Path]:
    """(wheelhouse, reports) of a tested release: a wheel per target, an sdist, the records."""
    wheelhouse, reports = tmp_path / "wheelhouse", tmp_path / "reports"
    wheels = {arch: release_wheel(wheelhouse, arch) for arch in ("x86_64", "aarch64")}
    make_sdist(wheelhouse)
    write_manifest(reports, wheels)
    return wheelhouse, reports


def dry_run(wheelhouse: Path, reports: Path) -> subprocess.CompletedProcess[str]:
    """`nox -s publish -- --dry-run`, as the session runs it (no destination set)."""
    return subprocess.run(
        [sys.executable, "-m", "harness.publishing.publish", "--dry-run", "--wheelhouse", str(wheelhouse),
         "--reports", str(reports)],
        cwd=REPO, env=publish_env(), capture_output=True, text=True, timeout=120,
    )


def test_a_damaged_wheel_before_publish_is_refused_by_name(release, damage):
    hurt, what = damage
    wheelhouse, reports = release
    wheel = wheelhouse / "moe_xarch-1.0.0-py3-none-manylinux_2_34_x86_64.whl"
    good = wheel.read_bytes()
    hurt(wheel)
    result = dry_run(wheelhouse, reports)
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr, result.stderr
    assert result.stderr.startswith("publish: Refusing to publish:\n")
    (line,) = [line.strip() for line in result.stderr.splitlines() if f"{wheel} " in line]
    assert line.startswith(f"x86_64: {wheel} {what}"), line
    assert line.endswith(f"{BUILD_AGAIN}, which replaces it, then publish again")
    wheel.write_bytes(good)  # what nox -s build puts back from its kept wheel
    targets = load_targets(REPO / "pyproject.toml")
    assert len(publish.collect(targets, wheelhouse, records.load_records(reports))) == 3


def test_a_truncated_sdist_before_publish_is_refused_by_name(release):
    wheelhouse, reports = release
    (sdist,) = wheelhouse.glob("*.tar.gz")
    truncate(sdist)
    result = dry_run(wheelhouse, reports)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"{sdist} is not a whole sdist, truncated or damaged" in result.stderr
    assert "delete it" in result.stderr
    sdist.unlink()
    make_sdist(wheelhouse)
    assert publish.sdist_problems(sdist) == []


def test_a_missing_wheelhouse_before_publish_says_what_to_build(tmp_path):
    result = dry_run(tmp_path / "wheelhouse", tmp_path / "reports")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "x86_64: expected exactly one wheel in wheelhouse/, found none (nox -s build -- --arch x86_64)" in result.stderr


def test_a_full_reports_directory_leaves_no_half_record(mount):
    directory = records.records_dir(mount("64k"))
    with pytest.raises(HarnessError) as error:
        records.write_json_atomically(directory / "x86_64.json", {"x": "y" * (1 << 20)}, "nox -s test-x86_64")
    one_message(error, str(directory), "the file system is full", "nox -s test-x86_64 again")
    assert list(directory.iterdir()) == []


# --- the download closure of an image ---------------------------------------------------------


def pip_from(links: Path) -> Callable[[list[str]], None]:
    """The host's pip, offered only a local directory of wheels (as a find-links source)."""

    def run(command: list[str]) -> None:
        subprocess.run([*command, "--no-index", f"--find-links={links}"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    return run


@pytest.mark.parametrize("hurt", ["truncated", "not a zip", "another project's"])
def test_a_damaged_wheel_where_pip_finds_it_is_one_message(tmp_path, arm, hurt):
    links, dest = tmp_path / "links", tmp_path / "dest"
    wheel = make_wheel(links, "dep_one", "1.0")
    good = wheel.read_bytes()
    {"truncated": truncate, "not a zip": lambda p: p.write_bytes(b"<html/>"),
     "another project's": lambda p: make_wheel(tmp_path / "o", "dep_two", "1.0").replace(p)}[hurt](wheel)
    with pytest.raises(HarnessError) as error:
        download_closure(["dep-one==1.0"], dest, arm, run=pip_from(links))
    one_message(error, "pip could not download dep-one==1.0 for aarch64 (its error is above)", "run again")
    assert list(dest.iterdir()) == []
    wheel.write_bytes(good)
    assert [p.name for p in download_closure(["dep-one==1.0"], dest, arm, run=pip_from(links))] == [wheel.name]


def test_a_wheel_pip_passes_but_whose_checksum_fails_is_named(tmp_path, arm):
    links = tmp_path / "links"
    wheel = flip_a_byte(make_wheel(links, "dep_one", "1.0", files={"dep_one/x.py": b"VALUE = 1\n"}))
    with pytest.raises(HarnessError) as error:
        download_closure(["dep-one==1.0"], tmp_path / "dest", arm, run=pip_from(links))
    one_message(error, "dep_one-1.0-py3-none-any.whl is corrupt (dep_one/x.py fails its checksum)",
                "pip cache remove dep_one", "run again")


def test_a_damaged_torch_for_the_cross_build_is_named_and_nothing_is_unpacked(arm, tmp_path, monkeypatch):
    def pip_gives_a_truncated_torch(requirements: list[str], dest: Path, target: object) -> None:
        truncate(make_wheel(dest, "torch", "2.10.0", "cp311-cp311-manylinux_2_28_aarch64"))

    monkeypatch.setattr(wheels, "pip_download", pip_gives_a_truncated_torch)
    with pytest.raises(HarnessError) as error:
        cross.torch_dir(arm, tmp_path / "cache")
    one_message(error, "torch-2.10.0-cp311-cp311-manylinux_2_28_aarch64.whl is not a whole wheel",
                "pip cache remove torch", "run again")
    assert list((tmp_path / "cache").iterdir()) == []


# --- an image removed under the harness -------------------------------------------------------


@pytest.fixture(scope="module")
def docker() -> None:
    """Docker as the harness sets it up (installed and started when missing): a host
    without it fails here rather than skipping."""
    host.ensure_host(host.Needs(debootstrap=False, emulated_arches=()))


@pytest.fixture
def probe_image(docker, tmp_path) -> Iterator[str]:
    """An image of this test's own (an empty file system), removed afterwards."""
    tag = f"moe-xarch-faults-probe:{os.getpid()}-{tmp_path.name.lower()}"
    import_empty_image(tag, tmp_path)
    yield tag
    subprocess.run(["docker", "image", "rm", "--force", tag], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def import_empty_image(tag: str, scratch: Path) -> None:
    empty = scratch / "empty.tar"
    with tarfile.open(empty, "w"):
        pass
    subprocess.run(["docker", "import", str(empty), tag], check=True, stdout=subprocess.DEVNULL)


def remove_image(tag: str) -> None:
    subprocess.run(["docker", "image", "rm", tag], check=True, stdout=subprocess.DEVNULL)


def test_an_image_removed_while_in_use_is_one_message(probe_image):
    with pytest.raises(HarnessError) as error, image_in_use(probe_image, "nox -s test-x86_64"):
        remove_image(probe_image)
    one_message(error, f"the image {probe_image} was removed while this run used it",
                "run nox -s test-x86_64 again, which builds the image again")


def test_a_docker_run_on_a_removed_image_is_one_message(probe_image):
    with pytest.raises(HarnessError) as error, image_in_use(probe_image, "nox -s build -- --arch x86_64"):
        remove_image(probe_image)
        subprocess.run(["docker", "run", "--rm", "--network=none", probe_image, "true"],
                       check=True, capture_output=True)
    one_message(error, f"the image {probe_image} was removed", "run nox -s build -- --arch x86_64 again")


def test_a_failure_with_the_image_still_there_is_not_blamed_on_it(probe_image):
    with pytest.raises(subprocess.CalledProcessError), image_in_use(probe_image, "unused"):
        subprocess.run(["docker", "run", "--rm", "--network=none", probe_image, "/no/such/program"],
                       check=True, capture_output=True)


def test_a_build_image_removed_mid_build_leaves_nothing_and_a_rerun_builds(tmp_path, monkeypatch, probe_image):
    monkeypatch.setattr(build, "check_tag", lambda *args: None)
    monkeypatch.setattr(build.versioning, "project_version", lambda repo, python: "0.1.0")
    monkeypatch.setattr(build, "source_files", lambda repo: ["pyproject.toml"])

    def builder_whose_image_goes(job: builders.BuildJob) -> None:
        job.output.mkdir(parents=True)
        (job.output / "half.o").write_bytes(b"")
        remove_image(probe_image)
        raise console.CommandFailed(f"build {job.target.arch}", ["cibuildwheel"], 1)  # it cannot pull one

    def run(builder: Callable[[builders.BuildJob], object]) -> Path:
        return build.build_wheel(build_target(), FunctionBuilder(builder), {"build": FakeSpec(probe_image)}, repo=REPO,
                                 wheelhouse=tmp_path / "wheelhouse", cache=tmp_path / "cache",
                                 tools=tools.Tools([], "python"), steps=console.StepLog())

    with pytest.raises(HarnessError) as error:
        run(builder_whose_image_goes)
    one_message(error, f"the image {probe_image} was removed", "run nox -s build -- --arch x86_64 again")
    assert not list((tmp_path / "cache").glob(".partial-*")) and not list((tmp_path / "wheelhouse").iterdir())
    import_empty_image(probe_image, tmp_path)  # what the next run's ensure_images does
    wheel = run(lambda job: project_wheel(job.output, "x86_64"))
    assert build.find_wheel(tmp_path / "wheelhouse", "x86_64") == wheel


def test_a_removed_image_is_built_again_by_the_next_run(arm, tmp_path, monkeypatch):
    """No stamp says an image is built: docker is asked each time, so a removed
    image is built again (its docker build recorded here)."""
    built = []
    ca = tmp_path / "ca.crt"
    ca.write_text("a CA bundle\n")
    monkeypatch.setattr(images, "image_exists", lambda tag: False)
    monkeypatch.setattr(images, "_prepare_context", lambda spec, context, ca: context.mkdir(parents=True))
    monkeypatch.setattr(images.console, "run_streamed",
                        lambda command, label, **kw: built.append(next(a for a in command if a.startswith("--tag="))))
    monkeypatch.setattr(images.host, "ca_bundle", lambda: ca)
    specs = images.ensure_images(dataclasses.replace(arm, base_image="debian:bookworm"), tmp_path / "work",
                                 console.StepLog(), upto="test")
    assert built == [f"--tag={specs['test'].tag}"]
