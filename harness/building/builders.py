"""The builders a target's row names (`builders = [...]`), behind one interface.

A builder turns a staged source tree into one repaired wheel in job.output;
harness/building/build.py does the rest for every builder alike (staging, the inputs
hash and reuse, the auditwheel check, the move into wheelhouse/). Adding a
builder is one class here and one entry in BUILDERS; the work it does may live
in a module of its own (as the cross build's does in harness/building/cross.py), which
then needs nothing from this one.
"""

from __future__ import annotations

import abc
import dataclasses
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from harness.building import cross, toolchain, versioning
from harness.common import console
from harness.plan.targets import ARCHES, SDIST_BUILDER, TableError, Target, one_of
from harness.setup import containers, host
from harness.setup.tools import CIBUILDWHEEL, HOST_BACKEND, Tools


@dataclasses.dataclass(frozen=True)
class BuildJob:
    target: Target
    builder: str  # the builder's name, as the table writes it
    build_image: str  # the target's build image: auditwheel and the repair run there
    staged: Path  # the staged source tree
    output: Path  # an empty directory for the repaired wheel
    tools: Tools
    version: str  # the project's version, from git


class Builder(abc.ABC):
    """One way of making a target's wheel."""

    name: ClassVar[str]
    # The wheel is repaired (auditwheel: a manylinux tag, checked by harness/building/build.py);
    # a build as a user's pip makes it is not.
    repairs: ClassVar[bool] = True

    def applies(self, target: Target, host_arch: str) -> bool:
        """Whether it makes sense for target on a host of host_arch (the default
        builder is the target's first that applies)."""
        return True

    @abc.abstractmethod
    def identity(self, job: BuildJob) -> list[str]:
        """What, besides the sources, the version and the build image, decides the
        wheel it makes: part of the inputs hash, so it only asks and changes nothing.
        Runs after prepare()."""

    def prepare(self, job: BuildJob) -> None:
        """Make the host ready for identity() and build(): may install or fetch."""

    @abc.abstractmethod
    def build(self, job: BuildJob) -> None:
        """Build and repair the staged tree into exactly one wheel in job.output."""


def cibuildwheel_env(target: Target, build_image: str, owner_labels: list[str], version: str) -> dict[str, str]:
    """The per-target settings; the shared ones are in [tool.cibuildwheel]."""
    return {
        "CIBW_PLATFORM": "linux",
        "CIBW_ENVIRONMENT": f"{versioning.VARIABLE}={shlex.quote(version)}",
        "CIBW_ARCHS": target.arch,
        "CIBW_BUILD": " ".join(f"{tag}-manylinux_{target.arch}" for tag in target.python_tags),
        f"CIBW_MANYLINUX_{target.arch.upper()}_IMAGE": build_image,
        # Labels let the next run remove the container of a killed build.
        "CIBW_CONTAINER_ENGINE": f"docker; create_args: {' '.join(owner_labels)}",
    }


class Cibuildwheel(Builder):
    """cibuildwheel in the target's local build image: natively on the target's
    own arch, under QEMU on another; its repair-wheel-command repairs the wheel."""

    name = "cibuildwheel"

    def identity(self, job: BuildJob) -> list[str]:
        return [CIBUILDWHEEL]

    def environment(self, job: BuildJob) -> dict[str, str]:
        return cibuildwheel_env(job.target, job.build_image, containers.label_args(), job.version)

    def build(self, job: BuildJob) -> None:
        console.run_streamed(
            [*job.tools.cibuildwheel, "--output-dir", str(job.output), "."],
            f"build {job.target.arch}",
            cwd=job.staged,
            env=self.environment(job),
        )


class CibuildwheelHostCompiler(Cibuildwheel):
    """cibuildwheel's own build and repair in the target's build image, under QEMU on
    a foreign host, with the compiler that image carries for this host running
    natively (harness/building/toolchain.py)."""

    name = toolchain.NAME

    def applies(self, target: Target, host_arch: str) -> bool:
        return toolchain.applies(target, host_arch)

    def identity(self, job: BuildJob) -> list[str]:
        variables = toolchain.compiler_variables(job.target, host.arch())
        return [CIBUILDWHEEL, *(f"{name}={value}" for name, value in sorted(variables.items()))]

    def environment(self, job: BuildJob) -> dict[str, str]:
        return toolchain.with_host_compiler(super().environment(job), job.target, host.arch())


class Cross(Builder):
    """The host's cross compiler against the target's torch (harness/building/cross.py),
    then the same repair as cibuildwheel's, in the build image."""

    name = "cross"

    def applies(self, target: Target, host_arch: str) -> bool:
        # On its own arch a target builds natively; a cross build needs a toolchain for it.
        return bool(target.cross_triplet) and host_arch != target.arch

    def identity(self, job: BuildJob) -> list[str]:
        return cross.toolchain_identity(job.target, job.tools.python, HOST_BACKEND)

    def prepare(self, job: BuildJob) -> None:
        cross.ensure_compiler(job.target)

    def build(self, job: BuildJob) -> None:
        cross.build_wheel(job.target, job.staged, job.output, python=job.tools.python,
                          version=job.version, build_image=job.build_image)


class Sdist(Builder):
    """An sdist-build leg's wheel (harness/plan/targets.py sdist_legs): in the leg's own build
    image, pypa/build makes the sdist of the staged tree and then the wheel from that
    sdist, with the image's compiler, CPython and torch; not repaired, as pip builds
    it for a user there. Natively only: the leg's toolchain is the point."""

    name = SDIST_BUILDER
    repairs = False

    def applies(self, target: Target, host_arch: str) -> bool:
        return target.from_sdist and host_arch == target.arch

    def identity(self, job: BuildJob) -> list[str]:
        return []  # the sources, the version and the build image say it all

    def build(self, job: BuildJob) -> None:
        name = containers.container_name("sdist", job.target.name)
        # build's default for a source tree: the sdist, then the wheel from the unpacked sdist.
        script = ('cp -r /src /tmp/src && python -m build --no-isolation --skip-dependency-check '
                  '--outdir /tmp/dist /tmp/src && ls /tmp/dist && cp /tmp/dist/*.whl /out/')
        job.output.mkdir(parents=True, exist_ok=True)
        try:
            console.run_streamed(
                ["docker", "run", "--rm", f"--name={name}", *containers.label_args(),
                 f"--platform={job.target.platform}", "--network=none",
                 f"--env={versioning.VARIABLE}={job.version}",
                 f"--volume={job.staged}:/src:ro", f"--volume={job.output}:/out", job.build_image,
                 "bash", "-euo", "pipefail", "-c", script],
                f"build {job.target.name}",
            )
        finally:
            containers.remove(name)


BUILDERS: Mapping[str, Builder] = {
    builder.name: builder for builder in (CibuildwheelHostCompiler(), Cibuildwheel(), Cross(), Sdist())
}


def of(target: Target) -> list[Builder]:
    """The builders the target's row lists, in its order; a name that is no builder,
    or a builder that cannot build the target on any host, is a TableError."""
    if not target.builders:
        raise TableError(f"{target.where}: builders must name at least one of {', '.join(BUILDERS)}")
    found = []
    for name in target.builders:
        one_of(target.where, "builder", name, BUILDERS)
        builder = BUILDERS[name]
        if name == SDIST_BUILDER:
            raise TableError(f"{target.where}: the {name} builder builds the sdist-builds legs, not a row's wheel")
        if not any(builder.applies(target, host) for host in ARCHES):
            raise TableError(f"{target.where}: the {name} builder cannot build {target.arch} on any host")
        found.append(builder)
    return found


def check_table(targets: Mapping[str, Target]) -> None:
    """Every row's builders, whether or not its target is selected."""
    for target in targets.values():
        of(target)


def choose(target: Target, requested: Sequence[str], host_arch: str) -> list[Builder]:
    """The builders named on the command line that the target lists, else its first
    that applies on this host (the table lists them in order of preference)."""
    listed = of(target)
    chosen = [BUILDERS[name] for name in requested if name in target.builders]
    if chosen:
        return chosen
    return [next(builder for builder in listed if builder.applies(target, host_arch))]
