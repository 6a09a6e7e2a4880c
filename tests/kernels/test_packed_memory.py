"""Where convert_weight_packed's tensors live: every call streams them, so on
transparent huge pages wherever the system keeps the advice for them."""

from __future__ import annotations

import ctypes
import mmap

import torch

import moe_xarch
from moe_xarch.testing import HUGE_PAGE, vm_flags, whole_huge_page


def advice_is_kept() -> bool:
    """Whether madvise(MADV_HUGEPAGE) marks a mapping here ("hg"): a Linux kernel with transparent
    huge pages keeps it; an emulator of another architecture's system calls may drop it."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    region = mmap.mmap(-1, 2 * HUGE_PAGE)
    region.madvise(mmap.MADV_HUGEPAGE)
    buffer = ctypes.c_char.from_buffer(region)
    try:
        return "hg" in vm_flags(ctypes.addressof(buffer))
    finally:
        del buffer
        region.close()


def test_packed_weights_are_advised_onto_huge_pages() -> None:
    weight = torch.randn(2, 1024, 2048).to(torch.bfloat16)  # 8 MiB packed: at least two whole huge pages
    packed = moe_xarch.convert_weight_packed(weight, moe_xarch.MoeCompMethod.UNQUANT)
    assert ("hg" in vm_flags(whole_huge_page(packed))) == advice_is_kept()
