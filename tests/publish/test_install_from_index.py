"""The built, tested wheels go to a real index, and install from it on EACH
architecture: `pip install` from the pypiserver into a clean container of the
target (aarch64 under QEMU), then a smoke test of the op against the oracle.

Uses the wheels in wheelhouse/ (nox -s build) and the test records the test
sessions left in reports/ (nox -s test-x86_64 / test-arm64).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import build as builds
from harness import console, containers, host, images, publish
from harness.suite import RunRecord
from harness.targets import Target
from tests.publish.support import REPO, TARGETS, Index, Release, run_publish, start_index, uploader_env

SMOKE = """
import torch, moe_kernels
from moe_kernels import reference
torch.manual_seed(0)
T, H, I, E, K = 4, 32, 32, 4, 2
x = torch.randn(T, H)
w1 = torch.randn(E, 2 * I, H) / H ** 0.5
w2 = torch.randn(E, H, I) / I ** 0.5
weights, ids = torch.randn(T, E).softmax(-1).topk(K)
out = moe_kernels.fused_experts(x, w1, w2, weights, ids.to(torch.int32))
torch.testing.assert_close(out, reference.fused_experts(x, w1, w2, weights, ids.to(torch.int32)), atol=1e-4, rtol=1e-4)
print("smoke ok", moe_kernels.__name__, moe_kernels.isa())
"""


def _records(arch: str) -> list[RunRecord]:
    fields = {f.name for f in dataclasses.fields(RunRecord)}
    return [RunRecord(**{k: v for k, v in json.loads(p.read_text()).items() if k in fields})
            for p in sorted((REPO / "reports" / arch).glob("*/run.json"))]


@pytest.fixture(scope="module")
def tested_release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    root = tmp_path_factory.mktemp("real")
    wheelhouse, reports = root / "wheelhouse", root / "reports"
    wheelhouse.mkdir()
    manifest = publish.load_manifest(REPO / "reports")
    wheels = {}
    for arch, target in TARGETS.items():
        built = builds.find_wheel(REPO / "wheelhouse", arch)  # says how to build it when missing
        wheels[arch] = Path(shutil.copy2(built, wheelhouse))
        digest = publish.sha256(built)
        if digest in manifest.get("wheels", {}):
            reports.mkdir(exist_ok=True)
            entry = {"wheels": {digest: manifest["wheels"][digest]}}
            (reports / f"manifest-{arch}.json").write_text(json.dumps(entry))
        else:  # the records the last test session of the arch left (it tests wheelhouse/'s wheel)
            publish.record_tested(target, built, _records(arch), reports)
    # the sdist of the same version as the wheels (whatever the tree's git state)
    version = wheels["x86_64"].name.split("-")[1]
    os.environ.setdefault("SETUPTOOLS_SCM_PRETEND_VERSION_FOR_MOE_KERNELS", version)
    sdist = publish.build_sdist(sys.executable, wheelhouse)
    return Release(wheelhouse, reports, wheels, sdist)


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory, tested_release: Release):
    server = start_index(tmp_path_factory.mktemp("index"))
    try:
        result = run_publish(tested_release, uploader_env(server), timeout=900)
        assert result.returncode == 0, result.stdout + result.stderr
        yield server
    finally:
        server.stop()


def _test_image(target: Target) -> str:
    spec = images.image_specs(target, images.DOCKER_DIR, host.ca_bundle())["test"]
    if not images.image_exists(spec.tag):
        images.ensure_images(target, REPO / "build" / "harness" / "images", console.StepLog())
    return spec.tag


@pytest.mark.parametrize("arch", list(TARGETS))
def test_install_from_the_index_and_run_the_op(arch: str, published: Index, tested_release: Release) -> None:
    target = TARGETS[arch]
    version = tested_release.wheels[arch].name.split("-")[1]
    image = _test_image(target)
    env = [f"--env=QEMU_CPU={target.cpu_models[-1].name}"] if target.runner == "qemu" else []
    name = containers.container_name("publish-smoke", arch)
    script = (
        # the image's torch stays (--no-deps); pip check then proves the wheel's torch pin fits it
        f"pip install --no-deps --no-cache-dir --index-url {published.simple} 'moe-kernels=={version}' "
        f"&& pip check && python -c \"$0\""
    )
    try:
        result = subprocess.run(
            ["docker", "run", "--rm", f"--name={name}", *containers.label_args(),
             f"--platform={target.platform}", "--network=host", "--env=PIP_FIND_LINKS=", *env,
             image, "bash", "-c", script, SMOKE],
            capture_output=True, text=True, timeout=1800,
        )
    finally:
        containers.remove(name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Successfully installed moe-kernels-{version}" in result.stdout
    assert "smoke ok moe_kernels" in result.stdout
