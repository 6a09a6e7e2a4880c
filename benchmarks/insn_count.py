"""A deterministic speed figure without the hardware: guest instructions per op call under QEMU.

Each ISA level runs benchmarks/insn_worker.py once, in the target's test image
with the built wheel installed, under QEMU user mode with a TCG plugin that
counts executed instructions (docker/qemu-plugin: Debian's qemu-user and a
plugin built against the qemu-plugin.h of its own source package). aarch64:
one run per CPU model of the target table (a64fx = neon, neoverse-n1 = dotprod,
max = i8mm). x86_64: the levels QEMU's TCG can run (it has no AVX-512), forced
with MOE_XARCH_ISA. One guest thread, a fixed hash seed and seeded inputs make
the counts deterministic: `--repeat 2` runs every level twice and fails if any
count differs.

Figures per (level, shape, method, M): instructions per call, per weight byte
the call reads (the active experts' weights) and per multiply-accumulate.
Table, JSON and PNG go to bench-results/insn/.

    python -m benchmarks.insn_count --arch aarch64                    # ~10 min on 2 cores
    python -m benchmarks.insn_count --arch aarch64 --shapes qwen3-30b-a3b --methods int8 --repeat 2
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks import determinism
from harness.building import build
from harness.common import console, paths, project
from harness.plan import targets
from harness.plan.levels import up_to
from harness.setup import containers, host, images

PLUGIN_DIR = paths.DOCKER / "qemu-plugin"
BUNDLE = "/opt/qemu-plugin"  # where the plugin image keeps the bundle, and where runs mount it
# TCG (QEMU 7.2) runs x86 code up to AVX2; an AVX-512 level would die with SIGILL.
X86_TOP = "avx2"
EMULATOR = {"aarch64": "qemu-aarch64", "x86_64": "qemu-x86_64"}
# M = 1 (decode) and a prefill M; fp8's kernels take minutes of emulation per prefill call.
DEFAULT_TOKENS = [1, 32]
DEFAULT_DECODE_ONLY = ["fp8"]
RUN_TIMEOUT_SECONDS = 30 * 60
# A fixed seed for the guest's random bytes, and a reserved guest address space, in
# which QEMU places every mapping itself: the same addresses whatever the host's
# ASLR does (allocations at other addresses take other copy paths: counts differ).
DETERMINISTIC = "-seed 0 -R 0x800000000"


@dataclasses.dataclass(frozen=True)
class Level:
    arch: str
    cpu: str  # the QEMU CPU model
    isa: str  # the kernel path the run must report

    @property
    def name(self) -> str:
        return f"{self.arch}-{self.cpu}-{self.isa}"

    def env(self) -> dict[str, str]:
        """x86 CPU models do not select the level (max has AVX2 only): the variable does."""
        return {"MOE_XARCH_ISA": self.isa} if self.arch == "x86_64" else {}


def planned_levels(target: object) -> list[Level]:
    if target.runner == "qemu":
        return [Level(target.arch, model.name, model.isa) for model in target.cpu_models]
    return [Level(target.arch, "max", level) for level in up_to(targets.ARCHES[target.arch].sources, X86_TOP)
            if level in target.isa_levels]


# --- the plugin bundle ----------------------------------------------------------------


def plugin_image_tag(repository: str, base_tag: str, plugin_dir: Path = PLUGIN_DIR) -> str:
    """Tagged by its inputs: the files of docker/qemu-plugin and the base image."""
    digest = hashlib.sha256(base_tag.encode())
    for path in sorted(plugin_dir.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"{repository}-qemu-plugin:{digest.hexdigest()[:16]}"


def ensure_bundle(repository: str, base_tag: str) -> Path:
    """The emulators and plugins on the host (built once into an image, copied out once)."""
    tag = plugin_image_tag(repository, base_tag)
    bundle = paths.QEMU_PLUGIN_CACHE / tag.rsplit(":", 1)[1]
    if (bundle / "VERSION").is_file():
        return bundle
    if subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode != 0:
        print(f"building {tag} (QEMU's source package, the plugins)", flush=True)
        subprocess.run(["docker", "build", "-q", f"--build-arg=BASE_IMAGE={base_tag}", "-t", tag, str(PLUGIN_DIR)],
                       check=True, env={**os.environ, "DOCKER_BUILDKIT": "0"})
    partial = bundle.with_suffix(".partial")
    subprocess.run(["rm", "-rf", str(partial)], check=True)
    partial.mkdir(parents=True)
    subprocess.run(["docker", "run", "--rm", "--network=none", f"--volume={partial}:/out", tag,
                    "cp", "-a", f"{BUNDLE}/.", "/out/"], check=True)
    partial.rename(bundle)
    return bundle


# --- one level's run ------------------------------------------------------------------


def docker_command(level: Level, *, platform: str, image: str, wheel: Path, bundle: Path, report_dir: Path,
                   worker_args: Sequence[str], name_args: Sequence[str] = ()) -> list[str]:
    env = {"OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", **level.env()}
    emulator = (f"{BUNDLE}/lib/ld-linux-x86-64.so.2 --library-path {BUNDLE}/lib {BUNDLE}/bin/{EMULATOR[level.arch]}"
                f" -cpu {level.cpu} {DETERMINISTIC} -plugin {BUNDLE}/plugins/libinsn_regions.so,out=/report/marks.txt")
    script = (f'pip install --quiet --no-index --no-deps "/wheelhouse/{wheel.name}" && '
              f'exec nice {emulator} "$(command -v python)" -m benchmarks.insn_worker "$@" --out /report/worker.json')
    return ["docker", "run", "--rm", *name_args, f"--platform={platform}", "--network=none",
            *(f"--env={k}={v}" for k, v in env.items()),
            f"--volume={paths.REPO / 'benchmarks'}:/src/benchmarks:ro", f"--volume={wheel}:/wheelhouse/{wheel.name}:ro",
            f"--volume={bundle}:{BUNDLE}:ro", f"--volume={report_dir.resolve()}:/report", "--workdir=/src", image,
            "bash", "-c", script, "insn_worker", *worker_args]


def parse_marks(text: str) -> tuple[dict[int, int], int | None]:
    """The plugin's file: `mark ID COUNT` lines and, once the process ended, `total COUNT`."""
    marks: dict[int, int] = {}
    total = None
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if len(fields) == 3 and fields[0] == "mark":
            marks[int(fields[1])] = int(fields[2])
        elif len(fields) == 2 and fields[0] == "total":
            total = int(fields[1])
        else:
            raise ValueError(f"marks line {number}: expected 'mark ID COUNT' or 'total COUNT', got {line!r}")
    return marks, total


def per_call(marks: dict[int, int], ids: Sequence[int]) -> tuple[int, int]:
    """(instructions of one call, of an empty region) from a region's three marks."""
    missing = [i for i in ids if i not in marks]
    if missing:
        raise ValueError(f"marks {missing} are missing: the worker died before them")
    first, second, third = (marks[i] for i in ids)
    empty = second - first
    return third - second - empty, empty


def figures(level: Level, worker: dict, marks: dict[int, int]) -> list[dict[str, object]]:
    rows = []
    for region in worker["regions"]:
        instructions, empty = per_call(marks, region["marks"])
        rows.append({"arch": level.arch, "cpu": level.cpu, "isa": level.isa, "isa_reported": worker["isa"],
                     "shape": region["shape"], "method": region["method"], "tokens": region["tokens"],
                     "active_experts": region["active_experts"], "weight_bytes": region["weight_bytes"],
                     "macs": region["macs"], "instructions": instructions, "region_overhead": empty,
                     "per_weight_byte": instructions / region["weight_bytes"],
                     "per_mac": instructions / region["macs"]})
    return rows


def run_level(level: Level, platform: str, image: str, wheel: Path, bundle: Path, report_dir: Path,
              worker_args: Sequence[str]) -> list[dict[str, object]]:
    report_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("marks.txt", "worker.json"):
        (report_dir / stale).unlink(missing_ok=True)

    # Named and labelled: a container outlives its docker client, so an interrupted run removes it.
    name = containers.container_name("insn", report_dir.parent.name, level.name)
    command = docker_command(level, platform=platform, image=image, wheel=wheel, bundle=bundle,
                             report_dir=report_dir, worker_args=worker_args,
                             name_args=[f"--name={name}", *containers.label_args()])
    start = time.monotonic()
    try:
        with (report_dir / "run.log").open("w") as log:
            code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=RUN_TIMEOUT_SECONDS).returncode
    finally:
        containers.remove(name)
    if code != 0:
        tail = (report_dir / "run.log").read_text().strip().splitlines()[-5:]
        raise RuntimeError(f"{level.name}: the emulated run exited with {code}:\n  " + "\n  ".join(tail))
    worker = json.loads((report_dir / "worker.json").read_text())
    if worker["isa"] != level.isa:
        raise RuntimeError(f"{level.name}: moe_xarch.isa() is {worker['isa']!r}, expected {level.isa!r}")
    marks, _ = parse_marks((report_dir / "marks.txt").read_text())
    print(f"{level.name}: {len(worker['regions'])} regions in {time.monotonic() - start:.0f} s", flush=True)
    return figures(level, worker, marks)


def compare_repeats(repeats: list[list[dict[str, object]]]) -> list[str]:
    """Where a repeated run counted differently from the first: empty when deterministic."""
    return determinism.differences(repeats, ("arch", "isa", "shape", "method", "tokens"), "instructions",
                                    "instructions")


# --- reporting ------------------------------------------------------------------------


def format_table(rows: list[dict[str, object]]) -> str:
    lines = ["| arch | cpu | isa | shape | method | M | experts | instructions/call | insn/weight byte "
             "| insn/MAC | MAC/insn |", "|" + "---|" * 11]
    for r in rows:
        lines.append(f"| {r['arch']} | {r['cpu']} | {r['isa']} | {r['shape']} | {r['method']} | {r['tokens']} "
                     f"| {r['active_experts']} | {r['instructions']:,} | {r['per_weight_byte']:.3f} "
                     f"| {r['per_mac']:.4f} | {1 / r['per_mac']:.2f} |")
    return "\n".join(lines)


def plot(rows: list[dict[str, object]], path: Path) -> Path:
    """Instructions per MAC, one panel per shape: a bar per level in each (method, M) group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    levels = list(dict.fromkeys(f"{r['arch']} {r['isa']}" for r in rows))
    fig, axes = plt.subplots(1, len(shapes), figsize=(5 * len(shapes), 3.8), squeeze=False)
    width = 0.8 / max(len(levels), 1)
    for ax, shape in zip(axes[0], shapes):
        mine = [r for r in rows if r["shape"] == shape]
        groups = list(dict.fromkeys((r["method"], r["tokens"]) for r in mine))
        for index, level in enumerate(levels):
            value = {(r["method"], r["tokens"]): r["per_mac"] for r in mine if f"{r['arch']} {r['isa']}" == level}
            xs = [g + index * width for g, group in enumerate(groups) if group in value]
            ax.bar(xs, [value[group] for group in groups if group in value], width, label=level)
        ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))])
        ax.set_xticklabels([f"{m}\nM={t}" for m, t in groups], fontsize=8)
        ax.set_yscale("log")
        ax.set_title(shape, fontsize=9)
        ax.grid(True, axis="y", which="both", alpha=0.3)
    axes[0][0].set_ylabel("guest instructions per MAC (lower is better)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8)
    fig.suptitle("fused MoE: instructions executed per call under QEMU (one thread)", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", action="append", choices=list(EMULATOR),
                        help="target architecture (repeatable; default aarch64)")
    parser.add_argument("--isa", nargs="+", help="only these ISA levels")
    parser.add_argument("--shapes", nargs="+", help="bench shapes (default: all of benchmarks/workload.py)")
    parser.add_argument("--methods", nargs="+", help="bf16 int8 fp8 int4 mxfp4 (default: all)")
    parser.add_argument("--tokens", nargs="+", type=int, default=DEFAULT_TOKENS, help="M values, decode first")
    parser.add_argument("--decode-only", nargs="*", default=DEFAULT_DECODE_ONLY,
                        help="methods measured at the first M only")
    parser.add_argument("--repeat", type=int, default=1, help="runs of every level; >1 fails on any difference")
    parser.add_argument("--jobs", type=int, default=1, help="levels emulated at once")
    parser.add_argument("--out", type=Path, default=Path("bench-results") / "insn")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.jobs < 1:
        parser.error("--repeat and --jobs take a count >= 1")
    if sorted(args.tokens) != args.tokens or args.tokens[0] < 1:
        parser.error(f"--tokens: expected M values >= 1, smallest first; got {args.tokens}")

    worker_args = ["--tokens", *map(str, args.tokens), "--decode-only", *args.decode_only]
    for option in ("shapes", "methods"):
        if getattr(args, option):
            worker_args += [f"--{option}", *getattr(args, option)]
    table = targets.load_targets(paths.PYPROJECT)
    began = time.perf_counter()
    jobs = []
    steps = console.StepLog()
    work = paths.REPO / "build" / "insn-count"
    arches = args.arch or ["aarch64"]
    with steps.step("host set-up"):
        host.prepare([table[platform.machine()], *(table[arch] for arch in arches)])
    # The emulators are this machine's programs: built on its own architecture's base image.
    host_base = images.ensure_images(table[platform.machine()], work, steps, upto="base")
    for arch in arches:
        target = table[arch]
        specs = images.ensure_images(target, work, steps, upto="test")
        wheel = build.find_wheel(paths.WHEELHOUSE, arch)
        bundle = ensure_bundle(project.NAME, host_base["base"].tag)
        levels = [lv for lv in planned_levels(target) if not args.isa or lv.isa in args.isa]
        if args.isa and not levels:
            parser.error(f"--isa: none of {args.isa} is a level of {arch} here "
                         f"({', '.join(lv.isa for lv in planned_levels(target))})")
        for repeat in range(args.repeat):
            jobs += [(repeat, level, target.platform, specs["test"].tag, wheel, bundle) for level in levels]

    def one(job: tuple) -> tuple[int, list[dict[str, object]]]:
        repeat, level, docker_platform, image, wheel, bundle = job
        return repeat, run_level(level, docker_platform, image, wheel, bundle, args.out / f"run{repeat + 1}" / level.name,
                                 worker_args)

    with ThreadPoolExecutor(args.jobs) as pool:
        done = list(pool.map(one, jobs))
    repeats = [[row for repeat, rows in done if repeat == r for row in rows] for r in range(args.repeat)]
    differences = compare_repeats(repeats)
    rows = repeats[0]
    document = {"meta": {**determinism.meta(began, args.repeat, differences),
                         "qemu": sorted({(Path(j[5]) / "VERSION").read_text().strip() for j in jobs}),
                         "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}},
                "results": rows}
    return determinism.write_report(args.out, "insn_count", document, format_table(rows),
                                    lambda path: plot(rows, path))


if __name__ == "__main__":
    sys.exit(main())
