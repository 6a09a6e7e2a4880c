"""The base, test and build images of each target, built here with no registry.

base  = a debootstrap root filesystem (FROM scratch), or a registry image when
        the target row names `base-image`;
test  = base + a venv holding the target's torch, pytest and pytest-xdist;
build = test + cibuildwheel's expectations (build tools, auditwheel, patchelf).

Each tag is a hash of that image's inputs (its Dockerfile and scripts, pinned
requirement lists, the target settings it depends on, its parent's tag), so an
unchanged image is found by `docker image inspect` and never rebuilt.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.common import console
from harness.common.errors import HarnessError
from harness.common.paths import DOCKER
from harness.common.project import ENV_PREFIX, NAME
from harness.plan.targets import SUITES, Target
from harness.setup import host
from harness.setup.wheels import download_closure, pip_install_target_command, requirement_lines

DEBIAN_MIRROR = f"{ENV_PREFIX}_DEBIAN_MIRROR"  # overrides the host's apt sources
ROLES = ("base", "test", "build")


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    role: str
    target: Target
    tag: str
    parent: str  # the image it is built FROM (a tag of ours, or a registry image)
    files: tuple[str, ...]  # files of docker/ copied into its context
    requirements: tuple[str, ...]  # wheels to download into its context


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def input_hash(inputs: dict[str, object]) -> str:
    return _sha256(json.dumps(inputs, sort_keys=True).encode())[:16]


def image_specs(target: Target, docker_dir: Path, ca_bundle: Path) -> dict[str, ImageSpec]:
    """The three images of a target, each tagged by the hash of its inputs."""

    def file_hashes(names: Iterable[str]) -> dict[str, str]:
        return {name: _sha256((docker_dir / name).read_bytes()) for name in names}

    base_files = ("Dockerfile.base",)
    test_files = ("Dockerfile.test", "debian-packages.txt", "install-debian-packages.sh")
    build_files = ("Dockerfile.build", "install-host-compiler.sh", "host-compiler-packages.txt")
    test_requirements = (target.torch, *requirement_lines(docker_dir / "requirements-test.txt"))
    build_requirements = tuple(requirement_lines(docker_dir / "requirements-build.txt"))

    specs: dict[str, ImageSpec] = {}
    if target.base_image:
        base_tag = target.base_image
    else:
        base_hash = input_hash(
            {
                "files": file_hashes((*base_files, "debian-packages.txt")),
                "debootstrap": debootstrap_command(
                    target, Path("/rootfs"), "MIRROR", debian_packages(docker_dir)
                ),
                # the root filesystem carries the host's CA bundle
                "ca-bundle": _sha256(ca_bundle.read_bytes()),
            }
        )
        base_tag = f"{NAME}-base:{target.arch}-{target.suite}-{base_hash}"
        specs["base"] = ImageSpec("base", target, base_tag, "scratch", base_files, ())

    def derived(role: str, parent: str, files: tuple[str, ...], requirements: tuple[str, ...]) -> None:
        digest = input_hash(
            {
                "parent": parent,
                "files": file_hashes(files),
                "requirements": requirements,
                "python": target.python_versions,
                "platform": target.platform,
            }
        )
        tag = f"{NAME}-{role}:{target.arch}-{digest}"
        specs[role] = ImageSpec(role, target, tag, parent, files, requirements)

    derived("test", base_tag, test_files, test_requirements)
    derived("build", specs["test"].tag, build_files, build_requirements)
    return specs


def debian_packages(docker_dir: Path) -> list[str]:
    return requirement_lines(docker_dir / "debian-packages.txt")


def debootstrap_command(target: Target, rootfs: Path, mirror: str, packages: list[str]) -> list[str]:
    return [
        "debootstrap",
        f"--arch={target.debian_arch}",
        "--variant=minbase",
        f"--include={','.join(packages)}",
        target.suite,
        str(rootfs),
        mirror,
    ]


def build_args(spec: ImageSpec) -> dict[str, str]:
    python = spec.target.python_versions[0]
    tag = spec.target.python_tags[0]
    if spec.role == "test":
        return {"BASE_IMAGE": spec.parent, "PYTHON_VERSION": python, "PYTHON_TAG": tag}
    if spec.role == "build":
        return {"TEST_IMAGE": spec.parent, "PYTHON_TAG": tag}
    return {}


def docker_build_command(spec: ImageSpec, context: Path) -> list[str]:
    command = ["docker", "build", f"--platform={spec.target.platform}", f"--tag={spec.tag}"]
    command += [f"--label=org.{NAME}.role={spec.role}", f"--file={context / 'Dockerfile'}"]
    command += [f"--build-arg={key}={value}" for key, value in build_args(spec).items()]
    return [*command, str(context)]


def image_exists(tag: str) -> bool:
    inspect = subprocess.run(
        ["docker", "image", "inspect", tag], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return inspect.returncode == 0


@contextmanager
def image_in_use(tag: str, rerun: str) -> Iterator[None]:
    """The image must exist throughout the block: one removed meanwhile (docker image
    rm, docker system prune) is a HarnessError, whether or not a command failed on it;
    the run that follows builds it again."""
    try:
        yield
    except (subprocess.CalledProcessError, console.CommandFailed):
        if image_exists(tag):
            raise
        raise HarnessError(_gone(tag, rerun)) from None
    if not image_exists(tag):
        raise HarnessError(_gone(tag, rerun))


def _gone(tag: str, rerun: str) -> str:
    return (f"the image {tag} was removed while this run used it (docker image rm or prune?), so its "
            f"results are void: run {rerun} again, which builds the image again")


# --- the debootstrap root filesystem ------------------------------------------------


def debian_mirror(suite: str, sources: Iterable[Path] | None = None) -> str:
    """The host's Debian mirror for suite, read from its apt sources at run time: the
    one that lists suite, else one that lists another Debian release of SUITES (a
    Debian mirror serves every release: a bookworm host makes a trixie image).

    DEBIAN_MIRROR overrides it.
    """
    if override := os.environ.get(DEBIAN_MIRROR):
        return override
    if sources is None:
        sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    texts = [(path.read_text(), path.suffix == ".sources") for path in sources if path.is_file()]
    for release in (suite, *(other for other in SUITES if other != suite)):
        for text, deb822 in texts:
            if uri := _mirror_in(text, release, deb822):
                return uri
    raise host.HostSetupError(
        f"No apt source for Debian {suite} (main) was found on this host, so debootstrap "
        f"has no mirror. Set one: export {DEBIAN_MIRROR}=<a Debian mirror URL>"
    )


def _mirror_in(text: str, suite: str, deb822: bool) -> str | None:
    if deb822:
        for paragraph in re.split(r"\n\s*\n", text):
            fields = dict(
                (key.strip().lower(), value.split())
                for key, value in re.findall(r"^([A-Za-z-]+):(.*)$", paragraph, re.MULTILINE)
            )
            if (
                "deb" in fields.get("types", [])
                and suite in fields.get("suites", [])
                and "main" in fields.get("components", [])
                and fields.get("uris")
            ):
                return fields["uris"][0]
        return None
    for line in text.splitlines():
        words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
        if len(words) >= 4 and words[0] == "deb" and words[2] == suite and "main" in words[3:]:
            return words[1]
    return None


def remove_tree(path: Path) -> None:
    """Remove a (possibly half-made) root filesystem, first unmounting what debootstrap
    left mounted in it when it was killed, so that nothing outside it is touched."""
    if not path.exists():
        return
    root = str(path.resolve())
    mounts = [
        line.split()[1]
        for line in Path("/proc/mounts").read_text().splitlines()
        if line.split()[1] == root or line.split()[1].startswith(root + "/")
    ]
    for mount in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "--lazy", mount], check=True)
    subprocess.run(["rm", "-rf", "--one-file-system", root], check=True)


def make_rootfs_tar(target: Target, work: Path, tar_path: Path, ca_bundle: Path) -> None:
    rootfs = work / "rootfs"
    remove_tree(rootfs)
    mirror = debian_mirror(target.suite)
    label = f"debootstrap {target.arch}"
    packages = debian_packages(DOCKER)
    console.run_streamed(debootstrap_command(target, rootfs, mirror, packages), label)
    # Containers then trust what the host trusts (a TLS-intercepting proxy included).
    (rootfs / "etc/ssl/certs").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ca_bundle, rootfs / "etc/ssl/certs/ca-certificates.crt")
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
        subprocess.run(["find", str(rootfs / cache), "-type", "f", "-delete"], check=True)
    # Uncompressed: ADD unpacks a plain tar too, and gzip would only cost CPU time.
    console.run_streamed(
        ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(tar_path), "."], f"tar {target.arch}"
    )
    remove_tree(rootfs)


# --- building ---------------------------------------------------------------------------


def _prepare_context(spec: ImageSpec, context: Path, ca_bundle: Path) -> None:
    remove_tree(context)
    context.mkdir(parents=True)
    shutil.copyfile(DOCKER / spec.files[0], context / "Dockerfile")
    for name in spec.files[1:]:
        shutil.copy2(DOCKER / name, context / name)
    if spec.role == "base":
        make_rootfs_tar(spec.target, context, context / "rootfs.tar", ca_bundle)
    if spec.requirements:
        wheels = context / "wheels"
        print(f"downloading wheels for {', '.join(spec.requirements)}", flush=True)
        downloaded = download_closure(spec.requirements, wheels, spec.target)
        if spec.role == "test":
            _install_on_host(downloaded, context, spec.target)
        else:
            (wheels / "requirements.txt").write_text("\n".join(spec.requirements) + "\n")


def _install_on_host(wheels: list[Path], context: Path, target: Target) -> None:
    """Install the test image's packages on the host into context/site-packages.

    Natively, not under QEMU: unpacking and compiling torch is pip's slowest work.
    Only pip stays in wheels/, to install itself in the image (its `bin/pip` is
    what cibuildwheel looks for).
    """
    packages = [wheel for wheel in wheels if not wheel.name.startswith("pip-")]
    site_packages = context / "site-packages"
    console.run_streamed(
        pip_install_target_command(packages, site_packages, target), f"install {target.arch}"
    )
    shutil.rmtree(site_packages / "bin", ignore_errors=True)  # scripts with the host's shebang
    for wheel in packages:
        wheel.unlink()


def ensure_images(
    target: Target, work_dir: Path, steps: console.StepLog, upto: str = "build"
) -> dict[str, ImageSpec]:
    """Build whichever of the target's images up to `upto` is missing; return their specs."""
    ca_bundle = host.ca_bundle()
    specs = image_specs(target, DOCKER, ca_bundle)
    wanted = ROLES[: ROLES.index(upto) + 1]
    specs = {role: spec for role, spec in specs.items() if role in wanted}
    for spec in specs.values():
        context = work_dir / f"{target.name}-{spec.role}"
        with (
            steps.step(f"image {spec.role} {target.name}") as step,
            console.exclusive(work_dir / f"{target.name}-{spec.role}.lock"),
        ):
            if image_exists(spec.tag):
                step.outcome = "reused"
                print(f"{spec.tag}: up to date", flush=True)
                continue
            _prepare_context(spec, context, ca_bundle)
            console.run_streamed(
                docker_build_command(spec, context),
                f"image {spec.role} {target.name}",
                env={"DOCKER_BUILDKIT": "0"},
            )
            remove_tree(context)
    return specs
