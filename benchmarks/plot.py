"""The benchmark's picture: useful GFLOP/s against M, one panel per shape and method.

Each contender at the largest thread count as a solid line (moe_xarch at one
thread dashed), the memory roofline (streaming the active experts' weights, in
the same GFLOP/s units: the most a kernel bound by reading its weights can do)
and the compute roofline (torch.matmul, bf16 or fp32, the faster) as a horizontal line.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    "moe_xarch": {"color": "tab:blue", "marker": "o"},
    "sglang": {"color": "tab:orange", "marker": "s"},
    "torch": {"color": "tab:green", "marker": "^"},
    "memory_roofline": {"color": "tab:gray", "linestyle": ":", "marker": ""},
}


def plot(document: dict, path: Path) -> Path:
    results = document["results"]
    shapes = list(dict.fromkeys(r["shape"] for r in results))
    methods = list(dict.fromkeys(r["method"] for r in results))
    threads = sorted({r["threads"] for r in results})
    most = threads[-1] if threads else 1
    rooflines = {int(k): v for k, v in document["compute_roofline_gflops"].items()}
    fig, axes = plt.subplots(len(shapes), len(methods), figsize=(4.2 * len(methods), 3.4 * len(shapes)),
                             squeeze=False, sharex=True)
    for row, shape in enumerate(shapes):
        for col, method in enumerate(methods):
            ax = axes[row][col]
            mine = sorted((r for r in results if r["shape"] == shape and r["method"] == method),
                          key=lambda r: r["tokens"])
            top = [r for r in mine if r["threads"] == most]
            for name, style in STYLE.items():
                points = [(r["tokens"], r["gflops"][name]) for r in top if name in r["gflops"]]
                if points:
                    label = "memory roofline" if name == "memory_roofline" else name
                    ax.plot(*zip(*points), label=f"{label} ({most}t)", **style)
            single = [(r["tokens"], r["gflops"]["moe_xarch"]) for r in mine if r["threads"] == 1 and most != 1]
            if single:
                ax.plot(*zip(*single), label="moe_xarch (1t)", color="tab:blue", linestyle="--", marker=".")
            if most in rooflines:
                ax.axhline(rooflines[most], color="black", linestyle="-.", linewidth=1,
                           label=f"matmul roofline ({most}t)")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{shape} {method}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            if row == len(shapes) - 1:
                ax.set_xlabel("M (tokens)")
            if col == 0:
                ax.set_ylabel("useful GFLOP/s")
    handles, labels = {}, []
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in handles:
                handles[label] = handle
                labels.append(label)
    fig.legend([handles[label] for label in labels], labels, loc="lower center", ncol=min(len(labels), 6),
               fontsize=8)
    meta = document["meta"]
    fig.suptitle(f"fused MoE on {meta['cpu']} ({meta['moe_xarch_isa']}), load {meta['loadavg_start'][0]:.1f}",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
