"""Modelled speed of the kernels' hot loops on real cores: llvm-mca, no hardware needed.

Every kernel file of every ISA level is compiled to assembly with exactly the
flags of the wheel's build (CMake's compile database: the level's -march, -O3,
...), aarch64's with the cross compiler. Each innermost loop that does the
multiply-accumulates of a GEMM (or streams vectors through memory, as the MXFP4
widening does) is a hot loop; llvm-mca simulates it on each core of CORES and
gives its cycles per iteration. From the loop's own instructions come the MACs
and bytes it loads per iteration, so per loop and core:

- MAC/cycle, against the peak of the loop's own multiply instruction on that
  core (the same instruction, independent, simulated alone);
- load bytes/cycle, against the core's peak (independent vector loads);
- the resource that bounds it (llvm-mca's pressure), or a dependency chain.

The figure is deterministic: the same sources, compiler and llvm-mca give the
same numbers (`--repeat 2` checks). Table, JSON and PNG go to bench-results/mca/.

    python -m benchmarks.mca                       # aarch64 and x86_64, every core
    python -m benchmarks.mca --arch aarch64 --cores neoverse-n1 --repeat 2
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from benchmarks import determinism
from harness.building import cross
from harness.common import paths
from harness.plan import targets
from harness.plan.levels import up_to

LLVM_MCA = "llvm-mca-19"  # 19 models Neoverse N1, V1 and V2 and Sapphire Rapids; 14 models them all as a Cortex-A57
LLVM_PACKAGE = "llvm-19"
ITERATIONS = 200
TRIPLE = {"aarch64": "aarch64-linux-gnu", "x86_64": "x86_64-linux-gnu"}


@dataclasses.dataclass(frozen=True)
class Core:
    arch: str
    cpu: str  # llvm-mca's -mcpu
    machines: str  # where it is deployed
    ghz: float  # a nominal clock of those machines: only for the modelled GFLOP/s
    top: str  # the highest ISA level it runs

    @property
    def levels(self) -> tuple[str, ...]:  # the ISA levels it runs
        return up_to(targets.ARCHES[self.arch].sources, self.top)


CORES = (
    Core("aarch64", "neoverse-n1", "AWS Graviton2, Ampere Altra", 2.5, "dotprod"),
    Core("aarch64", "neoverse-v1", "AWS Graviton3", 2.6, "i8mm"),
    Core("aarch64", "neoverse-v2", "NVIDIA Grace, AWS Graviton4", 3.0, "i8mm"),
    # llvm-mca has no AMX model (its tile instructions get a placeholder latency of 100): amx is not modelled.
    Core("x86_64", "sapphirerapids", "Intel Xeon 4th gen", 2.0, "avx512_bf16"),
    Core("x86_64", "znver4", "AMD EPYC 9004", 2.4, "avx512_bf16"),
)


# --- compiling the kernel files to assembly -------------------------------------------


@dataclasses.dataclass(frozen=True)
class KernelSource:
    level: str
    file: str  # relative to the tree
    arguments: tuple[str, ...]  # the compile command, without its output
    directory: str


def configure(arch: str, build_dir: Path) -> Path:
    """CMake's compile database for arch (a cross configure for a foreign one)."""
    table = targets.load_targets(paths.PYPROJECT)
    env = dict(os.environ)
    if arch != platform.machine():
        target = table[arch]
        cross.ensure_compiler(target)
        env.update(cross.cross_env(paths.REPO, target, cross.torch_dir(target)))
    result = cross.configure(paths.REPO, build_dir, env, ["-DCMAKE_EXPORT_COMPILE_COMMANDS=ON",
                                                         f"-DPython_EXECUTABLE={sys.executable}"])
    if result.returncode != 0:
        raise RuntimeError(f"cmake could not configure {arch}:\n{result.stdout}{result.stderr}")
    return build_dir / "compile_commands.json"


LEVEL_DEFINE = "-DMOE_XARCH_LEVEL="
# Flags that write beside the object (dependency files, gcov notes) or name it.
DROPPED_WITH_VALUE = {"-o", "-MT", "-MF", "-MQ"}
DROPPED = {"-c", "-MD", "-MMD", "--coverage"}


def kernel_sources(database: Sequence[dict], tree: Path) -> list[KernelSource]:
    """The compile commands of the files CMake gives a level (its level table's)."""
    found = []
    for entry in database:
        arguments = entry.get("arguments") or shlex.split(entry["command"])
        level = next((a[len(LEVEL_DEFINE):].strip('"\\') for a in arguments if a.startswith(LEVEL_DEFINE)), None)
        if level is None:
            continue
        kept: list[str] = []
        skip = False
        for argument in arguments:
            if skip:
                skip = False
            elif argument in DROPPED_WITH_VALUE:
                skip = True
            elif argument not in DROPPED:
                kept.append(argument)
        path = os.path.normpath(os.path.join(entry["directory"], entry["file"]))
        kept = [a for a in kept if os.path.normpath(os.path.join(entry["directory"], a)) != path]
        found.append(KernelSource(level, os.path.relpath(path, tree), tuple(kept), entry["directory"]))
    return sorted(found, key=lambda s: (s.level, s.file))


def assemble(source: KernelSource, tree: Path, out: Path) -> str:
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [*source.arguments, "-S", "-o", str(out), str(tree / source.file)]
    result = subprocess.run(command, cwd=source.directory, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{source.file} ({source.level}) did not compile to assembly:\n{result.stderr}")
    return out.read_text()


# --- the assembly: functions, loops, what an iteration does ---------------------------


@dataclasses.dataclass(frozen=True)
class Loop:
    function: str  # mangled
    label: str
    instructions: tuple[str, ...]  # from the label to the backward branch, tab-separated as the compiler wrote them


# Conditional branches: a compiled loop ends in one (GCC rotates loops). A backward
# unconditional branch also joins blocks laid out out of order, which is no loop.
BRANCH = {"aarch64": re.compile(r"^(b\.\w+|b(?!l\b|r\b)\w\w|cbn?z|tbn?z)$"), "x86_64": re.compile(r"^j(?!mp)\w+$")}
LABEL = re.compile(r"^([.\w$]+):")


def functions(text: str) -> dict[str, list[str]]:
    """Each function's lines (labels and instructions; no directives or comments), by mangled name."""
    found: dict[str, list[str]] = {}
    current = None
    kinds = {m.group(1) for m in re.finditer(r"^\s*\.type\s+([\w.$]+),\s*[%@]function", text, re.M)}
    for raw in text.splitlines():
        line = re.split(r"\s(?://|#\s)", raw, maxsplit=1)[0].rstrip()  # aarch64 immediates are #1
        label = LABEL.match(line)
        if label and label.group(1) in kinds:
            current = label.group(1)
            found[current] = []
        elif current is not None and line.strip().startswith(".size"):
            current = None
        elif current is not None and (label or (line.startswith("\t") and not line.strip().startswith("."))):
            found[current].append(line.strip())
    return found


def mnemonic(instruction: str) -> str:
    return instruction.split(None, 1)[0].lower()


def operands(instruction: str) -> str:
    parts = instruction.split(None, 1)
    return parts[1] if len(parts) > 1 else ""


def innermost_loops(name: str, lines: Sequence[str], arch: str) -> list[Loop]:
    """Loops closed by a backward branch that hold no other loop."""
    labels = {LABEL.match(line).group(1): i for i, line in enumerate(lines) if LABEL.match(line)}
    spans = []
    for i, line in enumerate(lines):
        if LABEL.match(line) or not BRANCH[arch].match(mnemonic(line)):
            continue
        target = operands(line).split(",")[-1].strip()
        if target in labels and labels[target] < i:
            spans.append((labels[target], i))
    ends: dict[int, int] = {}
    for start, end in spans:  # a loop with two backward branches to its head ends at the last
        ends[start] = max(end, ends.get(start, end))
    loops = []
    for start, end in sorted(ends.items()):
        if any(start <= s and e <= end and (s, e) != (start, end) for s, e in ends.items()):
            continue
        body = tuple(line for line in lines[start + 1:end + 1] if not LABEL.match(line))
        loops.append(Loop(name, LABEL.match(lines[start]).group(1), body))
    return loops


# MACs of one instruction. aarch64: by mnemonic and the destination's arrangement.
AARCH64_MACS = {
    **{(op, "4s"): 16 for op in ("sdot", "udot", "usdot", "sudot")},
    **{(op, "2s"): 8 for op in ("sdot", "udot", "usdot", "sudot")},
    **{(op, "4s"): 32 for op in ("smmla", "ummla", "usmmla")},
    ("bfmmla", "4s"): 16, ("bfdot", "4s"): 8, ("bfdot", "2s"): 4, ("bfmlalb", "4s"): 4, ("bfmlalt", "4s"): 4,
    ("fmla", "4s"): 4, ("fmla", "2s"): 2, ("fmla", "2d"): 2, ("fmla", "8h"): 8, ("fmla", "4h"): 4,
    **{(op, "8h"): 8 for op in ("smull", "smull2", "umull", "umull2", "smlal", "smlal2", "umlal", "umlal2")},
    **{(op, "4s"): 4 for op in ("smull", "smull2", "umull", "umull2", "smlal", "smlal2", "umlal", "umlal2",
                                "mla", "mul")},
    ("mla", "8h"): 8, ("mla", "16b"): 16, ("mul", "8h"): 8,
}
# x86: per 128 bits of the widest vector register the instruction names.
X86_MACS = {"vpdpbusd": 16, "vpdpbusds": 16, "vpdpbssd": 16, "vpdpwssd": 8, "vdpbf16ps": 8, "vpmaddubsw": 16,
            **{f"vfmadd{order}ps": 4 for order in ("132", "213", "231")},
            **{f"vfnmadd{order}ps": 4 for order in ("132", "213", "231")}}
# vpmaddwd multiplies only where no vpmaddubsw made the pairs: after one it adds them (times ones).
X86_PAIR_SUM = "vpmaddwd"
X86_WIDTH = {"zmm": 4, "ymm": 2, "xmm": 1}


def x86_width(instruction: str) -> int:
    """The widest vector register of the instruction, in 128-bit units (0: none)."""
    return max((X86_WIDTH[r] for r in re.findall(r"%([xyz]mm)\d+", instruction)), default=0)


def instruction_macs(instruction: str, arch: str, pairs_made: bool = False) -> int:
    op = mnemonic(instruction)
    if arch == "aarch64":
        arrangement = re.match(r"\s*v\d+\.(\w+)", operands(instruction))
        return AARCH64_MACS.get((op, arrangement.group(1)), 0) if arrangement else 0
    if op == X86_PAIR_SUM and not pairs_made:
        return 8 * x86_width(instruction)
    return X86_MACS.get(op, 0) * x86_width(instruction)


def loop_macs(instructions: Sequence[str], arch: str) -> dict[str, int]:
    """MACs per iteration, by instruction (its text as the first of its mnemonic in the loop)."""
    pairs_made = arch == "x86_64" and any(mnemonic(i) == "vpmaddubsw" for i in instructions)
    totals: dict[str, int] = {}
    first: dict[str, str] = {}
    for instruction in instructions:
        macs = instruction_macs(instruction, arch, pairs_made)
        if macs:
            key = first.setdefault(mnemonic(instruction), instruction)
            totals[key] = totals.get(key, 0) + macs
    return totals


AARCH64_REG_BYTES = {"q": 16, "d": 8, "s": 4, "h": 2, "b": 1, "x": 8, "w": 4}
AARCH64_LIST_BYTES = {"16b": 16, "8h": 16, "4s": 16, "2d": 16, "8b": 8, "4h": 8, "2s": 8, "1d": 8}
AARCH64_LANE_BYTES = {"b": 1, "h": 2, "s": 4, "d": 8}


def aarch64_access(instruction: str) -> tuple[str, int]:
    """("load" | "store" | "", bytes) of one instruction."""
    op, args = mnemonic(instruction), operands(instruction)
    kind = "load" if op.startswith("ld") and not op.startswith("ldadd") else "store" if op.startswith("st") else ""
    if not kind or "[" not in args:
        return "", 0
    listed = re.match(r"\{([^}]*)\}(\[\d+\])?", args)
    if listed:  # ld1..ld4 / st1..st4: a register list, whole registers, a lane of each or replicated
        registers = re.findall(r"v(\d+)\.(\w+)", listed.group(1))
        count = len(registers)
        if " - " in listed.group(1):
            count = (int(registers[1][0]) - int(registers[0][0])) % 32 + 1
        arrangement = registers[0][1]
        if listed.group(2) or op.endswith("r"):
            return kind, count * AARCH64_LANE_BYTES[arrangement[-1]]
        return kind, count * AARCH64_LIST_BYTES[arrangement]
    size = {"b": 1, "h": 2, "sw": 4, "sb": 1, "sh": 2}.get(re.sub(r"^(ld|st)(u?r|n?p)", "", op))
    first = re.match(r"\s*([qdshbxw])\d+", args)
    if size is None:
        size = AARCH64_REG_BYTES[first.group(1)] if first else 0
    pair = op.startswith(("ldp", "stp", "ldnp", "stnp"))
    return kind, size * (2 if pair else 1)


def x86_access(instruction: str) -> tuple[str, int]:
    op, args = mnemonic(instruction), operands(instruction)
    if "(" not in args or op.startswith(("lea", "prefetch", "nop")):
        return "", 0
    last = args.rsplit(",", 1)[-1].strip()
    kind = "store" if "(" in last else "load"
    if "{1to" in args:
        return kind, 4
    width = x86_width(instruction) * 16
    broadcast = re.match(r"v(p?broadcast|broadcast)(\w+)$", op)
    if broadcast:
        return kind, {"b": 1, "w": 2, "d": 4, "q": 8, "ss": 4, "sd": 8, "f32x4": 16, "i32x4": 16,
                      "f64x2": 16, "i64x2": 16, "f32x8": 32, "i32x8": 32}.get(broadcast.group(2), width)
    extend = re.match(r"vpmov[sz]x(\w)(\w)$", op)
    if extend:
        ratio = {"b": 1, "w": 2, "d": 4, "q": 8}
        return kind, width * ratio[extend.group(1)] // ratio[extend.group(2)]
    if width == 0:
        return kind, {"q": 8, "l": 4, "w": 2, "b": 1}.get(op[-1], 8)
    return kind, width


def loop_bytes(instructions: Sequence[str], arch: str) -> dict[str, int]:
    access = aarch64_access if arch == "aarch64" else x86_access
    totals = {"load": 0, "store": 0}
    for instruction in instructions:
        kind, size = access(instruction)
        if kind:
            totals[kind] += size
    return totals


def is_vector(instruction: str, arch: str) -> bool:
    return bool(re.search(r"\bv\d+\.|\bq\d+\b", instruction) if arch == "aarch64" else x86_width(instruction))


def hot_loops(asm: str, arch: str) -> list[Loop]:
    """Per function: its innermost loops that multiply-accumulate, or else those that store vectors."""
    access = aarch64_access if arch == "aarch64" else x86_access
    hot = []
    for name, lines in functions(asm).items():
        loops = innermost_loops(name, lines, arch)
        multiplying = [loop for loop in loops if loop_macs(loop.instructions, arch)]
        # A GEMM's other loops (its epilogue's) are not hot; a function without
        # multiplies is hot where it streams vectors to memory.
        hot += multiplying or [loop for loop in loops
                               if any(access(i)[0] == "store" and is_vector(i, arch) for i in loop.instructions)]
    return hot


def demangle(names: Iterable[str]) -> dict[str, str]:
    names = list(dict.fromkeys(names))
    if not names:
        return {}
    result = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
    return dict(zip(names, result.stdout.splitlines()))


def short_name(demangled: str) -> str:
    """`dot_tile<S8DotOps, 4, 4>`: no namespaces, return type or parameters; a clone keeps its suffix."""
    text = re.sub(r"moe_xarch::|\(anonymous namespace\)::|\w+::(?=\w+ const)", "", demangled)
    depth, start, cut = 0, 0, len(text)
    for i, ch in enumerate(text):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == " " and depth == 0:  # a template function's return type comes first
            start = i + 1
        if ch == "(" and depth == 0:
            cut = i
            break
    clone = re.search(r"\[clone [^\]]*\]", text)
    return text[start:cut] + (f" {clone.group(0)}" if clone else "")


# --- llvm-mca -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Model:
    cycles: float  # per iteration, in the steady state
    block_rthroughput: float  # the resource bound per iteration
    bottleneck: str  # the most used resource, and its cycles per iteration


def run_mca(instructions: Sequence[str], arch: str, cpu: str, tool: str = LLVM_MCA) -> Model:
    text = "\n".join(instructions) + "\n"
    result = subprocess.run([tool, f"-mtriple={TRIPLE[arch]}", f"-mcpu={cpu}", f"-iterations={ITERATIONS}",
                             "--json", "--timeline=false"], input=text, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{tool} -mcpu={cpu} failed: {result.stderr.strip()[:800]}")
    document = json.loads(result.stdout)
    region = document["CodeRegions"][0]
    summary = region["SummaryView"]
    names = [n.replace("\x00", "0").replace("\x01", "1").replace("\x02", "2").replace("\x03", "3")
             for n in document["TargetInfo"]["Resources"]]
    usage = [0.0] * len(names)
    count = len(instructions)
    for item in region["ResourcePressureView"]["ResourcePressureInfo"]:
        if item["InstructionIndex"] < count:
            usage[item["ResourceIndex"]] += item["ResourceUsage"]
    busiest = max(range(len(usage)), key=usage.__getitem__) if usage else None
    bottleneck = f"{names[busiest]} {usage[busiest]:.2f}" if busiest is not None else ""
    return Model(summary["TotalCycles"] / summary["Iterations"], float(summary["BlockRThroughput"]), bottleneck)


def independent(instruction: str, arch: str) -> list[str]:
    """Copies of a multiply-accumulate with distinct accumulators and fixed sources: its throughput alone."""
    if arch == "aarch64":
        out = []
        for i in range(24):
            numbers = iter([i, 31, 30, 29])
            out.append(re.sub(r"\bv\d+\.", lambda _: f"v{next(numbers)}.", instruction))
        return out
    width = max(re.findall(r"%([xyz]mm)\d+", instruction), key=X86_WIDTH.__getitem__)
    accumulators, sources = (28, (31, 30)) if width == "zmm" else (14, (15, 14))
    body = re.sub(r"(\{1to\d+\})", "", instruction)
    body = re.sub(r"-?\w*\(%\w+(,%\w+)?(,\d)?\)", f"%{width}{sources[1]}", body)  # a memory operand: a register
    out = []
    for i in range(accumulators):
        registers = re.findall(r"%[xyz]mm\d+", body)
        names = [f"%{width}{sources[0]}", f"%{width}{sources[1]}"]
        mapping = {r: names[k % 2] for k, r in enumerate(registers[:-1])}
        text = re.sub(r"%[xyz]mm\d+(?=\s*$)", f"%{width}{i}", body)
        text = re.sub(r"%[xyz]mm\d+(?=\s*,)", lambda m: mapping.get(m.group(0), m.group(0)), text)
        out.append(text)
    return out


def load_stream(arch: str, width: int) -> list[str]:
    """Independent full-width vector loads: the core's load bandwidth."""
    if arch == "aarch64":
        return [f"ldr q{i}, [x0, #{16 * i}]" for i in range(24)]
    name, count = ({4: "zmm", 2: "ymm"}.get(width, "xmm"), 28 if width == 4 else 14)
    mov = "vmovdqu64" if width == 4 else "vmovdqu"
    return [f"{mov} {16 * width * i}(%rax), %{name}{i}" for i in range(count)]


@functools.cache
def peak_macs(instruction: str, arch: str, cpu: str) -> float:
    copies = independent(instruction, arch)
    return instruction_macs(instruction, arch) * len(copies) / run_mca(copies, arch, cpu).cycles


@functools.cache
def peak_load_bytes(arch: str, cpu: str, width: int) -> float:
    stream = load_stream(arch, width)
    total = sum((aarch64_access if arch == "aarch64" else x86_access)(i)[1] for i in stream)
    return total / run_mca(stream, arch, cpu).cycles


def method_of(name: str) -> str:
    """The GEMM method a hot loop serves, from its kernel's name."""
    lowered = name.lower()
    for method, words in METHOD_WORDS:
        if any(w in lowered for w in words):
            return method
    return "?"


# First match wins: the row kernels (activations, the weighted sum, quantizing a, laying a out for the tiles)
# before the methods' words.
METHOD_WORDS = (("rows", ("silu", "swiglu", "weighted", "quantize_row", "widen_bf16_rows", "w4a8_split", "pairs")),
                ("int4", ("w4a8", "int4")), ("mxfp4", ("mxfp4",)), ("fp8", ("fp8",)), ("bf16", ("bf16",)),
                ("int8", ("s8", "int8")), ("fp32", ("f32",)))


def figure(loop: Loop, name: str, source: KernelSource, core: Core) -> dict[str, object]:
    arch = core.arch
    model = run_mca(loop.instructions, arch, core.cpu)
    macs = loop_macs(loop.instructions, arch)
    moved = loop_bytes(loop.instructions, arch)
    width = max((x86_width(i) for i in loop.instructions), default=0) if arch == "x86_64" else 1
    load_peak = peak_load_bytes(arch, core.cpu, width)
    total_macs = sum(macs.values())
    row: dict[str, object] = {
        "arch": arch, "core": core.cpu, "level": source.level, "file": source.file, "kernel": name,
        "method": method_of(name), "label": loop.label, "instructions": len(loop.instructions),
        "cycles": round(model.cycles, 3), "block_rthroughput": model.block_rthroughput,
        "bottleneck": model.bottleneck, "macs": total_macs, "load_bytes": moved["load"],
        "store_bytes": moved["store"], "load_bytes_per_cycle": round(moved["load"] / model.cycles, 3),
        "load_fraction": round(moved["load"] / model.cycles / load_peak, 3),
        "load_peak": round(load_peak, 3),
    }
    if total_macs:
        dominant = max(macs, key=macs.__getitem__)
        peak = peak_macs(dominant, arch, core.cpu)
        row.update({"mac_instruction": mnemonic(dominant), "macs_per_cycle": round(total_macs / model.cycles, 3),
                    "mac_peak": round(peak, 3), "mac_fraction": round(total_macs / model.cycles / peak, 3),
                    "gflops": round(2 * total_macs / model.cycles * core.ghz, 1)})
    fractions = {"macs": row.get("mac_fraction", 0.0), "loads": row["load_fraction"]}
    row["bound"] = max(fractions, key=fractions.__getitem__)
    row["fraction"] = fractions[row["bound"]]
    # Well short of the resource bound: the loop waits on a dependency chain.
    row["limit"] = "latency" if model.cycles > 1.15 * model.block_rthroughput else model.bottleneck
    return row


def measure(arch: str, cores: Sequence[Core], work: Path) -> list[dict[str, object]]:
    database = json.loads(configure(arch, work / arch / "cmake").read_text())
    rows = []
    for source in kernel_sources(database, paths.REPO):
        asm = assemble(source, paths.REPO, work / arch / "asm" / (source.file.replace("/", "_") + ".s"))
        loops = hot_loops(asm, arch)
        names = demangle(loop.function for loop in loops)
        for core in cores:
            if source.level in core.levels:
                rows += [figure(loop, short_name(names[loop.function]), source, core) for loop in loops]
    return rows


# --- reporting ------------------------------------------------------------------------


def format_table(rows: Sequence[dict[str, object]]) -> str:
    lines = ["| core | level | method | kernel (loop) | insns | cycles/iter | MAC/cycle | of MAC peak "
             "| load B/cycle | of load peak | bound | limit |", "|" + "---|" * 12]
    for r in rows:
        macs = (f"{r['macs_per_cycle']:.1f} ({r['mac_instruction']})", f"{r['mac_fraction']:.0%}") \
            if "macs_per_cycle" in r else ("-", "-")
        lines.append(f"| {r['core']} | {r['level']} | {r['method']} | {r['kernel']} ({r['label']}) "
                     f"| {r['instructions']} | {r['cycles']:.2f} | {macs[0]} | {macs[1]} "
                     f"| {r['load_bytes_per_cycle']:.1f} | {r['load_fraction']:.0%} | {r['bound']} | {r['limit']} |")
    return "\n".join(lines)


def summarize(rows: Sequence[dict[str, object]]) -> list[dict[str, object]]:
    """Per core, level and method: its hot loops' best MAC/cycle and the range of their fractions of peak."""
    groups: dict[tuple, list[dict[str, object]]] = {}
    for r in rows:
        groups.setdefault((r["core"], r["level"], r["method"]), []).append(r)
    summary = []
    for (core, level, method), mine in groups.items():
        macs = [r["macs_per_cycle"] for r in mine if "macs_per_cycle" in r]
        summary.append({"core": core, "level": level, "method": method, "loops": len(mine),
                        "best_macs_per_cycle": max(macs, default=None),
                        "lowest_fraction": min(r["fraction"] for r in mine),
                        "highest_fraction": max(r["fraction"] for r in mine),
                        "lowest": min(mine, key=lambda r: r["fraction"])["kernel"]})
    return summary


def format_summary(summary: Sequence[dict[str, object]]) -> str:
    lines = ["| core | level | method | hot loops | best MAC/cycle | of peak (lowest - highest) | lowest |",
             "|" + "---|" * 7]
    for s in summary:
        best = "-" if s["best_macs_per_cycle"] is None else f"{s['best_macs_per_cycle']:.1f}"
        lines.append(f"| {s['core']} | {s['level']} | {s['method']} | {s['loops']} | {best} "
                     f"| {s['lowest_fraction']:.0%} - {s['highest_fraction']:.0%} | {s['lowest']} |")
    return "\n".join(lines)


def plot(rows: Sequence[dict[str, object]], path: Path) -> Path:
    """Per core, each hot loop's fraction of its peak (the bound one), grouped by level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cores = list(dict.fromkeys(r["core"] for r in rows))
    tallest = max(sum(1 for r in rows if r["core"] == c) for c in cores)
    fig, axes = plt.subplots(1, len(cores), figsize=(5.5 * len(cores), 0.16 * tallest + 1.5), squeeze=False)
    colours = {"macs": "tab:blue", "loads": "tab:orange"}
    for ax, core in zip(axes[0], cores):
        mine = [r for r in rows if r["core"] == core]
        ax.barh(range(len(mine)), [r["fraction"] for r in mine], color=[colours[r["bound"]] for r in mine])
        ax.set_yticks(range(len(mine)))
        ax.set_yticklabels([f"{r['level']} {r['kernel']}"[:60] for r in mine], fontsize=5)
        ax.invert_yaxis()
        ax.axvline(0.7, color="grey", linestyle=":", linewidth=1)
        ax.set_xlim(0, 1.05)
        ax.set_title(core, fontsize=9)
        ax.set_xlabel("fraction of the modelled peak (blue: MACs, orange: loads)", fontsize=7)
    fig.suptitle("hot loops under llvm-mca: steady-state throughput against the core's peak", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def compare_repeats(repeats: Sequence[Sequence[dict[str, object]]]) -> list[str]:
    """Where a repeated run modelled a loop differently from the first: empty when deterministic."""
    return determinism.differences(repeats, ("core", "level", "file", "kernel", "label"), "cycles",
                                    "cycles/iteration")


def ensure_llvm_mca() -> str:
    if shutil.which(LLVM_MCA):
        return LLVM_MCA
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SystemExit(f"{LLVM_MCA} is not installed; run as root: apt-get install -y {LLVM_PACKAGE}")
    from harness.setup import host

    print(f"mca: apt-get install -y {LLVM_PACKAGE}", flush=True)
    host.apt_install([LLVM_PACKAGE])
    return LLVM_MCA


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    arches = sorted({c.arch for c in CORES})
    parser.add_argument("--arch", action="append", choices=arches, help="architecture (repeatable; default all)")
    parser.add_argument("--cores", nargs="+", choices=[c.cpu for c in CORES], help="only these cores")
    parser.add_argument("--repeat", type=int, default=1, help="runs; >1 fails on any difference")
    parser.add_argument("--out", type=Path, default=Path("bench-results") / "mca")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat takes a count >= 1")
    tool = ensure_llvm_mca()
    began = time.perf_counter()
    chosen = [c for c in CORES if (not args.arch or c.arch in args.arch) and (not args.cores or c.cpu in args.cores)]
    if not chosen:
        parser.error(f"no core of {args.arch} among {args.cores}")
    repeats = []
    for repeat in range(args.repeat):
        peak_macs.cache_clear()
        peak_load_bytes.cache_clear()
        rows = []
        for arch in dict.fromkeys(c.arch for c in chosen):
            print(f"mca: {arch}, run {repeat + 1}: compiling the kernel files, modelling their hot loops", flush=True)
            rows += measure(arch, [c for c in chosen if c.arch == arch], paths.REPO / "build" / "mca" / f"run{repeat}")
        repeats.append(rows)
    differences = compare_repeats(repeats)
    rows = repeats[0]
    version = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout
    document = {"meta": {**determinism.meta(began, args.repeat, differences), "iterations": ITERATIONS,
                         "llvm_mca": next((ln.strip() for ln in version.splitlines() if "version" in ln), ""),
                         "cores": [dataclasses.asdict(c) for c in chosen]},
                "summary": summarize(rows), "results": rows}
    text = format_table(rows) + "\n\n" + format_summary(document["summary"])
    return determinism.write_report(args.out, "mca", document, text, lambda path: plot(rows, path),
                                    f"{len(rows)} loop figures")


if __name__ == "__main__":
    sys.exit(main())
