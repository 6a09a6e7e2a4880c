"""Publishing: from tested wheels to an index, all or nothing.

`nox -s publish` uploads one wheel per target of the table and the sdist, and
only wheels whose every level a passing run proved (harness/proving/gate.py, from the
records of harness/proving/records.py). The destination and what it holds are the
index client's (harness/publishing/index.py).

Before uploading, the index is asked which files it already has: a file with
the same bytes is skipped (so a re-run after a half-failed upload finishes the
job), a file of the same version with other bytes stops everything (an index
version is immutable). Files go up one at a time, so after a failure the index
is asked again and the user told exactly which files are on it and which not.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import Version

from build_support import torch_pin
from harness.building.build import put, wheel_matches
from harness.common.errors import HarnessError, PublishError, writing
from harness.common.paths import PYPROJECT, REPO, REPORTS, WHEELHOUSE
from harness.common.project import NAME, PACKAGE
from harness.plan.targets import Target, load_targets
from harness.plan.verdict import Allowed, load_allowed
from harness.proving import gate
from harness.proving.records import load_records, sha256
from harness.publishing import abi_audit
from harness.publishing.index import Destination, destination, index_files
from harness.setup.tools import backend_requirements
from harness.setup.wheels import read_wheel

# What the publish tests add: a real index with htpasswd authentication.
TEST_REQUIREMENTS = ("pytest", "pypiserver>=2.3", "passlib>=1.7")


# --- what would be published ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Artifact:
    path: Path
    sha256: str
    version: str
    arch: str  # "" for the sdist

    @property
    def name(self) -> str:
        return self.path.name


def torch_pin_problem(wheel: Path, target: Target) -> str | None:
    """The wheel must be whole, the project's and for its target, and require the
    torch range every wheel does (build_support/torch_pin.py)."""
    try:
        metadata = read_wheel(wheel, f"run nox -s build -- --arch {target.arch}, which replaces it, then "
                              f"publish again", project=PACKAGE, arch=target.arch)
    except HarnessError as error:
        return str(error)
    requires = metadata.get_all("Requires-Dist") or []
    pins = [r for r in requires if canonicalize_name(re.split(r"[=<>!~ ]", r, maxsplit=1)[0]) == "torch"]
    if not any(pin.replace(" ", "") == torch_pin.REQUIREMENT for pin in pins):
        return f"{wheel.name} requires {pins or 'no torch'}, not {torch_pin.REQUIREMENT}"
    return None


def abi_problems(wheel: Path) -> list[str]:
    """Why the wheel's library cannot load on every torch it requires (harness/publishing/abi_audit.py)."""
    audits = abi_audit.audit_wheel(wheel)
    for audit in audits:
        print(f"{wheel.name}: {audit.line()}", flush=True)
    if not audits:
        return ["torch-abi-audit found no library that uses torch in it"]
    return [problem for audit in audits if (problem := audit.problem())]


def collect(targets: Mapping[str, Target], wheelhouse: Path, records: Sequence[Mapping[str, Any]],
            allow_local_version: bool = False, allowed: Sequence[Allowed] = (),
            untested: Mapping[str, str] | None = None) -> list[Artifact]:
    """The wheels and sdist to publish, or PublishError listing every reason not to.
    ``untested``: level -> why it may ship without a passing run."""
    untested = untested or {}
    problems: list[str] = []
    tested: list[Mapping[str, Any]] = []
    shipped: set[str] = set()
    artifacts: list[Artifact] = []
    wheels = sorted(wheelhouse.glob("*.whl")) if wheelhouse.is_dir() else []
    claimed: set[Path] = set()
    for arch, target in targets.items():
        mine = [w for w in wheels if wheel_matches(w.name, arch)]
        claimed.update(mine)
        if len(mine) != 1:
            problems.append(
                f"{arch}: expected exactly one wheel in {wheelhouse.name}/, found "
                f"{', '.join(w.name for w in mine) or 'none'} (nox -s build -- --arch {arch})"
            )
            continue
        wheel = mine[0]
        digest = sha256(wheel)
        if pin := torch_pin_problem(wheel, target):
            problems.append(f"{arch}: {pin}")
        else:
            problems += [f"{arch}: {wheel.name}: {problem}" for problem in abi_problems(wheel)]
        mine = gate.of_wheel(records, digest)
        shipped.update(gate.shipped(mine))
        if failed := gate.problems(target, mine, untested):
            problems.append(f"{arch}: {wheel.name} (sha256 {digest[:12]}…) is not tested: " + "; ".join(failed))
        else:
            tested += mine
        artifacts.append(Artifact(wheel, digest, str(parse_wheel_filename(wheel.name)[1]), arch))
    problems += gate.same_tests_problems(tested, allowed)
    problems += [f"--allow-untested-level {level}: no wheel ships that level (they ship: "
                 f"{', '.join(sorted(shipped)) or 'none recorded'})" for level in untested if level not in shipped]
    problems += [f"{w.name}: a wheel of no target in the table" for w in wheels if w not in claimed]
    sdists = sorted(wheelhouse.glob(f"{PACKAGE}-*.tar.gz")) if wheelhouse.is_dir() else []
    if len(sdists) != 1:
        problems.append(f"expected exactly one sdist in {wheelhouse.name}/, found {[s.name for s in sdists] or 'none'}")
    else:
        sdist = sdists[0]
        artifacts.append(Artifact(sdist, sha256(sdist), str(parse_sdist_filename(sdist.name)[1]), ""))
    versions = sorted({a.version for a in artifacts})
    if len(versions) > 1:
        problems.append(f"the files disagree on the version: {', '.join(versions)} (rebuild them from one commit)")
    for version in versions:
        if Version(version).local and not allow_local_version:
            problems.append(
                f"version {version} is a local version (built from an untagged commit or a dirty tree), "
                f"which PyPI refuses: tag the release (git tag vX.Y.Z) and rebuild, or, for a private "
                f"index that takes local versions, add --allow-local-version"
            )
    if problems:
        raise PublishError("Refusing to publish:\n  " + "\n  ".join(problems))
    return artifacts


def sdist_problems(sdist: Path) -> list[str]:
    """The sdist must be whole and carry what a native build needs."""
    try:
        with tarfile.open(sdist) as archive:
            names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    except (tarfile.TarError, EOFError, zlib.error, OSError) as error:
        return [f"{sdist} is not a whole sdist, truncated or damaged ({error}): delete it (nox -s publish "
                f"builds the tree's sdist when the wheelhouse has none) and publish again"]
    needed = ["pyproject.toml", "CMakeLists.txt", "PKG-INFO", f"csrc/{PACKAGE}.h",
              "csrc/register.cpp", "build_support/torch_pin.py", f"package/{PACKAGE}/__init__.py"]
    return [f"{sdist.name} lacks {name}" for name in needed if name not in names]


# --- the plan and the upload ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Plan:
    upload: tuple[Artifact, ...]
    present: tuple[Artifact, ...]  # already on the index with these very bytes


def make_plan(artifacts: Sequence[Artifact], on_index: Mapping[str, str]) -> Plan:
    conflicts = []
    for artifact in artifacts:
        theirs = on_index.get(artifact.name)
        if theirs is not None and theirs != artifact.sha256:
            conflicts.append(f"{artifact.name}: the index has sha256 {theirs[:12]}…, this file is {artifact.sha256[:12]}…")
    versions = {artifact.version for artifact in artifacts}
    ours = {artifact.name for artifact in artifacts}
    for filename in sorted(on_index):
        version = _version_of(filename)
        if version in versions and filename not in ours:
            conflicts.append(f"{filename}: on the index for version {version}, and not part of this release")
    if conflicts:
        raise PublishError(
            f"Refusing to publish: version {', '.join(sorted(versions))} is already on the index with "
            "different files, and a published version never changes:\n  " + "\n  ".join(conflicts)
            + "\nRelease a new version (a new git tag) instead. Nothing was uploaded."
        )
    upload = tuple(a for a in artifacts if a.name not in on_index)
    present = tuple(a for a in artifacts if a.name in on_index)
    return Plan(upload, present)


def _version_of(filename: str) -> str | None:
    try:
        if filename.endswith(".whl"):
            return str(parse_wheel_filename(filename)[1])
        return str(parse_sdist_filename(filename)[1])
    except ValueError:
        return None


def _redacted(text: str, dest: Destination) -> str:
    for secret in (dest.password, os.environ.get("TWINE_PASSWORD")):
        if secret:
            text = text.replace(secret, "****")
    return text


def twine_check(twine: Sequence[str], artifacts: Sequence[Artifact]) -> None:
    result = subprocess.run([*twine, "check", "--strict", *(str(a.path) for a in artifacts)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise PublishError(f"twine check --strict failed; nothing was uploaded:\n{result.stdout}{result.stderr}")
    print(result.stdout.strip(), flush=True)


def _state_report(dest: Destination, artifacts: Sequence[Artifact]) -> str:
    try:
        on_index = index_files(dest)
    except PublishError as error:
        return f"(could not ask the index what it holds now: {error})"
    lines = []
    for artifact in artifacts:
        theirs = on_index.get(artifact.name)
        state = ("on the index" if theirs == artifact.sha256
                 else "NOT on the index" if theirs is None else "on the index with OTHER bytes")
        lines.append(f"  {state:<30} {artifact.name}")
    return "\n".join(lines)


def _tail(output: str) -> str:
    """twine's output, less the traceback that a dropped connection comes with."""
    if "Traceback (most recent call last)" in output:
        return output.splitlines()[-1]
    return output


def upload(twine: Sequence[str], dest: Destination, plan: Plan, artifacts: Sequence[Artifact]) -> None:
    """One file per twine call; after any failure, report what the index holds."""
    for number, artifact in enumerate(plan.upload, 1):
        print(f"uploading {number}/{len(plan.upload)}: {artifact.name}", flush=True)
        command = [*twine, "upload", "--non-interactive", "--disable-progress-bar",
                   *dest.twine_args, str(artifact.path)]
        try:
            result = subprocess.run(command, capture_output=True, text=True)
        except BaseException:
            print("upload interrupted; the index now holds:\n" + _state_report(dest, artifacts), flush=True)
            raise
        if result.returncode != 0:
            output = _redacted(result.stdout + result.stderr, dest).strip()
            hint = ""
            if "403" in output or "401" in output:
                hint = "\nThe index refused the credentials: check TWINE_USERNAME/TWINE_PASSWORD (or the keyring)."
            raise PublishError(
                f"uploading {artifact.name} failed:\n{_tail(output)}{hint}\n\nThe index now holds:\n"
                + _state_report(dest, artifacts)
                + "\nRun nox -s publish again once the cause is fixed: files already there are skipped."
            )
    on_index = index_files(dest)
    missing = [a.name for a in artifacts if on_index.get(a.name) != a.sha256]
    if missing:
        raise PublishError(f"the upload ended but the index does not list {', '.join(missing)}:\n"
                           + _state_report(dest, artifacts))


# --- the session ---------------------------------------------------------------------------


def wheel_versions(wheelhouse: Path) -> set[str]:
    return {str(parse_wheel_filename(w.name)[1]) for w in wheelhouse.glob(f"{PACKAGE}-*.whl")}


def _sdists(wheelhouse: Path) -> dict[str, Path]:
    """version -> sdist in wheelhouse/."""
    return {str(parse_sdist_filename(p.name)[1]): p for p in wheelhouse.glob(f"{PACKAGE}-*.tar.gz")}


def needs_sdist_build(wheelhouse: Path) -> bool:
    """Whether wheelhouse/'s wheels agree on a version whose sdist it lacks (one
    built elsewhere, as in CI, is used as it is)."""
    versions = wheel_versions(wheelhouse)
    return len(versions) == 1 and versions.pop() not in _sdists(wheelhouse)


def build_sdist(python: str, outdir: Path, repo: Path = REPO) -> Path:
    """Build the tree's sdist into outdir; a killed build leaves no half file there."""
    with tempfile.TemporaryDirectory(prefix=f"{NAME}-sdist-") as out:
        subprocess.run([python, "-m", "build", "--sdist", "--no-isolation", "--outdir", out, str(repo)], check=True)
        (built,) = Path(out).glob("*.tar.gz")
        return put(built, outdir, "nox -s publish")


def ensure_sdist(python: str, wheelhouse: Path) -> None:
    """Build the sdist of the wheels' version when wheelhouse/ lacks it, replacing
    sdists of other versions (earlier trees). Its builds are reproducible, so a
    re-run after a failed upload uploads the same bytes."""
    if needs_sdist_build(wheelhouse):
        for stale in _sdists(wheelhouse).values():
            print(f"removing {stale.name} from {wheelhouse.name}/: not the wheels' version", flush=True)
            with writing(wheelhouse, "nox -s publish"):
                stale.unlink()
        build_sdist(python, wheelhouse)


def requirements(argv: Sequence[str]) -> list[str]:
    """What `nox -s publish -- ARGV` installs: twine to check and upload and, when
    the sdist is to be built, build and the backend at the wheels' pins (making an
    sdist needs no torch: build_support/torch_pin.py leaves its pin to the wheel)."""
    args = parse_args(argv)
    tools = ["twine>=6.1", "packaging>=24", abi_audit.requirement()]
    if args.sdist_only or needs_sdist_build(args.wheelhouse):
        tools += ["build>=1.2", *backend_requirements()]
    return tools


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="nox -s publish --")
    parser.add_argument("--dry-run", action="store_true", help="show what would go where; upload nothing")
    parser.add_argument("--check-only", action="store_true",
                        help="only check the files (tested, twine check); no destination needed")
    parser.add_argument("--allow-local-version", action="store_true",
                        help="publish a local version (X.Y.devN+gHASH) to a private index that takes one")
    parser.add_argument("--sdist-only", action="store_true",
                        help="build the tree's sdist into the wheelhouse and check it (CI hands it to publish)")
    parser.add_argument("--allow-untested-level", action="append", default=[], metavar="LEVEL",
                        help="let a wheel ship LEVEL without a passing run (repeatable; needs --reason)")
    parser.add_argument("--reason", action="append", default=[],
                        help="why: one for all the levels, or one each; printed and kept in reports/untested/")
    parser.add_argument("--wheelhouse", type=Path, default=WHEELHOUSE)
    parser.add_argument("--reports", type=Path, default=REPORTS)
    parser.add_argument("--pyproject", type=Path, default=PYPROJECT)
    return parser.parse_args(list(argv))


def _table(artifacts: Iterable[Artifact], actions: Mapping[str, str]) -> str:
    return "\n".join(f"  {actions.get(a.name, ''):<22} {a.name}\n      sha256 {a.sha256}" for a in artifacts)


def _levels(targets: Mapping[str, Target], artifacts: Sequence[Artifact], records: Sequence[Mapping[str, Any]],
            untested: Mapping[str, str], reports: Path) -> None:
    """Print which machine proved each level; keep the levels let through unproven."""
    rows = [row for a in artifacts if a.arch
            for row in gate.levels(targets[a.arch], gate.of_wheel(records, a.sha256), untested)]
    print("every level shipped, and what proved it:\n" + gate.table(rows), flush=True)
    if used := [row for row in rows if not row.proven_by]:
        kept = gate.keep_untested(used, {a.arch: a.sha256 for a in artifacts if a.arch}, reports)
        print(f"untested levels let through, kept in {', '.join(map(str, kept))}", flush=True)


def main(argv: Sequence[str]) -> None:
    twine, env = (sys.executable, "-m", "twine"), os.environ
    args = parse_args(argv)
    if args.sdist_only:
        sdist = build_sdist(sys.executable, args.wheelhouse)
        if problems := sdist_problems(sdist):
            raise PublishError("; ".join(problems))
        print(f"built {sdist}", flush=True)
        return
    targets = load_targets(args.pyproject)
    ensure_sdist(sys.executable, args.wheelhouse)
    untested = gate.untested_levels(args.allow_untested_level, args.reason)
    records = load_records(args.reports)
    artifacts = collect(targets, args.wheelhouse, records, args.allow_local_version,
                        load_allowed(args.pyproject, targets), untested)
    sdist = next(a for a in artifacts if not a.arch)
    if problems := sdist_problems(sdist.path):
        raise PublishError("Refusing to publish: " + "; ".join(problems))
    twine_check(twine, artifacts)
    _levels(targets, artifacts, records, untested, args.reports)
    if args.check_only:
        print("ready to publish:\n" + _table(artifacts, {}), flush=True)
        return
    try:
        dest = destination(env)
    except PublishError:
        if args.dry_run:
            print("would publish, once a destination is set:\n" + _table(artifacts, {}), flush=True)
        raise
    plan = make_plan(artifacts, index_files(dest))
    actions = {a.name: "upload" for a in plan.upload} | {a.name: "skip (already there)" for a in plan.present}
    header = "would publish" if args.dry_run else "publishing"
    print(f"{header} version {artifacts[0].version} to {dest.describe()}\n"
          f"credentials: {dest.credentials_source(env)}\n" + _table(artifacts, actions), flush=True)
    if args.dry_run:
        print("dry run: nothing uploaded", flush=True)
        return
    if plan.upload:
        upload(twine, dest, plan, artifacts)
    print(f"published: every file of {NAME} {artifacts[0].version} is on the index "
          f"({len(plan.upload)} uploaded, {len(plan.present)} already there)", flush=True)


if __name__ == "__main__":  # what nox -s publish runs, in its venv
    try:
        main(sys.argv[1:])
    except HarnessError as error:
        print(f"publish: {error}", file=sys.stderr, flush=True)
        sys.exit(1)
