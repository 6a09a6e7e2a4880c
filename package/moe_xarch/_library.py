"""Loads the compiled op library that registers torch.ops.moe_xarch."""

from __future__ import annotations

from pathlib import Path

import torch

LIBRARY_PATH = Path(__file__).with_name("_ops.so")


def load() -> None:
    if not LIBRARY_PATH.exists():
        raise ImportError(
            f"moe_xarch: the compiled op library {LIBRARY_PATH.name} is missing next to "
            f"{Path(__file__).name}; install the package (pip install --no-build-isolation .) "
            "instead of importing it from the source tree"
        )
    # A plain TORCH_LIBRARY library: no Python C-API, so one build serves every CPython.
    torch.ops.load_library(str(LIBRARY_PATH))
