"""The publish gate refuses a wheel whose library could not load on every torch it requires."""

from __future__ import annotations

from pathlib import Path

from harness.publishing import publish
from tests.publish.support import make_wheel, shared_library


def _wheel(tmp_path: Path, *torch_symbols: str) -> Path:
    return make_wheel(tmp_path / "dist", "x86_64", library=shared_library("x86_64", *torch_symbols))


def test_a_stable_abi_library_passes(tmp_path: Path) -> None:
    assert publish.abi_problems(_wheel(tmp_path, "torch_parallel_for")) == []


def test_a_library_on_libtorchs_cpp_abi_is_refused(tmp_path: Path) -> None:
    (problem,) = publish.abi_problems(_wheel(tmp_path, "_ZN3c105ErrorD1Ev"))  # c10::Error::~Error()
    assert "moe_xarch/_ops.so uses libtorch's C++ ABI (c10::Error::~Error()" in problem


def test_a_library_that_needs_a_newer_torch_than_the_wheel_requires_is_refused(tmp_path: Path) -> None:
    # torch_dtype_float4_e2m1fn_x2 came with torch 2.11's stable ABI
    (problem,) = publish.abi_problems(_wheel(tmp_path, "torch_parallel_for", "torch_dtype_float4_e2m1fn_x2"))
    assert problem.endswith("needs torch 2.11.0, but the wheel requires torch>=2.10")


def test_a_wheel_without_a_torch_library_is_refused(tmp_path: Path) -> None:
    assert publish.abi_problems(_wheel(tmp_path, "free")) == [
        "torch-abi-audit found no library that uses torch in it"]
