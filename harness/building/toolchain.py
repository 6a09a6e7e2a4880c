"""cibuildwheel in the emulated build image, with a compiler that runs natively.

A foreign-architecture build image carries a cross compiler for its own
architecture built to run on an x86_64 host, with its own loader and libraries
(docker/install-host-compiler.sh puts it at PREFIX). On an x86_64 host this
builder is cibuildwheel's ordinary build in that image (Python, pypa/build, the build
backend, CMake and auditwheel under QEMU) with CC and CXX naming that compiler,
which the kernel runs natively: the compiles, nearly all of the build's time,
run at native speed. On a host of the target's own architecture the same image
builds with its own compiler.

Its sysroot is the image's root filesystem and its target side (glibc, crt
files, libgcc, libstdc++ and headers) the image's own, so the wheel links
against exactly what the emulated build's does, and cibuildwheel's own build and
repair steps make it.
"""

from __future__ import annotations

import shlex

from harness.common.errors import HarnessError
from harness.plan.targets import Target

NAME = "cibuildwheel-hostcc"
PREFIX = "/opt/host-compiler"  # as docker/Dockerfile.build installs it
RUNS_ON = "x86_64"  # the host machine the carried compiler is built for


def applies(target: Target, host: str) -> bool:
    """Natively on the target's own arch; elsewhere only where the carried compiler runs."""
    return host in (target.arch, RUNS_ON)


def compiler_variables(target: Target, host: str) -> dict[str, str]:
    """CC and CXX for the build in the image: the carried compiler on a foreign
    x86_64 host, none (the image's own gcc) on the target's own arch."""
    if host == target.arch:
        return {}
    if host != RUNS_ON:
        raise HarnessError(f"{NAME}: the {target.arch} build image carries a compiler for {RUNS_ON} hosts, "
                           f"not for this {host} machine; build with another builder of the target")
    return {"CC": f"{PREFIX}/bin/cc", "CXX": f"{PREFIX}/bin/c++"}


def with_host_compiler(env: dict[str, str], target: Target, host: str) -> dict[str, str]:
    """cibuildwheel's settings (harness.building.builders.cibuildwheel_env) with the compiler added
    to the build's environment."""
    assignments = [f"{name}={shlex.quote(value)}" for name, value in compiler_variables(target, host).items()]
    return {**env, "CIBW_ENVIRONMENT": " ".join([env["CIBW_ENVIRONMENT"], *assignments])}
