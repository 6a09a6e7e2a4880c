"""The target table, [tool.moe-xarch.targets.<arch>] in pyproject.toml.

One row per architecture; everything else (images, builds, test runs, the
summary) reads the frozen Target objects made here. Unknown or misspelt keys are
errors with a "did you mean" hint, so a typo cannot silently drop a setting.
"""

from __future__ import annotations

import dataclasses
import difflib
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.errors import HarnessError


class TableError(HarnessError):
    """The target table is malformed; the message says where and how."""


@dataclasses.dataclass(frozen=True)
class Arch:
    platform: str  # docker --platform
    debian: str  # debootstrap --arch
    glibc_min_minor: int  # oldest manylinux_2_X tag that exists for the arch
    legacy_manylinux: tuple[tuple[str, int], ...]  # alias tags (manylinux2014 = 2_17)
    cross_triplet: str = ""  # Debian's cross toolchain for the arch, where the harness uses one


ARCHES = {
    "x86_64": Arch(
        "linux/amd64", "amd64", 5, (("manylinux2014", 17), ("manylinux2010", 12), ("manylinux1", 5))
    ),
    "aarch64": Arch("linux/arm64", "arm64", 17, (("manylinux2014", 17),), "aarch64-linux-gnu"),
}

# The Debian suites the images can be made from: their CPython and glibc.
SUITES = {
    "bullseye": ("3.9", (2, 31)),
    "bookworm": ("3.11", (2, 36)),
    "trixie": ("3.13", (2, 41)),
}

RUNNERS = ("native", "qemu")
# cibuildwheel: in the target's build image (emulated on a foreign host);
# cross: the host's cross compiler against the target's torch (harness/cross.py).
BUILDERS = ("cibuildwheel", "cibuildwheel-hostcc", "cross")
# The parts of [tool.moe-xarch]; allowed-differences is read by harness/verdict.py.
SECTIONS = ("targets", "allowed-differences")


@dataclasses.dataclass(frozen=True)
class CpuModel:
    name: str  # QEMU_CPU
    isa: str  # the kernel path moe_xarch.isa() must report under it


@dataclasses.dataclass(frozen=True)
class Target:
    arch: str  # uname -m, and the wheel's platform tag suffix
    platform: str
    suite: str
    python_versions: tuple[str, ...]
    torch: str  # the requirement the image installs and the wheel builds against
    runner: str
    base_image: str = ""  # a registry image to start from instead of a debootstrap root
    isa_levels: tuple[str, ...] = ()  # native: every level to test where supported
    cpu_models: tuple[CpuModel, ...] = ()  # qemu: one test run per model
    builders: tuple[str, ...] = ("cibuildwheel",)  # in order of preference

    @property
    def cross_triplet(self) -> str:
        return ARCHES[self.arch].cross_triplet

    @property
    def debian_arch(self) -> str:
        return ARCHES[self.arch].debian

    @property
    def glibc(self) -> tuple[int, int]:
        return SUITES[self.suite][1]

    @property
    def python_tags(self) -> tuple[str, ...]:
        return tuple("cp" + version.replace(".", "") for version in self.python_versions)

    def as_dict(self) -> dict[str, Any]:
        """Plain data, for hashing image inputs and for JSON."""
        return dataclasses.asdict(self)


# key in the table -> (field, expected type, required)
_KEYS: dict[str, tuple[str, type, bool]] = {
    "platform": ("platform", str, True),
    "suite": ("suite", str, True),
    "python-versions": ("python_versions", list, True),
    "torch": ("torch", str, True),
    "runner": ("runner", str, True),
    "base-image": ("base_image", str, False),
    "isa-levels": ("isa_levels", list, False),
    "cpu-models": ("cpu_models", dict, False),
    "builders": ("builders", list, False),
}


def _did_you_mean(word: str, choices: Any) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _one_of(where: str, what: str, value: str, choices: Any) -> None:
    if value not in choices:
        raise TableError(
            f"{where}: unknown {what} {value!r}{_did_you_mean(value, choices)}; "
            f"known: {', '.join(sorted(choices))}"
        )


def typed_fields(where: str, row: Mapping[str, Any], keys: Mapping[str, tuple[str, type, bool]]) -> dict[str, Any]:
    """A table's keys checked against keys (key -> (field, type, required)), as {field: value}."""
    fields = {}
    for key, value in row.items():
        if key not in keys:
            raise TableError(f"{where}: unknown key {key!r}{_did_you_mean(key, keys)}")
        field, expected_type, _ = keys[key]
        if not isinstance(value, expected_type):
            raise TableError(
                f"{where}: {key} must be a {expected_type.__name__}, not {type(value).__name__}"
            )
        fields[field] = value
    missing = [key for key, (_, _, required) in keys.items() if required and key not in row]
    if missing:
        raise TableError(f"{where}: missing {', '.join(missing)}")
    return fields


def _parse_target(arch: str, row: Mapping[str, Any]) -> Target:
    where = f"[tool.moe-xarch.targets.{arch}]"
    _one_of("[tool.moe-xarch.targets]", "architecture", arch, ARCHES)
    fields: dict[str, Any] = {"arch": arch, **typed_fields(where, row, _KEYS)}

    expected_platform = ARCHES[arch].platform
    if fields["platform"] != expected_platform:
        raise TableError(f"{where}: platform must be {expected_platform!r} for {arch}")
    _one_of(where, "suite", fields["suite"], SUITES)
    _one_of(where, "runner", fields["runner"], RUNNERS)

    suite_python = SUITES[fields["suite"]][0]
    versions = tuple(fields["python_versions"])
    if not versions or any(version != suite_python for version in versions):
        # The images use the suite's own CPython; other versions would need another source.
        raise TableError(
            f"{where}: python-versions must be [{suite_python!r}]: {fields['suite']} "
            f"provides CPython {suite_python} only"
        )
    fields["python_versions"] = versions

    isa_levels = tuple(fields.get("isa_levels", ()))
    cpu_models = tuple(
        CpuModel(name, isa) for name, isa in fields.get("cpu_models", {}).items()
    )
    if fields["runner"] == "native":
        if cpu_models:
            raise TableError(f"{where}: cpu-models apply to runner = \"qemu\" only")
        if not isa_levels:
            raise TableError(f"{where}: a native target needs isa-levels")
    else:
        if isa_levels:
            raise TableError(f"{where}: isa-levels apply to runner = \"native\" only")
        if not cpu_models:
            raise TableError(f"{where}: a qemu target needs cpu-models")
        bad = [model.name for model in cpu_models if not isinstance(model.isa, str)]
        if bad:
            raise TableError(f"{where}: cpu-models values must be ISA names ({', '.join(bad)})")
    fields["isa_levels"] = isa_levels
    fields["cpu_models"] = cpu_models
    builders = tuple(fields.get("builders", ("cibuildwheel",)))
    if not builders:
        raise TableError(f"{where}: builders must name at least one of {', '.join(BUILDERS)}")
    for builder in builders:
        _one_of(where, "builder", builder, BUILDERS)
    if "cross" in builders and not ARCHES[arch].cross_triplet:
        raise TableError(f"{where}: the harness has no cross toolchain for {arch}")
    fields["builders"] = builders
    return Target(**fields)


def parse_targets(pyproject: Mapping[str, Any]) -> dict[str, Target]:
    """The targets of a parsed pyproject.toml, keyed by architecture."""
    table = pyproject.get("tool", {}).get("moe-xarch")
    if table is None:
        raise TableError("pyproject.toml has no [tool.moe-xarch] table")
    unknown = set(table) - set(SECTIONS)
    if unknown:
        key = sorted(unknown)[0]
        raise TableError(f"[tool.moe-xarch]: unknown key {key!r}{_did_you_mean(key, SECTIONS)}")
    rows = table.get("targets") or {}
    if not rows:
        raise TableError("[tool.moe-xarch.targets] lists no target")
    return {arch: _parse_target(arch, row) for arch, row in rows.items()}


def load_targets(pyproject_path: Path) -> dict[str, Target]:
    with pyproject_path.open("rb") as file:
        return parse_targets(tomllib.load(file))


def select(targets: Mapping[str, Target], arches: list[str]) -> list[Target]:
    """The targets named on the command line (all of them when none is named)."""
    for arch in arches:
        _one_of("--arch", "architecture", arch, targets)
    return [targets[arch] for arch in arches] if arches else list(targets.values())
