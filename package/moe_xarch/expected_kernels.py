"""Which level's code must run each kernel kind, for every level of every architecture.

Declared here once, from each level's design, and never derived from the build
under test: a level whose KernelSet quietly hands out another level's kernel
reports its own name in ``isa()`` and computes the right numbers, and only this
table says it should not have. ``moe_xarch.kernel_use()`` reports what ran.

A kind missing from a level's table is one that level never runs. A fallback is
a lower level's kernel that the level's own kernel hands some calls to by design
(with the condition); everything else of that kind must be the level's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["ARCHITECTURE_LEVELS", "EXPECTED_KERNELS", "ROW_KERNELS", "TILE_LAYOUTS", "Expected"]

# The kernels of the driver's row loops (core/row_kernels.h), built by the levels that export their own.
ROW_KERNELS = ("silu_and_mul", "swiglu", "quantize_row_s8", "add_weighted")


@dataclass(frozen=True)
class Expected:
    """``level``'s code must do this kind's work, but for the ``fallbacks``: {lower level: when}."""

    level: str
    fallbacks: Mapping[str, str] = field(default_factory=dict)


# The levels that read packed weights in a tile layout: for each, the layout's name as the
# library's refusals give it, and the weight dtypes it packs so (where the row count allows).
_TILES16 = {"bf16": "the tile layout of the avx512_bf16 and amx levels",
            "int8": "the tile layout of the avx512_bf16 and amx levels",
            "fp8": "the line layout of the avx512_bf16 and amx levels"}
TILE_LAYOUTS: Mapping[str, Mapping[str, str]] = {
    "avx512_bf16": _TILES16,
    "amx": _TILES16,
    "i8mm": {"bf16": "the row-pair tile layout of the i8mm level",
             "int8": "the row-pair tile layout of the i8mm level"},
}


def _level(level: str, kinds: tuple[str, ...]) -> dict[str, Expected]:
    return {kind: Expected(level) for kind in kinds}


_PACK_ROWS = {"pack_rows": Expected("core")}
_PACK_BOTH = {"pack_rows": Expected("core"), "pack_tiles": Expected("core")}
# fp8 weights widened for the GEMM: rows for a bf16 GEMM, or for fp32 compute.
_FP8_ROWS = ("fp8_to_bf16", "fp8_to_f32")
_AMX_FEW_ROWS = "fewer than 4 rows of a"
# The 4-bit kernels: INT4_W4A8's GEMM and MXFP4 widened into rows (for a bf16 GEMM, or fp32 compute).
_MXFP4_ROWS = ("mxfp4_to_bf16", "mxfp4_to_f32")
_FOUR_BIT = ("gemm_w4a8", *_MXFP4_ROWS)
# MXFP4 times few rows of bf16 activations, widened in registers (every level above generic).
_MXFP4_FUSED = ("gemm_bf16_mxfp4",)

_GENERIC = {
    **_level("generic", ("gemm_f32", "gemm_bf16", "gemm_s8", *_FP8_ROWS, *_FOUR_BIT, *ROW_KERNELS)),
    **_PACK_ROWS,
}

# Each architecture's levels, lowest first, as isa() names them.
_X86_64: Mapping[str, Mapping[str, Expected]] = {
    "generic": _GENERIC,
    "avx2": {
        **_level("avx2", ("gemm_f32", "gemm_bf16", "gemm_s8", "gemm_bf16_fp8", *_FP8_ROWS, *_FOUR_BIT,
                          *_MXFP4_FUSED, *ROW_KERNELS)),
        **_PACK_ROWS,
    },
    # No fused fp8 GEMM: fp8 rows are widened (fp8_to_bf16) for gemm_bf16.
    "avx512": {
        **_level("avx512", ("gemm_f32", "gemm_bf16", "gemm_s8", *_FP8_ROWS, *_FOUR_BIT, *_MXFP4_FUSED,
                            *ROW_KERNELS)),
        **_PACK_ROWS,
    },
    # avx512 with its own bf16 and fp8 GEMMs, fp8 to bf16 widening and tile-layout GEMMs.
    "avx512_bf16": {
        **_level("avx512", ("gemm_f32", "gemm_s8", "fp8_to_f32")),
        **_level("avx512_bf16", ("gemm_bf16", "gemm_bf16_fp8", "fp8_to_bf16", "gemm_bf16_tiles",
                                 "gemm_s8_tiles", "gemm_bf16_fp8_tiles", *ROW_KERNELS)),
        # The 4-bit kernels are avx512's (MXFP4 widened exactly, then this level's vdpbf16ps GEMM)
        # but for the fused MXFP4 GEMM, on vdpbf16ps.
        **_level("avx512", _FOUR_BIT),
        **_level("avx512_bf16", _MXFP4_FUSED),
        **_PACK_BOTH,
    },
    # avx512_bf16 with tile GEMMs from 4 rows of a; fp8 and MXFP4 are never widened into rows for
    # bf16: they are widened onto tiles in the GEMM, as INT4 is. Few rows of bf16 and MXFP4 go to
    # avx512's FMAs, not vdpbf16ps (gemm_amx.cpp says why).
    "amx": {
        **_level("avx512", ("gemm_f32", "fp8_to_f32")),
        "gemm_bf16": Expected("amx", {"avx512": f"{_AMX_FEW_ROWS}, or K not a multiple of 32"}),
        "gemm_s8": Expected("amx", {"avx512": f"{_AMX_FEW_ROWS}, or K not a multiple of 64"}),
        "gemm_bf16_fp8": Expected("amx", {"avx512_bf16": f"{_AMX_FEW_ROWS}, or K or block_k not a multiple of 32"}),
        "gemm_bf16_tiles": Expected("amx", {"avx512_bf16": _AMX_FEW_ROWS}),
        "gemm_s8_tiles": Expected("amx", {"avx512_bf16": _AMX_FEW_ROWS}),
        "gemm_bf16_fp8_tiles": Expected("amx", {"avx512_bf16": f"{_AMX_FEW_ROWS}, or block_k not a multiple of 32"}),
        "gemm_w4a8": Expected("amx", {"avx512": _AMX_FEW_ROWS}),
        "gemm_bf16_mxfp4": Expected("amx", {"avx512": _AMX_FEW_ROWS}),
        **_level("avx512_bf16", ROW_KERNELS),
        **_level("avx512", ("mxfp4_to_f32",)),
        **_PACK_BOTH,
    },
}
# The row loops and fp8 widening are the generic level's at every level, the MXFP4 widening (a
# table lookup) neon's.
_AARCH64: Mapping[str, Mapping[str, Expected]] = {
    "generic": _GENERIC,
    "neon": {
        **_level("neon", ("gemm_f32", "gemm_bf16", "gemm_s8", *_FOUR_BIT, *_MXFP4_FUSED)),
        **_level("generic", (*_FP8_ROWS, *ROW_KERNELS)),
        **_PACK_ROWS,
    },
    "dotprod": {
        **_level("neon", ("gemm_f32", "gemm_bf16", *_MXFP4_ROWS, *_MXFP4_FUSED)),
        "gemm_s8": Expected("dotprod", {"neon": "K below 16"}),
        "gemm_w4a8": Expected("dotprod"),
        **_level("generic", (*_FP8_ROWS, *ROW_KERNELS)),
        **_PACK_ROWS,
    },
    # i8mm with its own tile layout for packed bf16 and int8 (fp8 packs as rows).
    "i8mm": {
        **_level("neon", ("gemm_f32", *_MXFP4_ROWS)),
        "gemm_bf16": Expected("i8mm", {"neon": "K below 8"}),
        "gemm_s8": Expected("i8mm", {"dotprod": "one row of a (decode)", "neon": "K below 16"}),
        "gemm_w4a8": Expected("i8mm", {"dotprod": "one row of a (decode)"}),
        **_level("i8mm", ("gemm_bf16_tiles", "gemm_s8_tiles", *_MXFP4_FUSED)),
        **_level("generic", (*_FP8_ROWS, *ROW_KERNELS)),
        **_PACK_BOTH,
    },
}

# The ladder each architecture's library must report (moe_xarch.isa_levels()): this table's
# order, never read from the build.
ARCHITECTURE_LEVELS: Mapping[str, tuple[str, ...]] = {"x86_64": tuple(_X86_64), "aarch64": tuple(_AARCH64)}
EXPECTED_KERNELS: Mapping[str, Mapping[str, Expected]] = {**_X86_64, **_AARCH64}
