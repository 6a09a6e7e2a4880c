"""The sdist carries csrc/ and all a build needs: a native build from it works."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

from harness.publishing import publish
from tests.publish.support import REPO
from tests.publish.test_install_from_index import SMOKE


def test_sdist_contents_and_a_native_wheel_built_from_it(tmp_path: Path) -> None:
    # as CI's sdist job makes it (publish checks its contents)
    subprocess.run([sys.executable, "-m", "harness.publishing.publish", "--sdist-only", "--wheelhouse", str(tmp_path / "dist")],
                   cwd=REPO, check=True)
    (sdist,) = (tmp_path / "dist").glob("*.tar.gz")
    assert publish.sdist_problems(sdist) == []
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
    assert any("/csrc/arch/x86/" in n for n in names) and any("/csrc/arch/arm/" in n for n in names)

    # the build runs in a directory of its own: nothing of the source tree is seen
    out = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(out), str(sdist)], check=True, cwd=tmp_path)
    (wheel,) = out.glob("moe_xarch-*.whl")
    assert publish.abi_problems(wheel) == []  # the stable ABI only, nothing newer than the torch it requires
    target = tmp_path / "installed"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)],
                   check=True)
    result = subprocess.run([sys.executable, "-c", SMOKE], cwd=tmp_path, capture_output=True, text=True,
                            env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert "smoke ok" in result.stdout
