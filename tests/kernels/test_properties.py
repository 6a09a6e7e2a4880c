"""Generated calls of fused_experts_cpu and convert_weight_packed, valid and
invalid, each with exactly one acceptable outcome (the spec's promise):

- a clear error (RuntimeError, ValueError or TypeError) whose message names an
  argument of the op, with every input unchanged (inplace=True included), or
- a result that matches the reference within the spec's tolerance.

A valid call must give the result, an invalid one the error; a few calls
(zero-size dimensions, views at odd byte offsets, bit-flipped headers, sizes
beyond memory) may give either. Every call runs in one long-lived child
process (property_runner.py): a call that kills it with a signal or outlasts
MOE_XARCH_PROPERTY_TIMEOUT seconds fails its case, naming the signal, and the
child is restarted. Examples are derandomized and bounded (QEMU runs this too);
hypothesis does not shrink, since each failing replay may cost a restart.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import json
import math
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

import moe_xarch
from moe_xarch import MoeCompMethod, reference
from moe_xarch.testing import assert_matches_reference, make_moe_problem

RUNNER_PATH = Path(__file__).with_name("property_runner.py")
_spec = importlib.util.spec_from_file_location("property_runner", RUNNER_PATH)
runner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runner)

UNQUANT, INT8, FP8 = MoeCompMethod.UNQUANT, MoeCompMethod.INT8_W8A8, MoeCompMethod.FP8_W8A16
INT4, MXFP4 = MoeCompMethod.INT4_W4A8, MoeCompMethod.MXFP4
FOUR_BIT = (INT4, MXFP4)
SCALED = (INT8, FP8, *FOUR_BIT)
METHODS = (UNQUANT, *SCALED)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
CLEAR_ERRORS = ("RuntimeError", "ValueError", "TypeError")
CALL_TIMEOUT = float(os.environ.get("MOE_XARCH_PROPERTY_TIMEOUT", "60"))
START_TIMEOUT = 10 * CALL_TIMEOUT  # import torch alone takes ~9 s under QEMU


def _arguments(op_name: str) -> dict[str, str]:
    """An op's argument names and types, from the one schema file."""
    schema = torch._C.parse_schema(moe_xarch.SCHEMAS[op_name])
    return {a.name: str(a.type) for a in schema.arguments}


OP_ARGS = _arguments("fused_experts_cpu")
CONVERT_ARGS = _arguments("convert_weight_packed")
TENSOR_ARGS = tuple(name for name, type_ in OP_ARGS.items() if type_.endswith("Tensor") or type_ == "Optional[Tensor]")
STAGE_ARGS = {"fused_experts_cpu": OP_ARGS, "convert_weight_packed": CONVERT_ARGS}

SETTINGS = dict(derandomize=True, deadline=None, database=None, phases=(Phase.explicit, Phase.generate),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Cases of this process for the run's summary: "valid" ones must give a result,
# "invalid" ones may or must give an error; "crashes" killed or hung the child.
COUNTS = {"valid": 0, "invalid": 0, "crashes": 0}


# --- the child process ------------------------------------------------------------------

class Sandbox:
    """One property_runner.py process; started on first use and after a death."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.stderr = tempfile.TemporaryFile()

    def _start(self) -> None:
        self.stderr.seek(0)
        self.stderr.truncate()
        self.process = subprocess.Popen([sys.executable, str(RUNNER_PATH)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.stderr)
        ready = self._read(START_TIMEOUT)
        if not isinstance(ready, dict) or "ready" not in ready:
            raise RuntimeError(f"property_runner.py did not start: {self._end(ready)}")

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        """The runner's answer, or ``{"crash": what happened}``."""
        if self.process is None:
            self._start()
        try:
            self.process.stdin.write(runner.encode_message(request))
            self.process.stdin.flush()
        except BrokenPipeError:
            return {"crash": self._end(None)}
        answer = self._read(CALL_TIMEOUT)
        return answer if isinstance(answer, dict) else {"crash": self._end(answer)}

    def _read(self, timeout: float) -> dict[str, Any] | str:
        """The next message, "eof" or "timeout"."""
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout
        data = b""
        need = 8
        while len(data) < need:
            ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
            if not ready:
                return "timeout"
            chunk = os.read(fd, max(need - len(data), 1 << 16))
            if not chunk:
                return "eof"
            data += chunk
            if need == 8 and len(data) >= 8:
                need = 8 + int.from_bytes(data[:8], "little")
        return runner.read_message(io.BytesIO(data))

    def _end(self, how: str | None) -> str:
        """Stops the child (it died or hangs) and says how it ended."""
        process, self.process = self.process, None
        if how == "timeout":
            process.kill()
        returncode = process.wait()
        for pipe in (process.stdin, process.stdout):
            try:
                pipe.close()
            except BrokenPipeError:
                pass
        self.stderr.seek(0)
        tail = self.stderr.read().decode(errors="replace")[-1500:]
        if how == "timeout":
            what = f"timed out after {CALL_TIMEOUT:g} s"
        elif returncode < 0:
            what = f"killed the child by {signal.Signals(-returncode).name}"
        else:
            what = f"ended the child with exit status {returncode}"
        return f"{what}; its stderr ends:\n{tail}"

    def close(self) -> None:
        if self.process is not None:
            self.process.stdin.close()
            self.process.wait(timeout=START_TIMEOUT)
            self.process.stdout.close()
        self.stderr.close()


@pytest.fixture(scope="session")
def sandbox():
    box = Sandbox()
    yield box
    box.close()
    report_dir = os.environ.get("MOE_XARCH_REPORT_DIR")
    if report_dir:
        Path(report_dir, f"property-cases-{os.getpid()}.json").write_text(json.dumps(COUNTS))


# --- cases ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Problem:
    """A call: its arguments by name (weights unpacked: ``prepare`` packs them in the child)."""

    kwargs: Mapping[str, Any]
    description: str
    call: str = "op"  # "op" | "wrapper" | "convert"
    prepare: tuple = ()  # the runner's steps
    # What the reference is given instead, where the call's form would not do
    # for it (packed weights, sizes it cannot hold): same math, other arguments.
    reference_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def method(self) -> int:
        return self.kwargs["moe_comp_method"]

    @property
    def dtype(self) -> torch.dtype:
        return self.kwargs["hidden_states"].dtype

    def dims(self) -> dict[str, int]:
        (M, K), (E, rows, _) = self.kwargs["hidden_states"].shape, self.kwargs["w1"].shape
        return {"M": M, "K": K, "N": rows // 2, "E": E, "topk": self.kwargs["topk_ids"].shape[1]}

    def with_(self, note: str, **overrides: Any) -> Problem:
        return dataclasses.replace(self, kwargs={**self.kwargs, **overrides},
                                   description=f"{self.description} | {note}")

    def packed(self, note: str = "packed", method: int | None = None) -> Problem:
        method = int(self.method if method is None else method)
        steps = tuple(("pack", name, {"moe_comp_method": method}) for name in ("w1", "w2"))
        return dataclasses.replace(self.with_(note, is_vnni=True), prepare=self.prepare + steps)

    def step(self, note: str, step: str, name: str, **params: Any) -> Problem:
        return dataclasses.replace(self, prepare=self.prepare + ((step, name, params),),
                                   description=f"{self.description} | {note}")

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # how hypothesis shows an example
        printer.text(self.description)

    def expected(self) -> torch.Tensor:
        kwargs = {**self.kwargs, "inplace": False, "is_vnni": False, **self.reference_overrides}
        return reference.fused_experts(**kwargs)

    def request(self) -> dict[str, Any]:
        return {"call": self.call, "kwargs": dict(self.kwargs), "prepare": [list(s) for s in self.prepare]}


def _names_pattern(names: tuple[str, ...]) -> str:
    return rf"\b({'|'.join(map(re.escape, names))})\b"


def run_case(sandbox: Sandbox, problem: Problem, expect: str, names: tuple[str, ...] = ()) -> None:
    """Runs ``problem`` in the child and asserts its one acceptable outcome.

    ``expect``: "result" (a valid call), "error" (an invalid one) or "either".
    ``names``: the arguments an error may name (default: any of the op's).
    """
    unknown = set(names) - set(OP_ARGS) - set(CONVERT_ARGS)
    assert not unknown, f"test bug: {sorted(unknown)} are not arguments of the ops"
    COUNTS["valid" if expect == "result" else "invalid"] += 1
    answer = sandbox.call(problem.request())
    if "crash" in answer:
        COUNTS["crashes"] += 1
        _fail(problem, f"the call {answer['crash']}")
    problem_text = _wrong_outcome(problem, expect, names, answer)
    if problem_text:
        _fail(problem, problem_text)


def _fail(problem: Problem, what: str) -> None:
    pytest.fail(f"case: {problem.description}\n{what}", pytrace=False)


def _wrong_outcome(problem: Problem, expect: str, names: tuple[str, ...], answer: dict[str, Any]) -> str | None:
    """What is wrong with the runner's answer, or None."""
    changed = answer["changed"]
    if not answer["ok"]:
        message = f"{answer['type'][0]}: {answer['message']}"
        stage_args = STAGE_ARGS[answer["stage"]]
        allowed = tuple(n for n in names if n in stage_args) or tuple(stage_args)
        if expect == "result":
            return f"a valid call was refused: {message}"
        if not set(answer["type"]) & set(CLEAR_ERRORS):
            return f"not a clear error: {message}"
        if not re.search(_names_pattern(allowed), answer["message"]):
            return f"the error names none of {list(allowed)}: {message}"
        if changed:
            return f"{changed} changed although the call failed ({message})"
        return None
    result = answer["result"]
    if expect == "error":
        return f"accepted (returned {_describe(result)}); expected an error naming one of {list(names)}"
    if problem.call == "convert":
        weight = problem.kwargs["weight"]
        if result.dtype != torch.uint8 or result.dim() != 2 or result.shape[0] != weight.shape[0]:
            return f"convert_weight_packed returned {_describe(result)} for a weight {_describe(weight)}"
        return None
    inplace = problem.kwargs.get("inplace") is True
    if not set(changed) <= ({"hidden_states"} if inplace else set()):
        return f"{changed} changed by a call with inplace={inplace}"
    same = answer["result_is_hidden_states"]
    if same is not None and same != inplace:
        return f"inplace={inplace} but the result is{'' if same else ' not'} hidden_states"
    expected = problem.expected()
    if result.device.type != "cpu" or result.dtype != problem.dtype or result.shape != expected.shape:
        return f"returned {_describe(result)}, expected {_describe(expected)}"
    try:
        assert_matches_reference(result, expected, problem.method, problem.dtype)
    except AssertionError as error:
        return f"the result does not match the reference: {error}"
    return None


def _describe(t: Any) -> str:
    if not isinstance(t, torch.Tensor):
        return repr(t)
    return f"{t.dtype} {list(t.shape)} on {t.device}"


# --- valid calls ------------------------------------------------------------------------

ALPHAS = (1.702, 1.0, 0.0, -0.5, 30.0)
LIMITS = (None, 0.25, 1.0, 7.0, math.inf)
BLOCK_SIZES = ((16, 32), (32, 16), (8, 8), (128, 128), (1, 3))
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@st.composite
def problems(draw: st.DrawFn, *, small: bool = False, methods: tuple[int, ...] = METHODS,
             bias: bool | None = None, ids_dtype: torch.dtype | None = None,
             block_sizes: tuple[tuple[int, int], ...] = BLOCK_SIZES, zero_points: bool | None = None) -> Problem:
    """A valid call. ``small``: unpacked weights, every dimension >= 2 and tiny
    (K <= 32, N <= 16, or the 4-bit methods' K <= 64, N = 32: the base of the other
    calls); ``bias``/``ids_dtype``/``zero_points`` (INT4_W4A8's): fixed instead of drawn."""
    method = draw(st.sampled_from(methods))
    dtype = draw(st.sampled_from(DTYPES))
    # The 4-bit methods reduce over K and N in groups of 32.
    four_bit = method in FOUR_BIT
    if small:
        M, E, topk = draw(st.integers(2, 4)), 3, 2
        K = draw(st.sampled_from((32, 64) if four_bit else (16, 32)))
        N = 32 if four_bit else draw(st.sampled_from((8, 16)))
    else:
        M = draw(st.integers(1, 9))
        if four_bit:
            K, N = 32 * draw(st.integers(1, 5)), 32 * draw(st.integers(1, 2))
        else:
            K = draw(st.one_of(st.sampled_from((32, 64)), st.integers(1, 80)))
            N = draw(st.one_of(st.sampled_from((16, 32)), st.integers(1, 40)))
        E = draw(st.integers(1, 6))
        topk = draw(st.integers(1, E))
    seed = draw(st.integers(0, 2**16))
    block_size = draw(st.sampled_from(block_sizes))
    if bias is None:
        bias_dtype = draw(st.sampled_from((None,) + FLOAT_DTYPES))
    else:
        bias_dtype = draw(st.sampled_from(FLOAT_DTYPES)) if bias else None
    ids_dtype = ids_dtype or draw(st.sampled_from((torch.int32, torch.int64)))
    group_size = 32
    if method == INT4:
        group_size = draw(st.sampled_from([g for g in range(32, min(K, N) + 1, 32) if K % g == N % g == 0]))
        if zero_points is None:
            zero_points = draw(st.booleans())
    made = make_moe_problem(M, K, N, E, topk, dtype, method, bias=bias_dtype is not None, seed=seed,
                            block_size=block_size, group_size=group_size, zero_points=zero_points is not False,
                            ids_dtype=ids_dtype, bias_dtype=bias_dtype)
    kwargs = dict(made.arguments, inplace=draw(st.booleans()), is_vnni=False)
    call = draw(st.sampled_from(("op", "wrapper")))
    notes = [f"{call}: {MoeCompMethod(method).name} {_name(dtype)} M={M} K={K} N={N} E={E} topk={topk} "
             f"seed={seed} ids={_name(ids_dtype)}"]
    if method == FP8:
        notes.append(f"block_size={list(block_size)}")
    if method == INT4:
        notes.append(f"group_size={group_size}" + ("" if zero_points else ", no zero points"))
    if bias_dtype is not None:
        drop = None if bias else draw(st.sampled_from((None, "w1_bias", "w2_bias")))
        if drop:
            kwargs[drop] = None
        notes.append(f"bias={_name(bias_dtype)}" + (f" without {drop}" if drop else ""))
    if draw(st.booleans()):
        kwargs["alpha"], kwargs["limit"] = draw(st.sampled_from(ALPHAS)), draw(st.sampled_from(LIMITS))
        notes.append(f"swiglu alpha={kwargs['alpha']} limit={kwargs['limit']}")
    if not small and draw(st.booleans()):
        # Any ids: repeated experts, and negatives other than -1 (unused slots too).
        negative = draw(st.sampled_from((-1, -2, -(2**31))))
        ids = torch.randint(-1, E, (M, topk), generator=torch.Generator().manual_seed(seed))
        kwargs["topk_ids"] = ids.masked_fill(ids < 0, negative).to(ids_dtype)
        notes.append(f"ids with repeats, unused={negative}")
    weights_dtype = draw(st.sampled_from(FLOAT_DTYPES))
    kwargs["topk_weights"] = kwargs["topk_weights"].to(weights_dtype)
    notes.append(f"topk_weights={_name(weights_dtype)}")
    if kwargs["inplace"]:
        notes.append("inplace")
    problem = Problem(kwargs, ", ".join(notes), call=call)
    return problem.packed() if not small and draw(st.booleans()) else problem


@given(problem=problems())
@settings(max_examples=40, **SETTINGS)
def test_valid_calls_match_the_reference(sandbox: Sandbox, problem: Problem) -> None:
    run_case(sandbox, problem, "result")


# --- invalid calls: one change of a valid call each -----------------------------------

@dataclasses.dataclass(frozen=True)
class Mutation:
    """A change of a small valid problem (of ``methods``, with biases if ``bias``),
    the outcome it must have, and the arguments an error may name."""

    name: str
    change: Callable[[Problem], Problem]
    names: tuple[str, ...]
    expect: str = "error"
    methods: tuple[int, ...] = METHODS
    bias: bool | None = None
    ids_dtype: torch.dtype | None = None
    zero_points: bool | None = None


def _set(name: str, make: Callable[[Problem], Any], note: str) -> Callable[[Problem], Problem]:
    return lambda p: p.with_(note, **{name: make(p)})


def _as_call(call: str, **overrides: Any) -> Callable[[Problem], Problem]:
    note = " ".join(f"{k}={v!r}" for k, v in overrides.items())
    return lambda p: dataclasses.replace(p.with_(f"{call}: {note}", **overrides), call=call)


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same values with dim 0 at twice its stride (not contiguous: dim 0 has >= 2 entries)."""
    buffer = torch.zeros((2 * t.shape[0],) + t.shape[1:], dtype=t.dtype)
    buffer[::2] = t
    return buffer[::2]


def _shorter(name: str, dim: int) -> Callable[[Problem], Problem]:
    return _set(name, lambda p: p.kwargs[name].narrow(dim, 1, p.kwargs[name].shape[dim] - 1).contiguous(),
                f"{name} one shorter in dim {dim}")


def _ids_with(value: Callable[[Problem], int], note: str) -> Callable[[Problem], Problem]:
    def change(p: Problem) -> Problem:
        ids = p.kwargs["topk_ids"].clone()
        ids[-1, 0] = value(p)
        return p.with_(f"topk_ids[-1, 0] = {note}", topk_ids=ids)
    return change


def _other_float(t: torch.Tensor) -> torch.dtype:
    return {torch.bfloat16: torch.float16, torch.float16: torch.float32}.get(t.dtype, torch.bfloat16)


# Per tensor argument: dtypes it must refuse (functions of the valid tensor).
BAD_DTYPES: dict[str, tuple[Callable[[torch.Tensor], torch.dtype], ...]] = {
    "hidden_states": (lambda t: torch.float64, lambda t: torch.int32, lambda t: torch.float8_e4m3fn),
    "w1": (lambda t: _other_float(t) if t.is_floating_point() and t.element_size() > 1
           else torch.int8 if t.dtype == torch.uint8 else torch.uint8,
           lambda t: torch.int32),
    "w2": (lambda t: torch.float8_e5m2 if t.dtype == torch.float8_e4m3fn else torch.int16,),
    "topk_weights": (lambda t: torch.int32, lambda t: torch.bool),
    "topk_ids": (lambda t: torch.int16, lambda t: torch.float32, lambda t: torch.uint8),
    "w1_scale": (lambda t: torch.bfloat16,),
    "w2_scale": (lambda t: torch.float64,),
    "w1_bias": (lambda t: torch.int32,),
    "w2_bias": (lambda t: torch.int8,),
    "w1_zero": (lambda t: torch.int32,),
    "w2_zero": (lambda t: torch.int8,),
}
SCALES, BIASES, ZEROS = ("w1_scale", "w2_scale"), ("w1_bias", "w2_bias"), ("w1_zero", "w2_zero")


def _tensor_mutations(name: str) -> list[Mutation]:
    """Wrong dtypes, ranks, layout and device for the tensor argument ``name``."""
    where = ({"methods": SCALED} if name in SCALES else {"bias": True} if name in BIASES
             else {"methods": (INT4,), "zero_points": True} if name in ZEROS else {})
    own = (name,)
    return [
        *(Mutation(f"{name}-dtype{i}", lambda p, bad=bad: p.with_(
            f"{name} as {bad(p.kwargs[name])}", **{name: p.kwargs[name].to(bad(p.kwargs[name]))}), own, **where)
          for i, bad in enumerate(BAD_DTYPES[name])),
        Mutation(f"{name}-rank+1", _set(name, lambda p: p.kwargs[name][None], f"{name} unsqueezed"), own, **where),
        Mutation(f"{name}-rank-1", _set(name, lambda p: p.kwargs[name].flatten(0, 1), f"{name} flattened"),
                 own, **where),
        Mutation(f"{name}-noncontiguous", _set(name, lambda p: _strided(p.kwargs[name]), f"{name} strided"),
                 own, **where),
        # The other tensors stay on the CPU: the op must not dispatch to its fake kernel.
        Mutation(f"{name}-meta", _set(name, lambda p: p.kwargs[name].to("meta"), f"{name} on meta"),
                 own if name != "hidden_states" else TENSOR_ARGS, **where),
    ]


def _zero_point(rows: str) -> Callable[[Problem], Problem]:
    name = f"{rows}_zero"
    def change(p: Problem) -> Problem:
        weight = p.kwargs[rows]
        return p.with_(f"{name} given", **{name: torch.zeros(*weight.shape[:2], 1, dtype=torch.uint8)})
    return change


def _byte_set(name: str, value: int) -> Callable[[Problem], Problem]:
    """The last byte of the uint8 tensor ``name`` set to ``value``, in the last
    expert, and a token routed there: the call checks the values it reads."""
    def change(p: Problem) -> Problem:
        t = p.kwargs[name].clone()
        t.view(-1)[-1] = value
        ids = p.kwargs["topk_ids"].clone()
        ids[0, 0] = t.shape[0] - 1
        return p.with_(f"{name}[-1, -1, -1] = {value}, topk_ids[0, 0] = E - 1", **{name: t, "topk_ids": ids})
    return change


MUTATIONS: list[Mutation] = [
    *(m for name in BAD_DTYPES for m in _tensor_mutations(name)),
    # E/K/N mismatches
    Mutation("w1-K-1", _shorter("w1", 2), ("w1", "hidden_states")),
    Mutation("w1-odd-rows", _shorter("w1", 1), ("w1", "w2")),
    Mutation("w1-E-1", _shorter("w1", 0), ("w1", "w2")),
    Mutation("w2-N-1", _shorter("w2", 2), ("w2", "w1")),
    Mutation("w2-K-1", _shorter("w2", 1), ("w2", "hidden_states")),
    Mutation("w2-E-1", _shorter("w2", 0), ("w2", "w1")),
    Mutation("topk_weights-topk-1", _shorter("topk_weights", 1), ("topk_weights", "topk_ids")),
    Mutation("topk_ids-M-1", _shorter("topk_ids", 0), ("topk_ids", "topk_weights", "hidden_states")),
    Mutation("w1_scale-rows-1", _shorter("w1_scale", 1), ("w1_scale",), methods=SCALED),
    Mutation("w2_scale-E-1", _shorter("w2_scale", 0), ("w2_scale",), methods=SCALED),
    Mutation("w2_scale-groups-1", _shorter("w2_scale", 2), ("w2_scale",), methods=FOUR_BIT),
    Mutation("w1_zero-groups-1", _shorter("w1_zero", 2), ("w1_zero",), methods=(INT4,), zero_points=True),
    Mutation("w1_bias-rows-1", _shorter("w1_bias", 1), ("w1_bias",), bias=True),
    Mutation("w2_bias-E-1", _shorter("w2_bias", 0), ("w2_bias",), bias=True),
    # ids
    Mutation("topk_ids=E", _ids_with(lambda p: p.dims()["E"], "E"), ("topk_ids",)),
    Mutation("topk_ids=2**31-1", _ids_with(lambda p: 2**31 - 1, "2**31-1"), ("topk_ids",)),
    Mutation("topk_ids=2**62", _ids_with(lambda p: 2**62, "2**62"), ("topk_ids",), ids_dtype=torch.int64),
    Mutation("topk_ids=-2**31", _ids_with(lambda p: -(2**31), "-2**31"), (), expect="result"),
    # scales, zero points, block_size, method
    *(Mutation(f"{name}-missing", _set(name, lambda p: None, f"{name}=None"), (name,), methods=SCALED)
      for name in SCALES),
    Mutation("w1_scale-for-UNQUANT", _set("w1_scale", lambda p: torch.ones(p.dims()["E"], 2 * p.dims()["N"]),
                                          "w1_scale given"), ("w1_scale",), methods=(UNQUANT,)),
    *(Mutation(f"{rows}_zero-for-{MoeCompMethod(m).name}", _zero_point(rows), (f"{rows}_zero",), methods=(m,))
      for rows in ("w1", "w2") for m in METHODS if m != INT4),
    Mutation("w2_zero=16", _byte_set("w2_zero", 16), ("w2_zero",), methods=(INT4,), zero_points=True),
    Mutation("w1_scale=255", _byte_set("w1_scale", 255), ("w1_scale",), methods=(MXFP4,)),
    Mutation("block_size-missing", _set("block_size", lambda p: None, "block_size=None"), ("block_size",),
             methods=(FP8,)),
    *(Mutation(f"block_size={bs}", _set("block_size", lambda p, bs=bs: bs, f"block_size={bs}"),
               ("block_size",), methods=(FP8,))
      for bs in ([16], [16, 32, 1], [0, 32], [16, -1], [-(2**63), 16], [2**64, 16])),
    *(Mutation(f"moe_comp_method={m}", _set("moe_comp_method", lambda p, m=m: m, f"moe_comp_method={m}"),
               ("moe_comp_method",))
      for m in (5, 7, -1, 2**31, 2**63 - 1, -(2**63))),
    # activation parameters
    Mutation("alpha=nan", _set("alpha", lambda p: math.nan, "alpha=nan"), ("alpha",)),
    Mutation("limit=nan", lambda p: p.with_("alpha=1.702 limit=nan", alpha=1.702, limit=math.nan), ("limit",)),
    Mutation("limit-without-alpha", lambda p: p.with_("limit=1.0 alpha=None", alpha=None, limit=1.0),
             ("limit", "alpha")),
    *(Mutation(f"alpha={a}", _set("alpha", lambda p, a=a: a, f"alpha={a}"), ("alpha",), expect="either")
      for a in (math.inf, -math.inf)),
    Mutation("limit=-1", lambda p: p.with_("alpha=1.702 limit=-1", alpha=1.702, limit=-1.0), ("limit",),
             expect="either"),
    # argument types, through the op and through the wrapper. torch's argument parser turns
    # None or 1 into a bool for every op before any kernel runs: only the wrapper can refuse those.
    *(Mutation(f"op-{name}={value!r}", _as_call("op", **{name: value}), (name,))
      for name, value in (("moe_comp_method", 1.0), ("alpha", "1.702"))),
    *(Mutation(f"wrapper-{name}={value!r}", _as_call("wrapper", **{name: value}), (name,))
      for name, value in (("moe_comp_method", 0.7), ("moe_comp_method", "1"), ("alpha", "1.702"),
                          ("inplace", None))),
    Mutation("wrapper-limit='1'", _as_call("wrapper", alpha=1.702, limit="1"), ("limit",)),
    Mutation("wrapper-block_size-floats", _as_call("wrapper", block_size=[16.0, 32.0]), ("block_size",),
             methods=(FP8,)),
    # packed weights
    Mutation("wrapper-is_vnni=1", lambda p: _as_call("wrapper", is_vnni=1)(p.packed()), ("is_vnni",)),
    Mutation("is_vnni-unpacked", _set("is_vnni", lambda p: True, "is_vnni=True, weights unpacked"),
             ("w1", "is_vnni")),
    Mutation("packed-without-is_vnni", lambda p: p.packed().with_("is_vnni=False", is_vnni=False),
             ("w1", "is_vnni")),
    Mutation("packed-for-UNQUANT", lambda p: p.with_(
        "weights bf16", w1=p.kwargs["w1"].float().bfloat16(), w2=p.kwargs["w2"].float().bfloat16(),
    ).packed("packed as UNQUANT", method=UNQUANT), ("w1", "w2", "moe_comp_method"), methods=(INT8, FP8)),
]


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.name)
@given(data=st.data())
@settings(max_examples=2, **SETTINGS)
def test_invalid_calls_name_an_argument(sandbox: Sandbox, mutation: Mutation, data: st.DataObject) -> None:
    problem = data.draw(problems(small=True, methods=mutation.methods, bias=mutation.bias,
                                 ids_dtype=mutation.ids_dtype, zero_points=mutation.zero_points),
                        label="valid problem")
    run_case(sandbox, mutation.change(problem), mutation.expect, mutation.names)


# --- zero-size dimensions ------------------------------------------------------------

ZERO_DIMS = ("M", "K", "N", "E", "topk")


def _zero_axes(method: int) -> dict[str, dict[str, int]]:
    """Per dimension: the arguments that carry it, and where."""
    grouped = {"N": {"w1_scale": 1, "w1_zero": 1, "w2_scale": 2, "w2_zero": 2},
               "K": {"w1_scale": 2, "w1_zero": 2, "w2_scale": 1, "w2_zero": 1}}
    scale_axes = {
        INT8: {"N": {"w1_scale": 1}, "K": {"w2_scale": 1}},
        FP8: {"N": {"w1_scale": 1, "w2_scale": 2}, "K": {"w1_scale": 2, "w2_scale": 1}},
        INT4: grouped,
        MXFP4: grouped,
    }.get(method, {})
    axes = {
        "M": {"hidden_states": 0, "topk_ids": 0, "topk_weights": 0},
        "K": {"hidden_states": 1, "w1": 2, "w2": 1, "w2_bias": 1},
        "N": {"w1": 1, "w2": 2, "w1_bias": 1},
        "E": {"w1": 0, "w2": 0, "w1_bias": 0, "w2_bias": 0, "w1_scale": 0, "w2_scale": 0, "w1_zero": 0,
              "w2_zero": 0},
        "topk": {"topk_ids": 1, "topk_weights": 1},
    }
    for dim, extra in scale_axes.items():
        axes[dim].update(extra)
    return axes


@st.composite
def zero_size_calls(draw: st.DrawFn, dim: str, packed: bool) -> tuple[Problem, str, tuple[str, ...]]:
    """A valid problem with ``dim`` (and maybe another of M, K, N, E, topk) set to 0;
    its expected outcome; the arguments that then have a zero-size dimension."""
    problem = draw(problems(small=True))
    zero = sorted({dim} | draw(st.sets(st.sampled_from(ZERO_DIMS), max_size=1)))
    axes = _zero_axes(problem.method)
    overrides = {}
    for zero_dim in zero:
        for name, axis in axes[zero_dim].items():
            t = overrides.get(name, problem.kwargs[name])
            if t is not None:
                overrides[name] = t.narrow(axis, 0, 0).contiguous()
    if "E" in zero:  # no expert to route to: every slot unused
        overrides["topk_ids"] = torch.full_like(overrides.get("topk_ids", problem.kwargs["topk_ids"]), -1)
    problem = problem.with_(" ".join(f"{d}=0" for d in zero), **overrides)
    if {"K", "N", "E"} & set(zero):
        # Zero-size weights hold no values to dequantize: the same math unquantized
        # (4-bit weights hold two values per byte: the float ones at their logical shape).
        d = problem.dims()
        problem = dataclasses.replace(problem, reference_overrides=dict(
            moe_comp_method=int(UNQUANT), w1=torch.zeros(d["E"], 2 * d["N"], d["K"]),
            w2=torch.zeros(d["E"], d["K"], d["N"]), w1_scale=None, w2_scale=None, w1_zero=None, w2_zero=None,
            block_size=None))
    if packed:
        problem = problem.packed()
    names = {n for d in zero for n in axes[d]} | {"topk_ids", "weight"}
    # M = 0 is an empty batch; a zero K, N, E or topk may be refused, or computed
    # as the math says (N = 0: each slot adds its w2_bias).
    return problem, "result" if zero == ["M"] else "either", tuple(sorted(names))


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
@pytest.mark.parametrize("dim", ZERO_DIMS)
@given(data=st.data())
@settings(max_examples=2, **SETTINGS)
def test_zero_size_dimensions(sandbox: Sandbox, dim: str, packed: bool, data: st.DataObject) -> None:
    run_case(sandbox, *data.draw(zero_size_calls(dim, packed), label="call"))


# --- huge dimensions ---------------------------------------------------------------

@st.composite
def thousands_of_slots(draw: st.DrawFn) -> Problem:
    """A small problem routed through thousands of slots per token (experts
    repeat, some slots unused)."""
    problem = draw(problems(small=True))
    M, E = problem.dims()["M"], problem.dims()["E"]
    topk = draw(st.sampled_from((1000, 2048, 4099)))
    gen = torch.Generator().manual_seed(topk)
    ids = torch.randint(-1, E, (M, topk), generator=gen).to(problem.kwargs["topk_ids"].dtype)
    weights = torch.rand(M, topk, generator=gen) / topk
    return problem.with_(f"topk={topk}", topk_ids=ids, topk_weights=weights)


@given(problem=thousands_of_slots())
@settings(max_examples=4, **SETTINGS)
def test_thousands_of_slots_per_token(sandbox: Sandbox, problem: Problem) -> None:
    run_case(sandbox, problem, "result")


def test_routed_copy_beyond_memory(sandbox: Sandbox) -> None:
    """M x topk x K = 2**41 bf16 values to route (a terabyte) from 50 MB of inputs:
    refused, or computed without that copy. Every slot is expert 0's, so the
    reference adds the weights up first (the same sum)."""
    topk, K = 2**22, 2**17
    gen = torch.Generator().manual_seed(0)
    kwargs = dict(
        hidden_states=torch.randn(1, K, generator=gen).bfloat16(),
        w1=(torch.randn(1, 2, K, generator=gen) / math.sqrt(K)).bfloat16(),
        w2=torch.randn(1, K, 1, generator=gen).bfloat16(),
        topk_weights=torch.full((1, topk), 1 / topk), topk_ids=torch.zeros(1, topk, dtype=torch.int32),
        inplace=False, moe_comp_method=int(UNQUANT), is_vnni=False,
    )
    problem = Problem(kwargs, f"op: UNQUANT bfloat16 M=1 K={K} N=1 E=1 topk={topk}, every slot expert 0",
                      reference_overrides=dict(topk_weights=torch.ones(1, 1), topk_ids=torch.zeros(1, 1, dtype=torch.int32)))
    run_case(sandbox, problem, "either", ("hidden_states", "topk_ids", "topk_weights"))


HUGE_BLOCKS = (2**31, 2**32 + 1, 2**62, 2**63 - 1)


@st.composite
def huge_block_sizes(draw: st.DrawFn) -> tuple[Problem, str, tuple[str, ...]]:
    """FP8 with a block size near 2**63 (one block spans everything) and the
    scales that implies, or empty scales (an overflowed block count would)."""
    bn, bk = draw(st.sampled_from([(b, 16) for b in HUGE_BLOCKS] + [(16, b) for b in HUGE_BLOCKS]
                                  + [(b, b) for b in HUGE_BLOCKS]))
    # Small problems are at most 32 x 32: a block of >= 32 covers each matrix whole.
    same = (min(bn, 32), min(bk, 32))
    problem = draw(problems(small=True, methods=(FP8,), block_sizes=(same,)))
    problem = dataclasses.replace(problem.with_(f"block_size=[{bn}, {bk}]", block_size=[bn, bk]),
                                  reference_overrides={"block_size": list(same)})
    if draw(st.booleans()):
        return problem, "result", ()
    empty = {name: problem.kwargs[name][:, :0].contiguous() for name in SCALES}
    return problem.with_("empty scales", **empty), "error", SCALES + ("block_size",)


@given(call=huge_block_sizes())
@settings(max_examples=8, **SETTINGS)
def test_block_size_near_int64_max(sandbox: Sandbox, call: tuple[Problem, str, tuple[str, ...]]) -> None:
    run_case(sandbox, *call)


# --- packed headers, views at byte offsets ---------------------------------------------

def _small_problem(K: int, N: int, E: int = 3, dtype: torch.dtype = torch.bfloat16) -> Problem:
    made = make_moe_problem(2, K, N, E, min(2, E), dtype)
    return Problem(dict(made.arguments, inplace=False, is_vnni=False),
                   f"op: UNQUANT {_name(dtype)} M=2 K={K} N={N} E={E} topk={min(2, E)}")


def _int_values(bits: int, signed: bool) -> tuple[int, ...]:
    if signed:
        return (-1, 0, 1, 2, 2 ** (bits - 1) - 1, -(2 ** (bits - 1)), 2**31 - 1) if bits == 64 else (-1, 0, 1, 2)
    return (0, 1, 2, 7, 2**bits - 1)


# Values to forge each header field with (within the field's C type).
FORGED_VALUES = {
    "version": _int_values(32, False), "arch": _int_values(32, False),
    "dtype": (0, 1, 5, 6, 15, 24, 44, -1), "layout": (-1, 0, 1, 2),
    **{field: _int_values(64, True) + (2**58, 2**62) for field in ("rows", "cols", "ld", "sums_offset")},
}
# The header-only forgery whose sizes wrap int64 (packed_nbytes() then matches the
# 64 bytes given): w1 claims 2**62 rows of K = 64, w2 2**61 columns.
WRAPPED_HEADERS = {"w1": {"rows": 2**62}, "w2": {"cols": 2**61, "ld": 2**61}}


def _forged(problem: Problem, forgeries: Mapping[str, Mapping[str, int]]) -> Problem:
    for name, fields in forgeries.items():
        elem = problem.kwargs[name].element_size()
        problem = problem.step(f"{name} header forged {dict(fields)}", "forge", name, elem=elem, fields=dict(fields))
    return problem


def _flipped(problem: Problem, name: str, expert: int | None, byte: int, bit: int) -> Problem:
    """Bit ``bit`` of byte ``byte`` of expert ``expert``'s block (None: every expert's) flipped."""
    which = "every expert's" if expert is None else f"expert {expert}'s"
    return problem.step(f"{name}: {which} header byte {byte} bit {bit} flipped", "flip", name,
                        expert=expert, byte=byte, bit=bit)


@st.composite
def changed_headers(draw: st.DrawFn) -> tuple[Problem, str]:
    """Packed weights with one bit of a header flipped, or one field forged."""
    problem = draw(problems(small=True)).packed()
    name = draw(st.sampled_from(("w1", "w2")))
    if draw(st.booleans()):
        expert = draw(st.one_of(st.none(), st.integers(0, problem.dims()["E"] - 1)))
        return _flipped(problem, name, expert, draw(st.integers(0, 63)), draw(st.integers(0, 7))), name
    field = draw(st.sampled_from(sorted(FORGED_VALUES)))
    return _forged(problem, {name: {field: draw(st.sampled_from(FORGED_VALUES[field]))}}), name


@given(change=changed_headers())
# The layout byte (offset 20) of a 32-row bf16 w1: the tile layout at avx512_bf16.
@example(change=(_flipped(_small_problem(32, 16).packed(), "w1", None, 20, 0), "w1"))
@settings(max_examples=30, **SETTINGS)
def test_changed_packed_headers(sandbox: Sandbox, change: tuple[Problem, str]) -> None:
    """A changed header is refused, naming the weight, unless the change leaves
    the weights' meaning intact (a spare byte, an expert the call does not
    read): then the result is the reference's."""
    problem, name = change
    run_case(sandbox, problem, "either", (name, "is_vnni"))


def test_forged_header_whose_size_wraps(sandbox: Sandbox) -> None:
    problem = _forged(_small_problem(64, 8, E=1).packed(), WRAPPED_HEADERS)
    run_case(sandbox, problem, "error", ("w1", "w2"))


@st.composite
def views_at_offsets(draw: st.DrawFn) -> tuple[Problem, str]:
    """One tensor argument (packed weights included) as a view that starts an odd
    number of its elements, not a multiple of 64 bytes, into a larger byte buffer
    (as mmap'd or safetensors weights are)."""
    problem = draw(problems())
    name = draw(st.sampled_from([n for n in TENSOR_ARGS if problem.kwargs.get(n) is not None]))
    packed = problem.kwargs["is_vnni"] and name in ("w1", "w2")
    elem = 1 if packed else problem.kwargs[name].element_size()
    offset = elem * draw(st.integers(1, 63 // elem))
    return problem.step(f"{name} at byte offset {offset}", "offset", name, bytes=offset), name


@given(view=views_at_offsets())
@example(view=(_small_problem(32, 16).packed().step("w1 at byte offset 8", "offset", "w1", bytes=8), "w1"))
@settings(max_examples=20, **SETTINGS)
def test_views_at_byte_offsets(sandbox: Sandbox, view: tuple[Problem, str]) -> None:
    """Handled (the reference's result), or refused naming the tensor."""
    problem, name = view
    run_case(sandbox, problem, "either", (name,))


# --- convert_weight_packed ------------------------------------------------------------

# (name, change of (weight, method), expected outcome)
CONVERT_CHANGES = [
    ("rows=0", lambda w, m: (w[:, :0].contiguous(), m), "either"),
    ("cols=0", lambda w, m: (w[:, :, :0].contiguous(), m), "either"),
    ("E=0", lambda w, m: (w[:0].contiguous(), m), "either"),
    ("rank2", lambda w, m: (w[0].contiguous(), m), "error"),
    ("rank4", lambda w, m: (w[None], m), "error"),
    ("float64", lambda w, m: (w.double(), m), "error"),
    ("int32", lambda w, m: (w.int(), m), "error"),
    ("noncontiguous", lambda w, m: (w.transpose(1, 2), m), "error"),
    ("other-method", lambda w, m: (w, int(FP8 if m == INT8 else INT8)), "error"),
    ("4-bit-method-for-other", lambda w, m: (w, int(INT8 if m in FOUR_BIT else INT4)), "error"),
    *((f"method={m}", lambda w, _, m=m: (w, m), "error") for m in (5, -1, 2**63 - 1)),
]


@pytest.mark.parametrize("change, expect", [c[1:] for c in CONVERT_CHANGES], ids=[c[0] for c in CONVERT_CHANGES])
@given(problem=problems(small=True))
@settings(max_examples=2, **SETTINGS)
def test_convert_weight_packed_bad_input(sandbox: Sandbox, change: Callable, expect: str, problem: Problem) -> None:
    weight, method = change(problem.kwargs["w1"], problem.method)
    call = Problem({"weight": weight, "moe_comp_method": method}, f"convert: {_describe(weight)} method {method}",
                   call="convert")
    run_case(sandbox, call, expect, tuple(CONVERT_ARGS))
