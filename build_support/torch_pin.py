"""Build-time metadata: pin the wheel to the torch release it is built against.

The extension links libtorch's C++ API, whose ABI changes with every release,
so a wheel built against torch X.Y.Z requires torch==X.Y.*.
"""

from __future__ import annotations

from typing import Any


def torch_requirement() -> str:
    try:
        import torch
    except ImportError as exc:
        raise RuntimeError(
            "moe-kernels builds against the installed torch, but torch cannot be "
            "imported. Install torch first, then: pip install --no-build-isolation ."
        ) from exc
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return f"torch=={major}.{minor}.*"


class Provider:
    """scikit-build-core dynamic-metadata provider for the `dependencies` field."""

    @staticmethod
    def dynamic_metadata(settings: dict[str, Any], project: dict[str, Any]) -> dict[str, Any]:
        return {"dependencies": [torch_requirement()]}

    @staticmethod
    def dynamic_wheel(settings: dict[str, Any]) -> dict[str, bool]:
        # An sdist does not know which torch its wheel will be built against.
        return {"dependencies": True}
