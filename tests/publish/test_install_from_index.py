"""The built, tested wheels go to a real index, and install from it on EACH
architecture: `pip install` from the pypiserver into a clean container of the
target (aarch64 under QEMU), then a smoke test of the op against the oracle.

Uses the wheels in wheelhouse/ (nox -s build) and the test records the test
sessions left in reports/records/ (nox -s test-x86_64 / test-arm64); publish refuses a
wheel without a passing record, as it would for a real release, but lets through,
by name, the levels no record here proves (a CPU that lacks them, aarch64's generic).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.utils import parse_wheel_filename

from harness.building import build, versioning
from harness.common import console
from harness.common.paths import IMAGE_CONTEXTS
from harness.plan.targets import Target
from harness.proving import gate, records
from harness.publishing import publish
from harness.setup import containers, host, images
from tests.publish.support import REPO, TARGETS, Index, Release, run_publish, start_index, uploader_env

SMOKE = """
import torch, moe_xarch
from moe_xarch import reference
torch.manual_seed(0)
T, H, I, E, K = 4, 32, 32, 4, 2
x = torch.randn(T, H)
w1 = torch.randn(E, 2 * I, H) / H ** 0.5
w2 = torch.randn(E, H, I) / I ** 0.5
weights, ids = torch.randn(T, E).softmax(-1).topk(K)
out = moe_xarch.fused_experts(x, w1, w2, weights, ids.to(torch.int32))
torch.testing.assert_close(out, reference.fused_experts(x, w1, w2, weights, ids.to(torch.int32)), atol=1e-4, rtol=1e-4)
print("smoke ok", moe_xarch.__name__, moe_xarch.isa())
"""


@pytest.fixture(scope="module")
def tested_release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    """wheelhouse/'s wheels and reports/'s test records, copied at once: a build or
    test session may replace them while this module runs."""
    root = tmp_path_factory.mktemp("real")
    wheelhouse, reports = root / "wheelhouse", root / "reports"
    wheelhouse.mkdir()
    reports.mkdir()
    wheels = {arch: Path(shutil.copy2(build.find_wheel(REPO / "wheelhouse", arch), wheelhouse)) for arch in TARGETS}
    shutil.copytree(records.records_dir(REPO / "reports"), records.records_dir(reports))
    # the sdist of the wheels' version, whatever the tree's git state
    version = str(parse_wheel_filename(next(iter(wheels.values())).name)[1])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(versioning.VARIABLE, version)
        sdist = publish.build_sdist(sys.executable, wheelhouse)
    return Release(wheelhouse, reports, wheels, sdist)


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory, tested_release: Release):
    server = start_index(tmp_path_factory.mktemp("index"))
    try:
        # builds between tags carry a local version (X.Y.devN+gHASH); pypiserver takes it; the
        # levels this machine's CPU lacks are the gate's to refuse (tests/harness/test_gate.py)
        result = run_publish(tested_release, uploader_env(server), "--allow-local-version",
                             *_untested(tested_release), timeout=900)
        assert result.returncode == 0, result.stdout + result.stderr
        yield server
    finally:
        server.stop()


def _untested(release: Release) -> list[str]:
    """--allow-untested-level for each level of the wheels that no record here proves."""
    every = records.load_records(release.reports)
    unproven = {level.level for arch, wheel in release.wheels.items()
                for level in gate.levels(TARGETS[arch], gate.of_wheel(every, records.sha256(wheel)), {})
                if not level.proven_by}
    return [*(f"--allow-untested-level={level}" for level in sorted(unproven)),
            *(["--reason=this test installs from the index; not every level runs on this machine"] if unproven else [])]


def _test_image(target: Target) -> str:
    """The target's test image, as the test sessions make it: on a fresh machine
    (a CI job of its own) the host needs Docker, QEMU's registration and debootstrap."""
    host.ensure_host(host.Needs.of([target]))
    specs = images.ensure_images(target, IMAGE_CONTEXTS, console.StepLog(), upto="test")
    return specs["test"].tag


@pytest.mark.parametrize("arch", list(TARGETS))
def test_install_from_the_index_and_run_the_op(arch: str, published: Index, tested_release: Release) -> None:
    target = TARGETS[arch]
    version = str(parse_wheel_filename(tested_release.wheels[arch].name)[1])
    image = _test_image(target)
    env = [f"--env=QEMU_CPU={target.cpu_models[-1].qemu_cpu}"] if target.runner == "qemu" else []
    name = containers.container_name("publish-smoke", arch)
    # Only the local index: the image's torch must satisfy the wheel's torch pin, or
    # pip fails to find a torch there; pip check confirms what got installed.
    script = (
        f"pip install --no-cache-dir --index-url {published.simple} 'moe-xarch=={version}' "
        f"&& pip check && python -c \"$0\""
    )
    try:
        result = subprocess.run(
            ["docker", "run", "--rm", f"--name={name}", *containers.label_args(),
             f"--platform={target.platform}", "--network=host", *env,
             image, "bash", "-c", script, SMOKE],
            capture_output=True, text=True, timeout=1800,
        )
    finally:
        containers.remove(name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Successfully installed moe-xarch-{version}" in result.stdout
    assert "smoke ok moe_xarch" in result.stdout
