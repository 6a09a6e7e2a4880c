"""moe-xarch: fused Mixture-of-Experts CPU kernels for PyTorch.

Importing the package registers torch.ops.moe_xarch.*; `fused_experts` is the
typed entry point and `reference.fused_experts` the pure-torch oracle.
"""

from __future__ import annotations

from . import _library

_library.load()

from .ops import (  # noqa: E402  (the ops exist only once the library is loaded)
    KernelUse,
    MoeCompMethod,
    convert_weight_packed,
    fused_experts,
    isa,
    isa_levels,
    kernel_use,
    supported_isas,
)
from .schemas import SCHEMAS  # noqa: E402

__all__ = [
    "SCHEMAS",
    "KernelUse",
    "MoeCompMethod",
    "convert_weight_packed",
    "fused_experts",
    "isa",
    "isa_levels",
    "kernel_use",
    "supported_isas",
]
