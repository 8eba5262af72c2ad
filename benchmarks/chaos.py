"""The fault campaign of issue 15: mixed jobs under seeded faults; nothing lost, nothing
run twice, nothing wrong.

Two broker replicas (leader election over Redis or a SQLite file), one agent per region,
Redis and each broker/agent as its own host in a network namespace (real partitions,
tests/fixtures/netns.py), moto's S3 server behind a fault proxy (503 bursts, slow
responses). N jobs (sizes, teams, priorities, spot, elastic; a checkpoint every few
steps) run while faults are injected one after the other, each held, undone and timed
until the system has recovered. Checked continuously: never two attempts of one job
alive (/proc environments), never two leaders. At the end: no job lost, stuck or
failed; each job's per-step sample ids and losses equal an uninterrupted reference run;
no INTERNAL and no traceback in logs outside the processes the campaign killed.

    .venv/bin/python benchmarks/chaos.py --jobs 40 --faults 40 --seed 1
        (root for network namespaces; --no-netns runs without partitions)
    .venv/bin/python benchmarks/chaos.py --jobs 8 --no-netns --memory-every 1 --spares 1 \
        --nodes-per-region 4 --kinds node_ranks_sigkill,rank_sigkill
        (lost nodes replaced in place with spares, restored from the memory tier)

Prints progress, the faults by kind with recovery time p50/p95/max, and one summary
line; writes benchmarks/results/chaos_<store>_seed<seed>.json. Exit 0 only when every
check passed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "proto"))

from tests.fixtures.chaos.campaign import Campaign, Options, available_kinds, render  # noqa: E402
from tests.fixtures.chaos.faults import FaultKind  # noqa: E402
from tests.fixtures.netns import available  # noqa: E402


def _commit() -> str:
    """The code this report is about (a long run outlives many commits on main)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class LoadSampler:
    """The machine's 1-minute load average every 15 s during the run: recovery times stretch
    with load, so the report says how busy the 2 cores were instead of guessing."""

    def __init__(self, every_s: float = 15.0) -> None:
        self.every_s = every_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)

    def start(self) -> LoadSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(self.every_s):
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict[str, float]:
        s = self.samples or [os.getloadavg()[0]]
        return {"mean": round(sum(s) / len(s), 2), "max": round(max(s), 2), "samples": len(s)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/chaos.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=40, help="jobs to run (goal: 200)")
    p.add_argument("--faults", type=int, default=0, help="faults to inject (default: jobs)")
    p.add_argument("--seed", type=int, default=1, help="the fault schedule and job mix")
    p.add_argument("--store", choices=("redis", "redis-sentinel", "sqlite"), default="redis",
                   help="redis-sentinel: a primary, 2 replicas, 3 Sentinels (needs --no-netns)")
    p.add_argument("--regions", type=int, default=3)
    p.add_argument("--nodes-per-region", type=int, default=2)
    p.add_argument("--no-netns", action="store_true", help="no network namespaces: no partitions")
    p.add_argument("--kinds", default="", help="comma-separated fault kinds (default: all possible): "
                   + ",".join(k.value for k in FaultKind))
    p.add_argument("--api-workers", type=int, default=0,
                   help="each broker's API worker processes (--set api_workers=N; 0: one process)")
    p.add_argument("--step-sleep", type=float, default=0.3, help="seconds per training step")
    p.add_argument("--memory-every", type=int, default=0,
                   help="every job's in-memory tier (trainer option memory_every; 0 = off)")
    p.add_argument("--spares", type=int, default=0,
                   help="spare nodes per region for in-place replacement of a lost node")
    p.add_argument("--spread-outages", action="store_true",
                   help="store outages' durations evenly spaced over their whole range"
                        " (10-120 s: the shortest and the longest included)")
    p.add_argument("--work-dir", default="", help="keep the run's files here (default: a temp dir)")
    p.add_argument("--out", default="", help="JSON path (default benchmarks/results/chaos_<store>_seed<seed>.json)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    netns = not args.no_netns
    if netns and (why := available()):
        print(f"error: {why}; run as root or pass --no-netns", file=sys.stderr)
        return 2
    kinds = [FaultKind(k) for k in args.kinds.split(",") if k] or available_kinds(
        args.store, netns, opt_in=bool(args.memory_every or args.spares))
    root = Path(args.work_dir or tempfile.mkdtemp(prefix="chaos-"))
    opts = Options(root=root, seed=args.seed, jobs=args.jobs, faults=args.faults or args.jobs,
                   store=args.store, netns=netns, regions=args.regions,
                   nodes_per_region=args.nodes_per_region, kinds=kinds,
                   step_sleep_s=args.step_sleep, api_workers=args.api_workers,
                   memory_every=args.memory_every, spares=args.spares,
                   spread_outages=args.spread_outages,
                   finish_timeout_s=max(900.0, 30.0 * args.jobs),
                   say=lambda s: print(s, flush=True))
    t = time.monotonic()
    load = LoadSampler().start()
    try:
        report = Campaign(opts).run()
    finally:
        load.stop()
    report["elapsed_s"] = round(time.monotonic() - t, 1)
    report["faults_scheduled"] = opts.faults
    report["commit"] = _commit()
    report["api_workers"] = args.api_workers
    report["step_sleep_s"] = args.step_sleep
    report["spread_outages"] = args.spread_outages
    report["load_avg_1m"] = load.summary()
    report["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    report["work_dir"] = str(root)
    print(render(report))
    suffix = f"_workers{args.api_workers}" if args.api_workers else ""
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"chaos_{args.store}_seed{args.seed}{suffix}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
