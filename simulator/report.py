"""Human outputs of a simulator run: Markdown tables and PNG plots.

Why PNGs from the result JSON only (not from the live simulation): the committed figures
can be regenerated from the committed JSON, and what is plotted is what is recorded.

Why these styles: colours are colour-blind safe (Okabe-Ito for policies, Paul Tol's
"muted" set for causes), ours is the one thick line, baselines are solid, our ablations
dashed; legends sit outside the data; a policy whose tail would flatten the others is
cut and labelled with its value; 150 dpi.
"""

from __future__ import annotations

from pathlib import Path

OURS = "ours"
BASELINE = "skypilot-failover"  # the strongest baseline: the goal is stated against it
# Okabe-Ito, by policy; ours in vermillion (drawn thick and last, on top)
POLICY_COLOURS = {
    "ours": "#D55E00", "skypilot-failover": "#0072B2", "kueue-region": "#56B4E9",
    "static-quota": "#000000", "single-region-fifo": "#E69F00", "ours-no-migration": "#CC79A7",
    "ours-no-topology": "#009E73", "ours-no-defrag": "#999999", "ours-better-capacity": "#F0E442",
    "ours-no-gain-rule": "#332288",  # Paul Tol indigo: Okabe-Ito has no ninth colour
}
# Paul Tol "muted" (+ black): one colour per cause of lost time, the same in every figure
CAUSE_COLOURS = ("#CC6677", "#332288", "#DDCC77", "#117733", "#88CCEE", "#882255", "#44AA99",
                 "#999933", "#AA4499", "#DDDDDD", "#000000", "#6699CC")
DPI = 150


def _h(s: float) -> str:
    return f"{s / 3600:.2f}"


def _ok(result: dict) -> dict:
    """The policies whose run completed (a failed one carries only its error)."""
    return {n: m for n, m in result["policies"].items() if "error" not in m}


def _causes(result: dict) -> list[str]:
    return sorted({c for m in _ok(result).values() for c in m["lost_gpu_h"]})


def goal(result: dict) -> dict | None:
    """Ours against the strongest baseline, as the goal states it: mean JCT >= 10 % below,
    p99 JCT no worse, goodput >= 95 %, no team's mean JCT > 10 % worse."""
    pols = _ok(result)
    if OURS not in pols or BASELINE not in pols:
        return None
    o, b = pols[OURS], pols[BASELINE]
    teams = {t: o["per_team"][t]["jct_s"]["mean"] / b["per_team"][t]["jct_s"]["mean"] - 1
             for t in o["per_team"] if t in b["per_team"] and b["per_team"][t]["jct_s"]["mean"] > 0}
    worst = max(teams.items(), key=lambda kv: kv[1], default=("", 0.0))
    mean_gain = 1 - o["jct_s"]["mean"] / b["jct_s"]["mean"] if b["jct_s"]["mean"] else 0.0
    p99 = o["jct_s"]["p99"] / b["jct_s"]["p99"] - 1 if b["jct_s"]["p99"] else 0.0
    return {"mean_jct_below_baseline": round(mean_gain, 4), "p99_jct_vs_baseline": round(p99, 4),
            "goodput": o["goodput"], "worst_team": worst[0], "worst_team_vs_baseline": round(worst[1], 4),
            "met": {"mean_jct": mean_gain >= 0.10, "p99_jct": p99 <= 0.0, "goodput": o["goodput"] >= 0.95,
                    "teams": worst[1] <= 0.10}}


def markdown(result: dict, timing: dict) -> str:
    tr = result["trace"]
    pols = _ok(result)
    lines = [
        f"# Fleet simulator: {result['scenario']['name']}",
        "",
        f"Trace `{tr['file']}` ({tr['jobs']} jobs, sha256 {tr['sha256'][:12]}...), seed {result['seed']}.",
        "Times in hours. Wait counts every interval a job spent queued (re-queues included).",
        "",
        "| policy | util | goodput | JCT mean | JCT p50 | JCT p99 | wait mean | wait p99 | preempt"
        " | preempt/job p99 | preempt/job max | migr | lost GPU-h | cost $k | Jain | unplaced | CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in pols.items():
        t = timing.get(name, {})
        pj = m.get("preemptions_per_job", {})
        label = f"**{name}**" if name == OURS else name
        lines.append(
            f"| {label} | {m['utilisation']:.3f} | {m['goodput']:.3f} | {_h(m['jct_s']['mean'])}"
            f" | {_h(m['jct_s']['p50'])} | {_h(m['jct_s']['p99'])} | {_h(m['queue_wait_s']['mean'])}"
            f" | {_h(m['queue_wait_s']['p99'])} | {m['preemptions']} | {pj.get('p99', 0):.0f} | {pj.get('max', 0):.0f}"
            f" | {m['migrations']} | {m['lost_gpu_h_total']:.0f} | {m['cost_usd_total'] / 1000:.1f}"
            f" | {m['fairness']['jain_index']:.3f} | {len(m.get('unplaceable', ()))} | {t.get('cpu_s', 0):.1f} |")
    failed = {n: m["error"] for n, m in result["policies"].items() if "error" in m}
    for n, e in failed.items():
        lines += ["", f"`{n}` did not complete: {e}"]
    g = goal(result)
    if g:
        ok = lambda b: "met" if b else "**not met**"  # noqa: E731
        lines += ["", f"Goal, ours against `{BASELINE}`:", "",
                  "| criterion | value | |", "|---|---:|---|",
                  f"| mean JCT at least 10 % below | {g['mean_jct_below_baseline'] * 100:.1f} % below"
                  f" | {ok(g['met']['mean_jct'])} |",
                  f"| p99 JCT no worse | {g['p99_jct_vs_baseline'] * 100:+.1f} % | {ok(g['met']['p99_jct'])} |",
                  f"| goodput at least 95 % | {g['goodput'] * 100:.1f} % | {ok(g['met']['goodput'])} |",
                  f"| no team's mean JCT more than 10 % worse | worst: {g['worst_team']}"
                  f" {g['worst_team_vs_baseline'] * 100:+.1f} % | {ok(g['met']['teams'])} |"]
    teams = sorted({t for m in pols.values() for t in m["per_team"]})
    if teams:
        lines += ["", "Per team: mean / p99 JCT (h)", "",
                  "| policy | " + " | ".join(teams) + " |", "|---|" + "---:|" * len(teams)]
        for name, m in pols.items():
            pt = m["per_team"]
            lines.append(f"| {name} | " + " | ".join(
                f"{_h(pt[t]['jct_s']['mean'])} / {_h(pt[t]['jct_s']['p99'])}" if t in pt else "-" for t in teams)
                + " |")
        lines += ["", "Per team: mean / p99 wait (h)", "",
                  "| policy | " + " | ".join(teams) + " |", "|---|" + "---:|" * len(teams)]
        for name, m in pols.items():
            pt = m["per_team"]
            lines.append(f"| {name} | " + " | ".join(
                f"{_h(pt[t]['queue_wait_s']['mean'])} / {_h(pt[t]['queue_wait_s']['p99'])}" if t in pt else "-"
                for t in teams) + " |")
    lines += ["", "Lost GPU-hours by cause:", "",
              "| policy | " + " | ".join(_causes(result)) + " |",
              "|---|" + "---:|" * len(_causes(result))]
    for name, m in pols.items():
        lines.append(f"| {name} | " + " | ".join(f"{m['lost_gpu_h'].get(c, 0.0):.0f}" for c in _causes(result)) + " |")
    lines += ["", "Cost by capacity type ($):", "", "| policy | on-demand | spot | plan (prepaid) |",
              "|---|---:|---:|---:|"]
    for name, m in pols.items():
        c = m["cost_usd"]
        lines.append(f"| {name} | {c['on_demand']:.0f} | {c['spot']:.0f} | {c['plan']:.0f} |")
    unplaced = [(n, u) for n, m in pols.items() for u in m.get("unplaceable", ())]
    if unplaced:
        lines += ["", "Jobs no state of the fleet could run (left out of JCT and wait):", ""]
        lines += [f"- `{n}`: job {u['job']} (team {u['team']}, {u['gpus']} GPUs): {u['reason']}"
                  for n, u in unplaced]
    lines += ["", "Policies:", ""]
    for name, m in result["policies"].items():
        lines.append(f"- `{name}` (recovery policy `{m['recovery_policy']}`): {m['summary']}")
    return "\n".join(lines) + "\n"


def _style(name: str) -> dict:
    ours = name == OURS
    return {"color": POLICY_COLOURS.get(name, "#777777"), "linewidth": 2.4 if ours else 1.1,
            "linestyle": "--" if name.startswith("ours-") else "-", "zorder": 10 if ours else 2,
            "label": name}


def _order(pols: dict) -> list[str]:
    """Baselines first, ablations next, ours last (drawn on top)."""
    return sorted(pols, key=lambda n: (n == OURS, n.startswith("ours-"), n))


def _legend_right(ax, **kw) -> None:  # noqa: ANN001, ANN003
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False, **kw)


def plots(result: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pols = _ok(result)
    names = _order(pols)
    files = []

    # 1. utilisation over time per region (one panel per region, a line per policy)
    regions = [r["name"] for r in result["scenario"]["regions"]]
    fig, axes = plt.subplots(len(regions), 1, figsize=(9, 1.7 * len(regions) + 0.8), sharex=True, squeeze=False)
    for ax, reg in zip(axes[:, 0], regions, strict=True):
        for name in names:
            m = pols[name]
            xs = [s["t"] / 86400 for s in m["samples"]]
            ys = [s["used"][reg] / s["capacity"][reg] if s["capacity"][reg] else 0.0 for s in m["samples"]]
            ax.plot(xs, ys, **_style(name))
        ax.set_ylabel(f"{reg}\nused / present", fontsize=8)
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    axes[0, 0].set_title("GPU utilisation per region (6-hourly samples)", fontsize=10)
    axes[-1, 0].set_xlabel("day of the trace")
    _legend_right(axes[0, 0])
    files.append(_save(fig, out / "utilisation.png"))

    # 2. JCT CDF per policy (log x: hours to weeks)
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for name in names:
        ax.plot([max(x, 60.0) / 3600 for x in pols[name]["jct_cdf_s"]], [q / 100 for q in range(101)],
                **_style(name))
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs done")
    ax.set_title("JCT CDF (left and high is better)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    _legend_right(ax)
    files.append(_save(fig, out / "jct_cdf.png"))

    # 3. queue length over time
    fig, ax = plt.subplots(figsize=(9, 3.6))
    for name in names:
        m = pols[name]
        ax.plot([s["t"] / 86400 for s in m["samples"]], [s["queued"] for s in m["samples"]], **_style(name))
    ax.set_yscale("symlog", linthresh=10)
    ax.set_xlabel("day of the trace")
    ax.set_ylabel("jobs queued (symlog)")
    ax.set_title("Queue length (6-hourly samples)", fontsize=10)
    ax.grid(alpha=0.3)
    _legend_right(ax)
    files.append(_save(fig, out / "queue.png"))

    # 4. lost GPU-hours by cause per policy: horizontal stacked bars, one colour per cause;
    # an axis cut at 1.3x the second largest total (a longer bar is labelled with its value)
    causes = _causes(result)
    colour = {c: CAUSE_COLOURS[i % len(CAUSE_COLOURS)] for i, c in enumerate(causes)}
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 1.6))
    totals = [pols[n]["lost_gpu_h_total"] for n in names]
    cut = sorted(totals)[-2] * 1.3 if len(totals) > 1 and sorted(totals)[-2] > 0 else max(totals, default=1) or 1
    left = [0.0] * len(names)
    for c in causes:
        vals = [pols[n]["lost_gpu_h"].get(c, 0.0) for n in names]
        ax.barh(range(len(names)), vals, left=left, label=c, color=colour[c], edgecolor="white", linewidth=0.4)
        left = [a + v for a, v in zip(left, vals, strict=True)]
    for i, tot in enumerate(totals):
        if tot > cut:
            ax.text(cut * 0.99, i, f"{tot:,.0f} →", ha="right", va="center", fontsize=7, color="white",
                    fontweight="bold")
    ax.set_xlim(0, cut)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    for lbl in ax.get_yticklabels():
        if lbl.get_text() == OURS:
            lbl.set_fontweight("bold")
    ax.set_xlabel("lost GPU-hours" + (" (axis cut; longer bars labelled)" if max(totals, default=0) > cut else ""))
    ax.set_title("Lost GPU time by cause", fontsize=10)
    ax.grid(alpha=0.3, axis="x")
    _legend_right(ax, title="cause")
    files.append(_save(fig, out / "lost_by_cause.png"))

    # 5. per team: mean JCT per policy, one small panel per team (linear from 0, each
    # panel its own scale: teams differ by 100x; values printed on the bars)
    teams = sorted({t for m in pols.values() for t in m["per_team"]})
    if teams:
        cols = 4
        rows = (len(teams) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(11, 2.2 * rows + 0.9), squeeze=False)
        for k, team in enumerate(teams):
            ax = axes[k // cols, k % cols]
            top = 0.0
            for i, name in enumerate(names):
                pt = pols[name]["per_team"].get(team)
                if not pt:
                    continue
                v = pt["jct_s"]["mean"] / 3600
                top = max(top, v)
                c = POLICY_COLOURS.get(name, "#777777")
                ax.bar(i, v, color=c, edgecolor="black" if name == OURS else c,
                       linewidth=1.5 if name == OURS else 0.0, label=name if k == 0 else None)
                ax.text(i, v, f"{v:.1f}", ha="center", va="bottom", fontsize=6)
            ax.set_ylim(0, top * 1.2 or 1)
            n_jobs = next((pols[n]["per_team"][team]["jct_s"]["n"] for n in names if team in pols[n]["per_team"]), 0)
            ax.set_title(f"team {team} ({n_jobs} jobs)", fontsize=8)
            ax.set_xticks([])
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3, axis="y")
        for k in range(len(teams), rows * cols):
            axes[k // cols, k % cols].axis("off")
        for r in range(rows):
            axes[r, 0].set_ylabel("mean JCT (h)", fontsize=8)
        fig.suptitle("Mean JCT per team and policy (p99 per team: results.md)", fontsize=10)
        handles, labels = axes[0, 0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), fontsize=7, frameon=False,
                   bbox_to_anchor=(0.5, 0.0))
        fig.tight_layout(rect=(0, 0.05 + 0.03 * (len(labels) > 5), 1, 0.96))
        files.append(_save(fig, out / "per_team.png", layout=False))
    return files


def _save(fig, path: Path, layout: bool = True) -> Path:  # noqa: ANN001
    if layout:
        fig.tight_layout()
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
