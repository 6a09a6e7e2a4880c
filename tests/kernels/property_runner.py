"""Runs the calls of test_properties.py in a process of its own, so that a call
that crashes or hangs takes down this process and not the test session.

Started as a script; reads requests from stdin and writes answers to the
stdout it started with (sys.stdout goes to stderr, so that nothing else can
corrupt the stream). A message is an 8-byte little-endian length, then a
torch.save'd dict of plain values and tensors.

A request is ``{"call": "op" | "wrapper" | "convert", "kwargs": {...},
"prepare": [[step, argument, params], ...]}``: the steps make, here, the inputs
that only this library can make (packed weights and their headers) or that
must keep their address (views at a byte offset). The answer says
``{"ok": True, "result": tensor}`` or ``{"ok": False, "stage": op name,
"type": [exception class names, most derived first], "message": str}``, plus
``"changed"``: the tensor arguments whose bytes the call modified, and
``"result_is_hidden_states"`` (None where memory cannot tell).
"""

from __future__ import annotations

import faulthandler
import io
import os
import struct
import sys
from typing import Any, BinaryIO

import torch

import moe_xarch
from moe_xarch.testing import schema_args

# The packed header's fields (csrc/core/packing.h, PackedHeader), in order.
HEADER_FIELDS = ("magic", "version", "arch", "dtype", "layout", "rows", "cols", "ld", "sums_offset")
HEADER = struct.Struct("<8sIIiiqqqq")
HEADER_BYTES = 64  # kPackedHeaderBytes: the header's room in each expert's block
PACK_ALIGN = 64  # kPackAlign
INT64_WRAP = 2**64

OPS = {
    "op": torch.ops.moe_xarch.fused_experts_cpu.default,
    "convert": torch.ops.moe_xarch.convert_weight_packed.default,
}


def read_message(stream: BinaryIO) -> Any:
    """The next message of ``stream``, or None at its end."""
    head = stream.read(8)
    if len(head) < 8:
        return None
    (length,) = struct.unpack("<Q", head)
    return torch.load(io.BytesIO(stream.read(length)), weights_only=True)


def encode_message(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return struct.pack("<Q", buffer.tell()) + buffer.getvalue()


def _int64(value: int) -> int:
    """``value`` wrapped as the library's int64 arithmetic wraps it."""
    return (value + 2**63) % 2**64 - 2**63


def packed_nbytes(header: dict[str, Any], elem: int) -> int:
    """One expert's block size as the library computes it for ``header``, with
    its int64 wrap-around (so a forged header can claim a wrapped size)."""
    rows, ld, sums = header["rows"], header["ld"], header["sums_offset"]
    end = _int64(sums + _int64(rows * 4)) if sums else _int64(HEADER_BYTES + _int64(rows * ld * elem))
    return _int64(_int64(end + PACK_ALIGN - 1) // PACK_ALIGN * PACK_ALIGN)


def _at_offset(t: torch.Tensor, offset: int) -> torch.Tensor:
    """A copy of contiguous ``t`` that starts ``offset`` bytes into a larger byte buffer."""
    nbytes = t.numel() * t.element_size()
    buffer = torch.zeros(offset + nbytes, dtype=torch.uint8)
    view = buffer[offset:].view(t.dtype).view(t.shape)
    view.copy_(t)
    return view


def _flip(packed: torch.Tensor, expert: int | None, byte: int, bit: int) -> torch.Tensor:
    """One bit of an expert's block flipped, or of every expert's (None)."""
    flipped = packed.clone()
    flipped[slice(None) if expert is None else expert, byte] ^= 1 << bit
    return flipped


def _forge(packed: torch.Tensor, elem: int, fields: dict[str, Any]) -> torch.Tensor:
    """Every expert's header with ``fields`` replaced, each block cut or zero-padded
    to the size the forged header claims where that is a small one (64 bytes,
    the header alone, for a claim that wraps around)."""
    header = dict(zip(HEADER_FIELDS, HEADER.unpack_from(packed[0].numpy().tobytes())))
    header.update(fields)
    claimed = packed_nbytes(header, elem)
    nbytes = claimed if HEADER_BYTES <= claimed <= 4 * packed.shape[1] else packed.shape[1]
    forged = torch.zeros(packed.shape[0], nbytes, dtype=torch.uint8)
    keep = min(forged.shape[1], packed.shape[1])
    forged[:, :keep] = packed[:, :keep]
    forged[:, : HEADER.size] = torch.frombuffer(bytearray(HEADER.pack(*header.values())), dtype=torch.uint8)
    return forged


def prepare(kwargs: dict[str, Any], steps: list[list[Any]]) -> None:
    for step, name, params in steps:
        if step == "pack":
            kwargs[name] = moe_xarch.convert_weight_packed(kwargs[name], params["moe_comp_method"])
        elif step == "flip":
            kwargs[name] = _flip(kwargs[name], params["expert"], params["byte"], params["bit"])
        elif step == "forge":
            kwargs[name] = _forge(kwargs[name], params["elem"], params["fields"])
        elif step == "offset":
            kwargs[name] = _at_offset(kwargs[name], params["bytes"])
        else:
            raise ValueError(f"unknown prepare step {step!r}")


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8).clone()


def snapshot(kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The bytes of every tensor argument that has them (not meta)."""
    return {
        name: _bytes(value)
        for name, value in kwargs.items()
        if isinstance(value, torch.Tensor) and value.device.type != "meta"
    }


def run(request: dict[str, Any]) -> dict[str, Any]:
    kwargs = request["kwargs"]
    try:
        prepare(kwargs, request["prepare"])
    except Exception as error:  # noqa: BLE001  (reported, and judged by the test)
        return _failure("convert_weight_packed", error, changed=[])
    before = snapshot(kwargs)
    try:
        if request["call"] == "wrapper":
            result = moe_xarch.fused_experts(**kwargs)
        else:
            op = OPS[request["call"]]
            result = op(*schema_args(op, kwargs))
        answer: dict[str, Any] = {"ok": True, "result": result}
    except Exception as error:  # noqa: BLE001
        stage = "convert_weight_packed" if request["call"] == "convert" else "fused_experts_cpu"
        answer = _failure(stage, error)
        result = None
    after = snapshot(kwargs)
    answer["changed"] = [name for name in before if not torch.equal(before[name], after[name])]
    answer["result_is_hidden_states"] = _same_memory(result, kwargs.get("hidden_states"))
    return answer


def _same_memory(a: Any, b: Any) -> bool | None:
    """Whether two tensors are one; None where memory cannot tell (empty or meta)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.device != b.device:
        return False
    if a.device.type == "meta" or a.numel() == 0 or b.numel() == 0:
        return None
    return a.data_ptr() == b.data_ptr()


def _failure(stage: str, error: BaseException, **extra: Any) -> dict[str, Any]:
    return {
        "ok": False,
        "stage": stage,
        "type": [cls.__name__ for cls in type(error).__mro__],
        "message": str(error),
        **extra,
    }


def main() -> None:
    faulthandler.enable()
    torch.set_num_threads(1)  # as in the suite (conftest.py)
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    answers.write(encode_message({"ready": moe_xarch.isa()}))
    answers.flush()
    while (request := read_message(sys.stdin.buffer)) is not None:
        answers.write(encode_message(run(request)))
        answers.flush()


if __name__ == "__main__":
    main()
