from __future__ import annotations

from harness import tools


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
