from __future__ import annotations

import pytest

from harness.common.errors import HarnessError
from harness.setup import tools


def test_host_tools_pin_the_cross_backend_as_the_build_image_does(tmp_path):
    (tmp_path / "requirements-build.txt").write_text(
        "auditwheel==6.8.2\ncmake==4.4.5  # the compile\nninja==1.13.2\nscikit-build-core==1.1.2\n"
    )
    assert tools.host_tool_requirements(tmp_path) == [
        tools.CIBUILDWHEEL, "cmake==4.4.5", "ninja==1.13.2", "scikit-build-core==1.1.2"
    ]


def test_the_repositorys_backend_pins_are_the_build_images(repo_root):
    pinned = (repo_root / "docker" / "requirements-build.txt").read_text().split()
    backend = tools.backend_requirements()
    assert {line.split("==")[0] for line in backend} == set(tools.HOST_BACKEND)
    assert set(backend) <= set(pinned)


def test_a_host_tool_is_pinned_once_in_the_hosts_requirements(tmp_path):
    pins = tmp_path / "requirements-host.txt"
    pins.write_text("# why\ngcovr==8.8  # coverage\nzizmor==1.32.0\nzizmor==1.33.0\n")
    assert tools.pinned("gcovr", pins) == "gcovr==8.8"
    with pytest.raises(HarnessError, match="2 pins of zizmor"):
        tools.pinned("zizmor", pins)
    with pytest.raises(HarnessError, match="0 pins of gcov,"):
        tools.pinned("gcov", pins)
