"""brokerctl sim: replay a job trace on a simulated fleet under several policies.

Local only (no broker needed): the simulator drives the real placement engine and job
transitions in-process (simulator/engine.py). Progress per policy is a rich bar; the
result (JSON, Markdown, PNGs) goes to ``--out``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from brokerctl.common import EXIT_OK, UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, metavar="FILE",
                   help="CSV with job_id,submit_time_s,duration_s,num_gpus,gpu_type,user_or_team,status")
    p.add_argument("--scenario", required=True, metavar="FILE",
                   help="scenario YAML (e.g. simulator/scenarios/philly_3region.yaml)")
    p.add_argument("--policies", metavar="P[,P]", default="",
                   help="comma-separated; default all: ours, static-quota, kueue-region,"
                        " single-region-fifo, skypilot-failover, ours-no-migration,"
                        " ours-no-topology, ours-no-defrag, ours-no-gain-rule, ours-better-capacity")
    p.add_argument("--out", default="sim-out", metavar="DIR", help="output directory (default sim-out)")
    p.add_argument("--seed", type=int, default=1, help="random seed of failures and interruptions")
    p.add_argument("--limit-jobs", type=int, default=None, metavar="N", help="only the first N jobs")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")


def cmd_sim(args: argparse.Namespace, out: Console) -> int:
    from simulator import policies as pol
    from simulator import run as runner
    from simulator.scenario import ScenarioError
    from simulator.trace import TraceError

    try:
        kinds = pol.parse(args.policies)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.limit_jobs is not None and args.limit_jobs <= 0:
        raise UsageError("--limit-jobs must be a positive number of jobs")
    for flag, path in (("--trace", args.trace), ("--scenario", args.scenario)):
        if not Path(path).is_file():
            raise UsageError(f"{flag} {path}: no such file")
    with Progress(TextColumn("{task.description:<22}"), BarColumn(bar_width=30), TaskProgressColumn(),
                  TimeElapsedColumn(), console=out, transient=False) as bar:
        tasks = {k: bar.add_task(k.value, total=1.0) for k in kinds}

        def progress(kind: pol.PolicyKind, frac: float) -> None:
            bar.update(tasks[kind], completed=frac)

        try:
            result = runner.run(args.trace, args.scenario, policies=kinds, seed=args.seed,
                                limit=args.limit_jobs, progress=progress)
        except (ScenarioError, TraceError) as e:
            raise UsageError(str(e)) from None
    files = runner.write(result, args.out, plots=not args.no_plots)
    for t in _tables(result.result, result.timing):
        out.print(t)
    for name, m in result.result["policies"].items():
        if "error" in m:
            out.print(f"{name}: the run failed: {m['error']}", soft_wrap=True)
        for u in m.get("unplaceable", ())[:5]:
            out.print(f"{name}: job {u['job']} can never run: {u['reason']}", soft_wrap=True)
        if len(m.get("unplaceable", ())) > 5:
            out.print(f"{name}: {len(m['unplaceable']) - 5} more unplaceable job(s): see result.json",
                      soft_wrap=True)
    out.print(f"wrote {', '.join(str(f) for f in files)}", soft_wrap=True)  # whole paths in a pipe
    return EXIT_OK


def _tables(result: dict, timing: dict) -> list:
    """Two narrow tables (times; resources) rather than one wide one: each fits 80 columns,
    so a pipe (rich's 80-column default) gets every cell whole, never "JC…"."""
    from rich import box
    from rich.table import Table

    ok = {n: m for n, m in result["policies"].items() if "error" not in m}
    title = f"{result['trace']['file']}: {result['trace']['jobs']} jobs, seed {result['seed']}"

    def table(head: str, cols: tuple[str, ...]) -> Table:
        t = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), collapse_padding=True, title=head)
        t.add_column("policy", no_wrap=True)  # names are up to 20 characters: keep them whole
        for col in cols:
            t.add_column(col, justify="right", no_wrap=True)
        return t

    times = table(f"{title}: hours", ("JCT mean", "JCT p99", "wait mean", "wait p99", "preempt max"))
    for name, m in ok.items():
        times.add_row(name, f"{m['jct_s']['mean'] / 3600:.2f}", f"{m['jct_s']['p99'] / 3600:.1f}",
                      f"{m['queue_wait_s']['mean'] / 3600:.2f}", f"{m['queue_wait_s']['p99'] / 3600:.1f}",
                      f"{m.get('preemptions_per_job', {}).get('max', 0):.0f}")
    res = table("resources", ("util", "goodput", "lost GPU-h", "cost $k", "unplaced", "CPU s"))
    for name, m in ok.items():
        res.add_row(name, f"{m['utilisation']:.2f}", f"{m['goodput']:.3f}", f"{m['lost_gpu_h_total']:.0f}",
                    f"{m['cost_usd_total'] / 1000:.0f}", str(len(m.get("unplaceable", ()))),
                    f"{timing.get(name, {}).get('cpu_s', 0):.0f}")
    return [times, res]
