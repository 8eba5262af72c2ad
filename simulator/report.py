"""Human outputs of a simulator run: a Markdown table and four small PNG plots.

Why PNGs from the result JSON only (not from the live simulation): the committed figures
can be regenerated from the committed JSON, and what is plotted is what is recorded.
"""

from __future__ import annotations

from pathlib import Path


def _h(s: float) -> str:
    return f"{s / 3600:.2f}"


def markdown(result: dict, timing: dict) -> str:
    tr = result["trace"]
    lines = [
        f"# Fleet simulator: {result['scenario']['name']}",
        "",
        f"Trace `{tr['file']}` ({tr['jobs']} jobs, sha256 {tr['sha256'][:12]}...), seed {result['seed']}.",
        "",
        "| policy | util | goodput | JCT mean h | JCT p50 h | JCT p99 h | wait mean h | wait p99 h"
        " | preempt | migr | lost GPU-h | cost $k | Jain | CPU s | events/CPU-s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in _ok(result).items():
        t = timing.get(name, {})
        lines.append(
            f"| {name} | {m['utilisation']:.3f} | {m['goodput']:.3f} | {_h(m['jct_s']['mean'])}"
            f" | {_h(m['jct_s']['p50'])} | {_h(m['jct_s']['p99'])} | {_h(m['queue_wait_s']['mean'])}"
            f" | {_h(m['queue_wait_s']['p99'])} | {m['preemptions']} | {m['migrations']}"
            f" | {m['lost_gpu_h_total']:.0f} | {m['cost_usd_total'] / 1000:.1f} | {m['fairness']['jain_index']:.3f}"
            f" | {t.get('cpu_s', 0):.1f} | {t.get('events_per_cpu_s', 0):.0f} |")
    lines += ["", "Lost GPU-hours by cause:", "",
              "| policy | " + " | ".join(_causes(result)) + " |",
              "|---|" + "---:|" * len(_causes(result))]
    for name, m in _ok(result).items():
        lines.append(f"| {name} | " + " | ".join(f"{m['lost_gpu_h'].get(c, 0.0):.0f}" for c in _causes(result)) + " |")
    lines += ["", "Cost by capacity type ($):", "", "| policy | on-demand | spot | plan (prepaid) |",
              "|---|---:|---:|---:|"]
    for name, m in _ok(result).items():
        c = m["cost_usd"]
        lines.append(f"| {name} | {c['on_demand']:.0f} | {c['spot']:.0f} | {c['plan']:.0f} |")
    lines += ["", "Policies:", ""]
    for name, m in _ok(result).items():
        lines.append(f"- `{name}` (recovery policy `{m['recovery_policy']}`): {m['summary']}")
    return "\n".join(lines) + "\n"


def _ok(result: dict) -> dict:
    """The policies whose run completed (a failed one carries only its error)."""
    return {n: m for n, m in result["policies"].items() if "error" not in m}


def _causes(result: dict) -> list[str]:
    return sorted({c for m in _ok(result).values() for c in m["lost_gpu_h"]})


def plots(result: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pols = _ok(result)
    files = []
    kw = {"dpi": 80}

    # 1. utilisation over time per region (one panel per region, a line per policy)
    regions = [r["name"] for r in result["scenario"]["regions"]]
    fig, axes = plt.subplots(len(regions), 1, figsize=(8, 1.8 * len(regions) + 0.6), sharex=True)
    axes = axes if len(regions) > 1 else [axes]
    for ax, reg in zip(axes, regions, strict=True):
        for name, m in pols.items():
            xs = [s["t"] / 86400 for s in m["samples"]]
            ys = [s["used"][reg] / s["capacity"][reg] if s["capacity"][reg] else 0.0 for s in m["samples"]]
            ax.plot(xs, ys, label=name, linewidth=0.8)
        ax.set_ylabel(reg, fontsize=8)
        ax.set_ylim(0, 1.05)
    axes[0].set_title("GPU utilisation per region (6-hourly)", fontsize=9)
    axes[-1].set_xlabel("day")
    axes[0].legend(fontsize=6, ncol=4, loc="lower left")
    files.append(_save(fig, out / "utilisation.png", kw))

    # 2. JCT CDF per policy
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, m in pols.items():
        ax.plot([max(x, 1.0) / 3600 for x in m["jct_cdf_s"]], [q / 100 for q in range(101)], label=name,
                linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h, log)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF", fontsize=9)
    ax.legend(fontsize=6)
    files.append(_save(fig, out / "jct_cdf.png", kw))

    # 3. queue length over time
    fig, ax = plt.subplots(figsize=(8, 3))
    for name, m in pols.items():
        ax.plot([s["t"] / 86400 for s in m["samples"]], [s["queued"] for s in m["samples"]], label=name,
                linewidth=0.8)
    ax.set_yscale("symlog")
    ax.set_xlabel("day")
    ax.set_ylabel("jobs queued")
    ax.set_title("Queue length (6-hourly)", fontsize=9)
    ax.legend(fontsize=6, ncol=4)
    files.append(_save(fig, out / "queue.png", kw))

    # 4. lost GPU-hours by cause per policy (stacked bars)
    causes = _causes(result)
    fig, ax = plt.subplots(figsize=(8, 3.6))
    bottom = [0.0] * len(pols)
    names = list(pols)
    for c in causes:
        vals = [pols[n]["lost_gpu_h"].get(c, 0.0) for n in names]
        ax.bar(range(len(names)), vals, bottom=bottom, label=c)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xticks(range(len(names)), names, rotation=25, ha="right", fontsize=7)
    ax.set_ylabel("lost GPU-hours")
    ax.set_title("Lost GPU time by cause", fontsize=9)
    ax.legend(fontsize=6)
    files.append(_save(fig, out / "lost_by_cause.png", kw))
    return files


def _save(fig, path: Path, kw: dict) -> Path:  # noqa: ANN001
    fig.tight_layout()
    fig.savefig(path, **kw)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
