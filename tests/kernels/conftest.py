"""Shared setup of the kernel suite.

The suite runs unchanged on every architecture and ISA level: natively once per
MOE_KERNELS_ISA level, and on aarch64 under QEMU, so shapes stay tiny.
"""

import torch

# pytest-xdist runs one worker per core; ATen threads on top of that only contend
# on these tiny shapes. test_fused_experts.py::test_parallel_* turns threads back
# on where the kernel's work splitting is under test.
torch.set_num_threads(1)
