"""The target table, [tool.<project>.targets.<arch>] in pyproject.toml.

One row per architecture; everything else (images, builds, test runs, the
summary) reads the frozen Target objects made here. Unknown or misspelt keys are
errors with a "did you mean" hint, so a typo cannot silently drop a setting.
The builder names a row lists are looked up in harness/building/builders.py.

An architecture is named as the table names it (uname -m: x86_64, aarch64)
everywhere in the harness; ARCHES maps that name to the words other tools and
the users have for it (Docker's platform, Debian's arch, the test session).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.common.errors import HarnessError
from harness.common.paths import PYPROJECT
from harness.common.project import NAME, TABLE
from harness.plan import levels


class TableError(HarnessError):
    """The target table is malformed; the message says where and how."""


@dataclasses.dataclass(frozen=True)
class Arch:
    platform: str  # docker --platform
    debian: str  # debootstrap --arch
    test_session: str  # the nox session that tests the arch's wheel (the users' word for it)
    sources: str  # its folder of kernels, csrc/arch/<sources>/
    elf_machine: int  # e_machine of its shared objects
    glibc_min_minor: int  # oldest manylinux_2_X tag that exists for the arch
    legacy_manylinux: tuple[tuple[str, int], ...]  # alias tags (manylinux2014 = 2_17)
    cross_triplet: str = ""  # Debian's cross toolchain for the arch, where the harness uses one


ARCHES = {
    "x86_64": Arch(
        "linux/amd64", "amd64", "test-x86_64", "x86", 62, 5,
        (("manylinux2014", 17), ("manylinux2010", 12), ("manylinux1", 5)),
    ),
    "aarch64": Arch(
        "linux/arm64", "arm64", "test-arm64", "arm", 183, 17, (("manylinux2014", 17),), "aarch64-linux-gnu"
    ),
}

@dataclasses.dataclass(frozen=True)
class Suite:
    """A Debian suite the images can be made from, and what it builds with."""

    python: str  # its one CPython
    glibc: tuple[int, int]
    release: int  # Debian's number for it
    gcc: int  # its default GCC's major version


SUITES = {
    "bullseye": Suite("3.9", (2, 31), 11, 10),
    "bookworm": Suite("3.11", (2, 36), 12, 12),
    "trixie": Suite("3.13", (2, 41), 13, 14),
}

RUNNERS = ("native", "qemu")
# The parts of the harness's table; allowed-differences is read by harness/plan/verdict.py.
SECTIONS = ("targets", "allowed-differences")


@dataclasses.dataclass(frozen=True)
class CpuModel:
    name: str  # QEMU's CPU model
    isa: str  # the kernel path moe_xarch.isa() must report under it
    options: str = ""  # QEMU's properties of the model, "key=value,..."

    @property
    def qemu_cpu(self) -> str:
        """QEMU_CPU: the model with its properties."""
        return ",".join(filter(None, (self.name, self.options)))


@dataclasses.dataclass(frozen=True)
class Target:
    arch: str  # uname -m, and the wheel's platform tag suffix
    platform: str
    suite: str
    python_versions: tuple[str, ...]
    torch: str  # the requirement the image installs and the wheel builds against
    runner: str
    base_image: str = ""  # a registry image to start from instead of a debootstrap root
    isa_levels: tuple[str, ...] = ()  # native: every level to test where supported (default: the arch's ladder)
    cpu_models: tuple[CpuModel, ...] = ()  # qemu: one test run per model
    builders: tuple[str, ...] = ("cibuildwheel",)  # names in harness/building/builders.py, in order of preference
    # levels no run of the table selects, each with where its record comes from (harness/plan/ladders.py)
    proven_elsewhere: tuple[tuple[str, str], ...] = ()
    # every torch the same wheel is tested against, one test image each (`torch` among them)
    test_torches: tuple[str, ...] = ()
    # other toolchains that build the wheel from the sdist, as a user's pip there would, and test it
    sdist_builds: tuple[SdistBuild, ...] = ()
    # set on the targets legs() derives: "" for the table's own row
    leg: str = ""
    from_sdist: bool = False  # the leg builds its own wheel from the sdist (harness/building/builders.py Sdist)

    @property
    def cross_triplet(self) -> str:
        return ARCHES[self.arch].cross_triplet

    @property
    def debian_arch(self) -> str:
        return ARCHES[self.arch].debian

    @property
    def test_session(self) -> str:
        return ARCHES[self.arch].test_session

    @property
    def where(self) -> str:
        """The target's row in pyproject.toml, for messages."""
        return row_name(self.arch)

    @property
    def glibc(self) -> tuple[int, int]:
        return SUITES[self.suite].glibc

    @property
    def name(self) -> str:
        """The target or leg, in paths and image contexts: the arch for the table's own row."""
        return f"{self.arch}-{self.leg}" if self.leg else self.arch

    @property
    def torch_version(self) -> str:
        return torch_version(self.torch)

    @property
    def environment(self) -> str:
        """What its runs' wheel meets: the distribution, compiler, CPython and torch of its images."""
        suite = SUITES[self.suite]
        return (f"Debian {suite.release} · GCC {suite.gcc} · Python {self.python_versions[0]} · "
                f"torch {self.torch_version}")

    @property
    def ships(self) -> bool:
        """Its wheel is the one wheelhouse/ gets, which publish uploads."""
        return not self.from_sdist

    def test_legs(self) -> list[Target]:
        """The targets that test this one's wheel: itself (with the torch it builds against),
        then one per other torch of test-torches, the same images but the test image's torch."""
        return [self, *(dataclasses.replace(self, torch=torch, leg=f"torch{torch_version(torch)}")
                        for torch in self.test_torches if torch != self.torch)]

    def sdist_legs(self) -> list[Target]:
        """One target per sdist-build: its own images, its wheel built there from the sdist."""
        return [dataclasses.replace(self, suite=build.suite, python_versions=build.python_versions,
                                    torch=build.torch, test_torches=(build.torch,), sdist_builds=(),
                                    builders=(SDIST_BUILDER,), leg=f"{build.suite}-sdist", from_sdist=True)
                for build in self.sdist_builds]

    @property
    def python_tags(self) -> tuple[str, ...]:
        return tuple("cp" + version.replace(".", "") for version in self.python_versions)

    def as_dict(self) -> dict[str, Any]:
        """Plain data, for hashing image inputs and for JSON."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class SdistBuild:
    """Another toolchain: the sdist built into a wheel and tested in images of this suite."""

    suite: str
    python_versions: tuple[str, ...]
    torch: str  # what its images install, the wheel builds against and its runs test


# The builder of an sdist-build leg (harness/building/builders.py): never listed in a row's builders.
SDIST_BUILDER = "sdist"
TORCH_PIN = re.compile(r"torch==(\d+(?:\.\d+)*)")


def torch_version(requirement: str, where: str = "") -> str:
    """2.13.0 of torch==2.13.0: the table pins each torch to one release."""
    if not (match := TORCH_PIN.fullmatch(requirement.strip())):
        raise TableError(f"{where}{': ' if where else ''}{requirement!r}: a torch of the target table is "
                         "pinned as torch==X.Y.Z")
    return match[1]


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
    "qemu-cpu-options": ("qemu_cpu_options", dict, False),
    "builders": ("builders", list, False),
    "proven-elsewhere": ("proven_elsewhere", dict, False),
    "test-torches": ("test_torches", list, False),
    "sdist-builds": ("sdist_builds", dict, False),
}
# [...targets.<arch>.sdist-builds.<suite>]
_SDIST_KEYS: dict[str, tuple[str, type, bool]] = {
    "python-versions": ("python_versions", list, True),
    "torch": ("torch", str, True),
}


def _did_you_mean(word: str, choices: Any) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def one_of(where: str, what: str, value: str, choices: Any) -> None:
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


def row_name(arch: str) -> str:
    return f"[{TABLE}.targets.{arch}]"


def _parse_target(arch: str, row: Mapping[str, Any]) -> Target:
    where = row_name(arch)
    one_of(f"[{TABLE}.targets]", "architecture", arch, ARCHES)
    fields: dict[str, Any] = {"arch": arch, **typed_fields(where, row, _KEYS)}

    expected_platform = ARCHES[arch].platform
    if fields["platform"] != expected_platform:
        raise TableError(f"{where}: platform must be {expected_platform!r} for {arch}")
    one_of(where, "suite", fields["suite"], SUITES)
    one_of(where, "runner", fields["runner"], RUNNERS)

    fields["python_versions"] = _suite_pythons(where, fields["suite"], fields["python_versions"])
    torch_version(fields["torch"], where)
    fields["test_torches"] = _test_torches(where, fields["torch"], fields.get("test_torches", [fields["torch"]]))
    fields["sdist_builds"] = tuple(_sdist_build(f"{where} sdist-builds.{suite}", suite, row)
                                   for suite, row in fields.get("sdist_builds", {}).items())

    isa_levels = tuple(fields.get("isa_levels", ()))
    options = fields.pop("qemu_cpu_options", {})
    models = fields.get("cpu_models", {})
    for name, value in options.items():
        one_of(f"{where} qemu-cpu-options", "CPU model", name, models)
        if not isinstance(value, str):
            raise TableError(f"{where}: qemu-cpu-options values must be strings of QEMU properties ({name})")
    cpu_models = tuple(CpuModel(name, isa, options.get(name, "")) for name, isa in models.items())
    if fields["runner"] == "native":
        if cpu_models:
            raise TableError(f"{where}: cpu-models apply to runner = \"qemu\" only")
        if "isa_levels" not in fields:  # every level of the arch's ladder (the host runs those it has)
            isa_levels = levels.names(ARCHES[arch].sources)
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
    if "builders" in fields:
        fields["builders"] = tuple(fields["builders"])
    elsewhere = fields.get("proven_elsewhere", {})
    if not all(isinstance(why, str) and why.strip() for why in elsewhere.values()):
        raise TableError(f"{where}: proven-elsewhere values must say where each level's record comes from")
    fields["proven_elsewhere"] = tuple(elsewhere.items())
    return Target(**fields)


def _suite_pythons(where: str, suite: str, versions: list[Any]) -> tuple[str, ...]:
    suite_python = SUITES[suite].python
    if not versions or any(version != suite_python for version in versions):
        # The images use the suite's own CPython; other versions would need another source.
        raise TableError(
            f"{where}: python-versions must be [{suite_python!r}]: {suite} provides CPython {suite_python} only"
        )
    return tuple(versions)


def _test_torches(where: str, torch: str, torches: list[Any]) -> tuple[str, ...]:
    if not all(isinstance(item, str) for item in torches):
        raise TableError(f"{where}: test-torches must be torch requirements (torch==X.Y.Z)")
    versions = [torch_version(item, where) for item in torches]
    if torch not in torches:
        raise TableError(f"{where}: test-torches must hold {torch!r}, the torch the wheel is built against")
    if len(set(versions)) != len(versions):
        raise TableError(f"{where}: test-torches names a torch twice")
    return tuple(torches)


def _sdist_build(where: str, suite: str, row: Any) -> SdistBuild:
    one_of(where, "suite", suite, SUITES)
    if not isinstance(row, dict):
        raise TableError(f"{where}: must be a table of python-versions and torch")
    fields = typed_fields(where, row, _SDIST_KEYS)
    torch_version(fields["torch"], where)
    return SdistBuild(suite, _suite_pythons(where, suite, fields["python_versions"]), fields["torch"])


def parse_targets(pyproject: Mapping[str, Any]) -> dict[str, Target]:
    """The targets of a parsed pyproject.toml, keyed by architecture."""
    table = pyproject.get("tool", {}).get(NAME)
    if table is None:
        raise TableError(f"pyproject.toml has no [{TABLE}] table")
    unknown = set(table) - set(SECTIONS)
    if unknown:
        key = sorted(unknown)[0]
        raise TableError(f"[{TABLE}]: unknown key {key!r}{_did_you_mean(key, SECTIONS)}")
    rows = table.get("targets") or {}
    if not rows:
        raise TableError(f"[{TABLE}.targets] lists no target")
    return {arch: _parse_target(arch, row) for arch, row in rows.items()}


def load_targets(pyproject_path: Path = PYPROJECT) -> dict[str, Target]:
    with pyproject_path.open("rb") as file:
        return parse_targets(tomllib.load(file))


def select(targets: Mapping[str, Target], arches: list[str]) -> list[Target]:
    """The targets named on the command line (all of them when none is named)."""
    for arch in arches:
        one_of("--arch", "architecture", arch, targets)
    return [targets[arch] for arch in arches] if arches else list(targets.values())
