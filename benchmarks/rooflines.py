"""The machine's limits, measured: torch.matmul's rate (the compute roofline) and a streaming read (the memory one).

The memory roofline is a contender like the others, timed in the same loop: a
multi-threaded streaming read of as many bytes as the routing's active experts'
weights take in the method's dtype.
"""

from __future__ import annotations

import math
import mmap
import time
from collections.abc import Callable

import torch

from benchmarks.workload import MoeShape, expert_bytes, weight_bytes

ROOFLINE_GEMM = 2048  # the compute roofline's square GEMM size
PROBE_GEMM = 512  # and its probe's, for a dtype on a slow path
ROOFLINE_CALL_S = 2.0
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def matmul_gflops(dtype: torch.dtype, threads: int, repeats: int = 5) -> float:
    """torch.matmul GFLOP/s on a square GEMM (best of a few; a ceiling, not a typical figure).

    ROOFLINE_GEMM wide, unless a first call of a PROBE_GEMM-wide one says that
    would take over ROOFLINE_CALL_S seconds a call (a slow path): then the probe's size."""
    torch.set_num_threads(threads)

    def best_of(size: int, calls: int) -> float:
        a = torch.randn(size, size).to(dtype)
        b = torch.randn(size, size).to(dtype)
        best = math.inf
        for _ in range(calls):
            start = time.perf_counter()
            torch.matmul(a, b)
            best = min(best, time.perf_counter() - start)
        return 2 * size**3 / best / 1e9

    probe = best_of(min(PROBE_GEMM, ROOFLINE_GEMM), 2)
    if 2 * ROOFLINE_GEMM**3 / (probe * 1e9) > ROOFLINE_CALL_S:
        return probe
    best_of(ROOFLINE_GEMM, 1)  # warm-up
    return best_of(ROOFLINE_GEMM, repeats)


def compute_rooflines(threads_list: list[int]) -> tuple[dict[int, dict[str, float]], str]:
    """matmul GFLOP/s per thread count and dtype, and the dtype pure torch computes in: the faster at one thread."""
    rates = {threads: {name: matmul_gflops(dtype, threads) for name, dtype in TORCH_DTYPES.items()}
             for threads in threads_list}
    first = rates[min(threads_list)]
    return rates, max(first, key=first.get)


class StreamPool:
    """A float32 buffer read with sum(): a multi-threaded streaming read of any byte count.

    Each read starts where the last one ended (from the start again where the rest is too short), so
    the pool, as large as all the experts' weights, meets the cache as those do: reading the same bytes
    every call found many of them in the last level cache, where the active experts' came from memory."""

    def __init__(self, max_bytes: int) -> None:
        # On transparent huge pages where the system gives them, as convert_weight_packed's weights are:
        # the read's TLB misses are then the weights' too.
        self.region = mmap.mmap(-1, max(max_bytes // 4, 1024) * 4)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            self.region.madvise(mmap.MADV_HUGEPAGE)
        self.buffer = torch.frombuffer(self.region, dtype=torch.float32)
        self.buffer.zero_()  # written: pages never written would all read the one zero page
        self.start = 0

    def window(self, nbytes: int) -> slice:
        """The floats the next read of nbytes takes."""
        count = min(max(nbytes // 4, 1), self.buffer.numel())
        if self.start + count > self.buffer.numel():
            self.start = 0
        window = slice(self.start, self.start + count)
        self.start += count
        return window

    def read(self, nbytes: int) -> None:
        self.buffer[self.window(nbytes)].sum()


def memory_read(pool: StreamPool, shape: MoeShape, method: str, active: list[int]) -> Callable[[int], object]:
    """The streaming read of routing r's active experts' weights in the method's dtype."""
    return lambda r: pool.read(active[r] * expert_bytes(shape, method))


def read_as(shape: MoeShape, methods: list[str]) -> dict[str, str]:
    """Each method's streaming read: the first method of `methods` with its byte width (one read per width),
    ordered by width."""
    first: dict[float, str] = {}
    for method in methods:
        first.setdefault(weight_bytes(shape, method), method)
    by_width = sorted(methods, key=lambda method: weight_bytes(shape, method))
    return {method: first[weight_bytes(shape, method)] for method in by_width}
