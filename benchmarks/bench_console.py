"""Console benchmark: the fleet page's load in a real browser with 2,000 nodes and 5,000 jobs.

A real broker (in process, SQLite, TLS and bearer tokens as in the tests), four scripted region agents that register 500 nodes
each (8 GPUs, layer-3 blocks of 16 nodes, UltraServers in the training-plan pools, some
unhealthy or cordoned), 5,000 submitted jobs (the scheduler places what fits, the rest
stay pending), `brokerctl console` as a subprocess and Debian's headless Chromium driven
by Playwright. It signs in as a person would, then loads /fleet `--repeat` times and
keeps the median of the browser's own navigation timing (request start -> load event
end; the page includes the server's two broker calls and its render). The baseline is
the same page over an empty fleet (no agents, no jobs) in the same run.

Goal: the fleet page loads in under 1 s. Writes benchmarks/results/console.json.

    .venv/bin/python benchmarks/bench_console.py [--nodes 2000] [--jobs 5000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "proto")]
RESULTS = REPO / "benchmarks" / "results" / "console.json"
REGIONS = ("us-east-2", "us-west-2", "eu-west-1", "ap-northeast-1")
TIMING_JS = """() => { const n = performance.getEntriesByType('navigation')[0];
  return {load_ms: n.loadEventEnd - n.requestStart, ttfb_ms: n.responseStart - n.requestStart,
          dom_ms: n.domContentLoadedEventEnd - n.requestStart, bytes: n.transferSize,
          cells: document.querySelectorAll('.cell[data-node]').length}; }"""


def fleet_nodes(region: str, count: int) -> list[Any]:
    """``count`` nodes of ``region``: on-demand, spot and a training-plan pool."""
    from computebroker.v1 import common_pb2 as pb

    kinds = [(pb.CAPACITY_TYPE_ON_DEMAND, "", 3.0), (pb.CAPACITY_TYPE_SPOT, "", 1.2),
             (pb.CAPACITY_TYPE_TRAINING_PLAN, f"tp-{region}", 0.0)]
    out = []
    for i in range(count):
        ctype, pool, price = kinds[i % 10 // 4] if i % 10 < 8 else kinds[2]
        out.append(pb.Node(
            id=f"{region}-n{i:04d}", region=region, zone=f"{region}a", instance_type="p5.48xlarge",
            accelerator="h100", gpus=8, healthy=i % 97 != 5, capacity_type=ctype, pool=pool,
            price_per_gpu_hour=price, network_layer_1=f"{region}-l1",
            network_layer_2=f"{region}-l2-{i // 128}", network_layer_3=f"{region}-l3-{i // 16}",
            ultraserver_id=f"{region}-us{i // 18}" if ctype == pb.CAPACITY_TYPE_TRAINING_PLAN
            else ""))
    return out


def measure(page: Any, url: str, repeat: int) -> dict[str, Any]:
    runs = []
    for _ in range(repeat):
        page.goto(url, wait_until="load")
        runs.append(page.evaluate(TIMING_JS))
    med = {k: statistics.median(r[k] for r in runs) for k in ("load_ms", "ttfb_ms", "dom_ms")}
    return {**med, "runs_load_ms": [round(r["load_ms"], 1) for r in runs],
            "bytes": runs[-1]["bytes"], "cells": runs[-1]["cells"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    from computebroker.v1 import capacity_pb2 as cpb
    from computebroker.v1 import common_pb2 as pb
    from tests.broker.harness import Broker, FakeAgent, fast_config, spec, wait_until
    from tests.console.browser import (
        ConsoleProcess,
        chromium,
        console_env,
        new_user,
        require_browser,
    )
    from tests.fixtures.pki import install

    require_browser()
    pki = install()  # TLS + tokens like the tests: a dev CA; the console gets only CB_CA
    tmp = Path(tempfile.mkdtemp(prefix="bench-console-"))
    broker = Broker(fast_config(tmp, scheduler_interval_s=1.0, agent_timeout_s=3600.0,
                                heartbeat_interval_s=30.0,
                                # the broker requires >= 3 heartbeats of idle stream
                                stream_idle_timeout_s=120.0))
    import os

    console = ConsoleProcess(broker.address, tmp / "console.log", console_env(dict(os.environ)))
    agents: list[FakeAgent] = []
    result: dict[str, Any] = {"nodes": args.nodes, "jobs": args.jobs, "repeat": args.repeat,
                              "python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        with chromium() as browser:
            page = new_user(browser).new_page()
            page.goto(console.url + "/signin")
            page.fill("#token", pki.operator_token)
            page.click("button[type=submit]")
            page.wait_for_url("**/fleet")
            base = measure(page, console.url + "/fleet", args.repeat)
            print(f"empty fleet: load {base['load_ms']:.0f} ms (median of {args.repeat})")

            broker.team("ml", gpus=args.nodes * 8 // 2)
            broker.team("nlp", gpus=args.nodes * 8 // 4)
            per = args.nodes // len(REGIONS)
            for r in REGIONS:
                agents.append(FakeAgent(broker.address, f"{r}-agent", r, fleet_nodes(r, per),
                                        heartbeat=False).connect())
            for r in REGIONS[:2]:
                broker.capacity.CordonNode(cpb.CordonNodeRequest(node_id=f"{r}-n0003"))
            t = time.perf_counter()
            for i in range(args.jobs):
                s = spec(f"bench-{i}", team="ml" if i % 3 else "nlp", nodes=1 + (i % 7 == 0),
                         gpus=8 if i % 2 else 4)
                s.capacity_types.extend([pb.CAPACITY_TYPE_ON_DEMAND, pb.CAPACITY_TYPE_SPOT])
                broker.submit(s)
                if (i + 1) % 1000 == 0:
                    print(f"  submitted {i + 1}/{args.jobs} jobs"
                          f" ({time.perf_counter() - t:.0f} s)", flush=True)

            def placed() -> int:
                regions = broker.capacity.ListRegions(cpb.ListRegionsRequest()).regions
                return sum(r.allocated_gpus for r in regions)

            last = -1

            def settled() -> bool:
                nonlocal last
                now = placed()
                done, last = now == last and now > 0, now
                print(f"  {now} GPUs allocated", flush=True)
                return done

            wait_until(settled, timeout=600, what="the scheduler to place what fits",
                       interval=3.0)
            from brokersdk.client import BrokerClient

            with BrokerClient(broker.address, timeout=60) as sdk:  # where the time goes
                rpc = {}
                for name, call in (("list_regions_ms", sdk.regions),
                                   ("get_capacity_nodes_ms",
                                    lambda: sdk.capacity(include_nodes=True))):
                    t = time.perf_counter()
                    call()
                    rpc[name] = round(1000 * (time.perf_counter() - t), 1)
            print(f"  broker calls: {rpc}")
            load_before = os.getloadavg()[0]
            full = measure(page, console.url + "/fleet", args.repeat)
            print(f"{args.nodes} nodes, {args.jobs} jobs: load {full['load_ms']:.0f} ms,"
                  f" first byte {full['ttfb_ms']:.0f} ms, {full['cells']} node cells,"
                  f" {full['bytes'] / 1e6:.2f} MB (median of {args.repeat})")
            ratio = full["load_ms"] / max(base["load_ms"], 1e-9)
            print(f"ratio vs empty fleet: {ratio:.1f}x; goal < 1000 ms:"
                  f" {'met' if full['load_ms'] < 1000 else 'NOT met'}")
            page.screenshot(path=str(tmp / "fleet.png"))
            # The machine is shared: the 1-minute load average says how busy it was.
            result.update(load_avg_1m=round(max(load_before, os.getloadavg()[0]), 1))
            print(f"  load average (1 min) while measuring: {result['load_avg_1m']}")
            result.update(baseline_empty=base, fleet=full, ratio=ratio, broker_calls=rpc,
                          allocated_gpus=last, goal_ms=1000, met=full["load_ms"] < 1000)
    finally:
        for a in agents:
            a.close()
        console.stop()
        broker.stop()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(REPO)} (screenshot {tmp / 'fleet.png'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
