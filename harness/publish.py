"""Publishing: from tested wheels to an index, all or nothing.

`nox -s publish` uploads one wheel per target of the table and the sdist, and
only files that the test sessions recorded as passing (reports/manifest-<arch>.json,
keyed by each wheel's sha256). The destination comes from the environment alone
(TWINE_REPOSITORY_URL, or TWINE_REPOSITORY naming a .pypirc section); there is
no default. Credentials are twine's business (TWINE_USERNAME/TWINE_PASSWORD or a
keyring) and are never printed.

Before uploading, the index is asked which files it already has: a file with
the same bytes is skipped (so a re-run after a half-failed upload finishes the
job), a file of the same version with other bytes stops everything (an index
version is immutable). Files go up one at a time, so after a failure the index
is asked again and the user told exactly which files are on it and which not.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import html.parser
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import Version

from harness.build import PROJECT, backend_requirements, put, wheel_matches
from harness.errors import HarnessError, writing
from harness.gha import TEST_SESSIONS
from harness.suite import RunRecord
from harness.targets import Target, load_targets
from harness.verdict import EVERY_RUN, Allowed, Outcome, RunId, compare, load_allowed, read_junit
from harness.wheels import read_wheel

REPO = Path(__file__).resolve().parent.parent
WHEELHOUSE = REPO / "wheelhouse"
REPORTS = REPO / "reports"
DISTRIBUTION = "moe-xarch"
# What the publish tests add: a real index with htpasswd authentication.
TEST_REQUIREMENTS = ("pytest", "pypiserver>=2.3", "passlib>=1.7")

NO_DESTINATION = (
    "No destination index: nox -s publish never picks one by itself. Set either\n"
    "  TWINE_REPOSITORY_URL=<the index's upload URL>   or\n"
    "  TWINE_REPOSITORY=<a section of your .pypirc>\n"
    "and the credentials as TWINE_USERNAME / TWINE_PASSWORD (or in a keyring).\n"
    "Set MOE_XARCH_INDEX_URL to the index's simple (PEP 503) URL when it is not\n"
    "<upload URL>/simple/. Try it first with: nox -s publish -- --dry-run"
)


class PublishError(HarnessError):
    """Publishing refused or failed; the message says why and what to do."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --- the manifest the test sessions write --------------------------------------------


def _write_json_atomically(path: Path, data: object, rerun: str) -> None:
    incoming = None
    try:
        with writing(path.parent, rerun):
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as file:
                incoming = Path(file.name)
                json.dump(data, file, indent=2)
                file.write("\n")
            os.replace(incoming, path)
    finally:
        if incoming is not None:
            incoming.unlink(missing_ok=True)


def load_manifest(reports: Path = REPORTS) -> dict[str, Any]:
    """Every test record in reports/: one manifest file per architecture, so that
    CI jobs of different architectures can hand theirs over side by side."""
    merged: dict[str, Any] = {"wheels": {}}
    for path in sorted(reports.glob("manifest*.json")):
        merged["wheels"].update(json.loads(path.read_text()).get("wheels", {}))
    return merged


def record_tested(target: Target, wheel: Path, records: Sequence[RunRecord], reports: Path = REPORTS) -> Path:
    """Record a target's test runs against the exact wheel they installed.

    Called by the test flow after each target's runs (harness/flows.py). Entries
    are keyed by sha256, so a rebuilt wheel has no record until it is tested.
    """
    from harness.summary import judge  # the summary's verdict, so both agree

    runs = []
    for record in records:
        row = judge(record)
        junit = Path(record.report_dir) / "junit.xml" if record.report_dir else None
        tests = read_junit(junit) if junit and junit.is_file() else {}
        runs.append(
            {"cpu": record.cpu, "isa": record.isa, "isa_reported": record.isa_reported,
             "passed": row.counts.passed, "failed": row.counts.failures,
             "skipped": row.counts.skipped, "result": row.result,
             # what publish compares across the architectures (same_tests_problems)
             "tests": {test: outcome.outcome for test, outcome in tests.items()},
             # which runs must run each test (harness/verdict.py designated), where not every run
             "scopes": {test: outcome.scope for test, outcome in tests.items() if outcome.scope != EVERY_RUN}}
        )
    path = reports / f"manifest-{target.arch}.json"
    manifest = json.loads(path.read_text()) if path.exists() else {"wheels": {}}
    manifest["wheels"][sha256(wheel)] = {
        "file": wheel.name, "arch": target.arch, "torch": target.torch, "runs": runs,
    }
    _write_json_atomically(path, manifest, f"nox -s {TEST_SESSIONS[target.arch]}")
    return path


def test_problems(target: Target, entry: Mapping[str, Any] | None) -> list[str]:
    """Why a manifest entry is not a passing test record for the target (empty: it is)."""
    if entry is None:
        return [f"no test record for this exact file (nox -s {TEST_SESSIONS[target.arch]} tests it)"]
    runs = entry.get("runs", [])
    problems = [f"{run['cpu']}/{run['isa']}: {run['result']}" for run in runs
                if run["result"].startswith("FAILED")]
    passed = {(run["cpu"], run["isa"]) for run in runs if run["result"] == "passed"}
    if target.runner == "qemu":
        problems += [f"CPU model {model.name} ({model.isa}) was not tested"
                     for model in target.cpu_models if (model.name, model.isa) not in passed]
    else:
        ran = {run["isa"] for run in runs}
        problems += [f"ISA level {level} has no record" for level in target.isa_levels if level not in ran]
    if not passed:
        problems.append("no run passed")
    return problems


def same_tests_problems(entries: Mapping[str, Mapping[str, Any]], allowed: Sequence[Allowed]) -> list[str]:
    """The recorded runs of the wheels to publish (arch -> manifest entry) must have run
    the same tests, as the matrix verdict requires: test sessions run one arch at a time."""
    runs: dict[RunId, dict[str, Outcome]] = {}
    problems = []
    for arch, entry in entries.items():
        # Only runs that ran: a level this CPU lacks has no tests, and a failed run is
        # refused by test_problems already.
        for run in (run for run in entry.get("runs", []) if run["result"] == "passed"):
            if "tests" not in run:
                problems.append(f"{arch} {run['cpu']}/{run['isa']}: recorded without its test IDs "
                                f"(test it again: nox -s {TEST_SESSIONS[arch]})")
                continue
            scopes = run.get("scopes", {})
            runs[RunId(arch, "", run["cpu"], run["isa"])] = {
                test: Outcome(outcome, scope=scopes.get(test, EVERY_RUN)) for test, outcome in run["tests"].items()}
    if runs and not problems:
        problems += [f"not the same tests: {drift}" for drift in compare(runs, allowed).drifts]
    return problems


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
    """The wheel must be whole, the project's and for its target, and pin the torch
    release of its target's table row (X.Y.*)."""
    try:
        metadata = read_wheel(wheel, f"run nox -s build -- --arch {target.arch}, which replaces it, then "
                              f"publish again", project=PROJECT, arch=target.arch)
    except HarnessError as error:
        return str(error)
    major_minor = ".".join(target.torch.split("==", 1)[1].split(".")[:2])
    requires = metadata.get_all("Requires-Dist") or []
    pins = [r for r in requires if canonicalize_name(r.split("=")[0].split(" ")[0]) == "torch"]
    expected = f"torch=={major_minor}.*"
    if not any(pin.replace(" ", "") == expected for pin in pins):
        return f"{wheel.name} requires {pins or 'no torch'}, not {expected} ({target.arch}'s {target.torch})"
    return None


def collect(targets: Mapping[str, Target], wheelhouse: Path, manifest: Mapping[str, Any],
            allow_local_version: bool = False, allowed: Sequence[Allowed] = ()) -> list[Artifact]:
    """The wheels and sdist to publish, or PublishError listing every reason not to."""
    problems: list[str] = []
    tested: dict[str, Mapping[str, Any]] = {}
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
        entry = manifest.get("wheels", {}).get(digest)
        failed = test_problems(target, entry)
        if failed:
            problems.append(f"{arch}: {wheel.name} (sha256 {digest[:12]}…) is not tested: " + "; ".join(failed))
        else:
            tested[arch] = entry
        artifacts.append(Artifact(wheel, digest, str(parse_wheel_filename(wheel.name)[1]), arch))
    problems += same_tests_problems(tested, allowed)
    problems += [f"{w.name}: a wheel of no target in the table" for w in wheels if w not in claimed]
    sdists = sorted(wheelhouse.glob(f"{PROJECT}-*.tar.gz")) if wheelhouse.is_dir() else []
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
    needed = ["pyproject.toml", "CMakeLists.txt", "PKG-INFO", "csrc/moe_xarch.h",
              "csrc/register.cpp", "build_support/torch_pin.py", "package/moe_xarch/__init__.py"]
    return [f"{sdist.name} lacks {name}" for name in needed if name not in names]


# --- where to -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Destination:
    upload_url: str
    simple_url: str
    twine_args: tuple[str, ...]  # --repository-url URL or --repository NAME
    username: str | None = dataclasses.field(default=None, repr=False)
    password: str | None = dataclasses.field(default=None, repr=False)

    def describe(self) -> str:
        return f"{_redact_url(self.upload_url)} (simple index {_redact_url(self.simple_url)})"

    def credentials_source(self, env: Mapping[str, str]) -> str:
        if env.get("TWINE_PASSWORD"):
            return "TWINE_USERNAME/TWINE_PASSWORD from the environment"
        if self.password:
            return "the .pypirc section"
        return "a keyring, if one holds them (twine asks it)"


def _redact_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password or parts.username:
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        return urllib.parse.urlunsplit(parts._replace(netloc=f"***@{host}"))
    return url


def destination(env: Mapping[str, str] = os.environ) -> Destination:
    url = env.get("TWINE_REPOSITORY_URL", "").strip()
    name = env.get("TWINE_REPOSITORY", "").strip()
    username = env.get("TWINE_USERNAME") or None
    password = env.get("TWINE_PASSWORD") or None
    if url:
        twine_args: tuple[str, ...] = ("--repository-url", url)
    elif name:
        from twine import exceptions, utils

        config_file = env.get("TWINE_CONFIG_FILE", utils.DEFAULT_CONFIG_FILE)
        try:
            config = utils.get_repository_from_config(config_file, name)
        except exceptions.InvalidConfiguration as error:
            raise PublishError(f"TWINE_REPOSITORY={name}: {error}") from None
        url = str(config["repository"])
        username = username or config.get("username")
        password = password or config.get("password")
        twine_args = ("--repository", name, "--config-file", config_file)
    else:
        raise PublishError(NO_DESTINATION)
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise PublishError(f"the destination {url!r} is not an http(s) URL")
    simple = env.get("MOE_XARCH_INDEX_URL", "").strip() or url.rstrip("/") + "/simple/"
    return Destination(url, simple.rstrip("/") + "/", twine_args, username, password)


# --- what the index has -----------------------------------------------------------------------


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.links += [value for key, value in attrs if key == "href" and value]


def _open(dest: Destination, url: str, timeout: float) -> Any:
    request = urllib.request.Request(url)
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as error:
        if error.code != 401 or not dest.password:
            raise
    token = base64.b64encode(f"{dest.username or ''}:{dest.password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    return urllib.request.urlopen(request, timeout=timeout)


def _refuse_other_server(page: str, landed: str) -> None:
    """A project page sent on to another server lists that server's files, not the
    index's own: pypiserver sends a project it has no files of to PyPI unless
    started with --disable-fallback."""
    if urllib.parse.urlsplit(landed).netloc != urllib.parse.urlsplit(page).netloc:
        raise PublishError(
            f"the index sent {_redact_url(page)} on to another server, {_redact_url(landed)}, so what is "
            f"listed there is not the index's own; nothing was uploaded. Publish to an index that answers "
            f"for {DISTRIBUTION} itself (pypiserver: start it with --disable-fallback)"
        )


def index_files(dest: Destination, project: str = DISTRIBUTION, timeout: float = 30) -> dict[str, str]:
    """filename -> sha256 of every file of the project on the index."""
    page = dest.simple_url + canonicalize_name(project) + "/"
    try:
        with _open(dest, page, timeout) as response:
            base = response.geturl()
            _refuse_other_server(page, base)
            text = response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        _refuse_other_server(page, error.geturl())
        if error.code == 404:
            return {}
        if error.code in (401, 403):
            raise PublishError(
                f"the index refused to list {project} ({error.code} {error.reason}) at "
                f"{_redact_url(page)}: check TWINE_USERNAME/TWINE_PASSWORD"
            ) from None
        raise PublishError(f"the index answered {error.code} {error.reason} for {_redact_url(page)}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise PublishError(
            f"the index at {_redact_url(dest.simple_url)} is not reachable ({reason}); nothing was uploaded"
        ) from None
    parser = _Links()
    parser.feed(text)
    files: dict[str, str] = {}
    for link in parser.links:
        absolute = urllib.parse.urljoin(base, link)
        path, _, fragment = absolute.partition("#")
        filename = urllib.parse.unquote(path.rsplit("/", 1)[-1])
        algorithm, _, value = fragment.partition("=")
        if algorithm == "sha256" and value:
            files[filename] = value
        else:  # no sha256 in the page: hash the file itself
            digest = hashlib.sha256()
            with _open(dest, path, timeout) as response:
                for block in iter(lambda: response.read(1 << 20), b""):
                    digest.update(block)
            files[filename] = digest.hexdigest()
    return files


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
    return {str(parse_wheel_filename(w.name)[1]) for w in wheelhouse.glob(f"{PROJECT}-*.whl")}


def _sdists(wheelhouse: Path) -> dict[str, Path]:
    """version -> sdist in wheelhouse/."""
    return {str(parse_sdist_filename(p.name)[1]): p for p in wheelhouse.glob(f"{PROJECT}-*.tar.gz")}


def needs_sdist_build(wheelhouse: Path) -> bool:
    """Whether wheelhouse/'s wheels agree on a version whose sdist it lacks (one
    built elsewhere, as in CI, is used as it is)."""
    versions = wheel_versions(wheelhouse)
    return len(versions) == 1 and versions.pop() not in _sdists(wheelhouse)


def build_sdist(python: str, outdir: Path, repo: Path = REPO) -> Path:
    """Build the tree's sdist into outdir; a killed build leaves no half file there."""
    with tempfile.TemporaryDirectory(prefix="moe-xarch-sdist-") as out:
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
    tools = ["twine>=6.1", "packaging>=24"]
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
    parser.add_argument("--wheelhouse", type=Path, default=WHEELHOUSE)
    parser.add_argument("--reports", type=Path, default=REPORTS)
    parser.add_argument("--pyproject", type=Path, default=REPO / "pyproject.toml")
    return parser.parse_args(list(argv))


def _table(artifacts: Iterable[Artifact], manifest: Mapping[str, Any], actions: Mapping[str, str]) -> str:
    lines = []
    for a in artifacts:
        entry = manifest.get("wheels", {}).get(a.sha256)
        tested = ", ".join(f"{r['cpu']}/{r['isa']}" for r in entry["runs"] if r["result"] == "passed") if entry else "-"
        lines.append(f"  {actions.get(a.name, ''):<22} {a.name}\n      sha256 {a.sha256}  tested: {tested}")
    return "\n".join(lines)


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
    manifest = load_manifest(args.reports)
    artifacts = collect(targets, args.wheelhouse, manifest, args.allow_local_version,
                        load_allowed(args.pyproject, targets))
    sdist = next(a for a in artifacts if not a.arch)
    if problems := sdist_problems(sdist.path):
        raise PublishError("Refusing to publish: " + "; ".join(problems))
    twine_check(twine, artifacts)
    if args.check_only:
        print("ready to publish:\n" + _table(artifacts, manifest, {}), flush=True)
        return
    try:
        dest = destination(env)
    except PublishError:
        if args.dry_run:
            print("would publish, once a destination is set:\n" + _table(artifacts, manifest, {}), flush=True)
        raise
    plan = make_plan(artifacts, index_files(dest))
    actions = {a.name: "upload" for a in plan.upload} | {a.name: "skip (already there)" for a in plan.present}
    header = "would publish" if args.dry_run else "publishing"
    print(f"{header} version {artifacts[0].version} to {dest.describe()}\n"
          f"credentials: {dest.credentials_source(env)}\n" + _table(artifacts, manifest, actions), flush=True)
    if args.dry_run:
        print("dry run: nothing uploaded", flush=True)
        return
    if plan.upload:
        upload(twine, dest, plan, artifacts)
    print(f"published: every file of {DISTRIBUTION} {artifacts[0].version} is on the index "
          f"({len(plan.upload)} uploaded, {len(plan.present)} already there)", flush=True)


if __name__ == "__main__":  # what nox -s publish runs, in its venv
    try:
        main(sys.argv[1:])
    except HarnessError as error:
        print(f"publish: {error}", file=sys.stderr, flush=True)
        sys.exit(1)
