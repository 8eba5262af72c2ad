"""brokerctl's overview and readiness commands: ``status``, ``cost``, ``usage`` and
``wait-ready``."""

from __future__ import annotations

import argparse
import os
import time

from rich.console import Console

from brokerctl import cost, render, status
from brokerctl import usage as usage_view
from brokerctl.commands_jobs import my_actor
from brokerctl.common import EXIT_ERROR, EXIT_OK, UsageError, parse_duration
from brokersdk.client import BrokerClient, BrokerUnavailable
from brokersdk.usage import MAX_WINDOW_S, totals


def cmd_status(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    owner = my_actor(client) if args.mine else ""
    jobs = [j for j in client.jobs(team=args.team or "") if not owner or j.owner == owner]
    out.print(status.status_view(jobs, client.regions(), width=out.width))
    return EXIT_OK


def cmd_cost(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    """``brokerctl cost``: brokerctl/cost.py."""
    now = time.time()
    since = now - parse_duration(args.since)
    rows = cost.report(client.jobs(team=args.team or ""), args.by, since, now)
    if not rows:
        out.print(f"[dim]no jobs in the last {args.since}[/]")
        return EXIT_OK
    out.print(f"[bold]cost of the jobs live in the last {args.since}, by {args.by}[/]")
    out.print(cost.table(rows, args.by))
    return EXIT_OK


def cmd_usage(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    """``brokerctl usage --over 6h``: the broker's kept series, per team (brokerctl/usage.py)."""
    window = parse_duration(args.over)
    if not 0 < window <= MAX_WINDOW_S:  # the broker would clamp it and the title would lie
        raise UsageError(f"--over {args.over}: the broker keeps at most "
                         f"{MAX_WINDOW_S / 3600:g}h of usage; use e.g. 1h, 6h or 24h")
    series = client.usage_series(window, team=args.team or "")
    if args.output == "json":
        out.print_json(render.to_json(series))
        return EXIT_OK
    rows = totals(series)
    if not rows:
        out.print(f"[dim]no usage recorded in the last {args.over}[/]")
        return EXIT_OK
    step = f"{series.step_s / 60:g} min" if series.step_s >= 60 else f"{series.step_s:g} s"
    out.print(f"[bold]usage over the last {args.over}[/] (buckets of {step})")
    out.print("[dim]queued and GPUs: now (peak, average); spend: now, and over the window[/]")
    out.print(usage_view.table(series, rows, trend=out.width >= 100))
    return EXIT_OK


def cmd_wait_ready(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    """Block until the broker answers an authenticated call (and ``--regions`` N regions
    are connected), so a script that just started ``brokerctl serve &`` does not race it.
    Connection errors are retried until ``--wait-timeout``; anything else (a refused
    token, a wrong CA) is final at once: waiting would not fix it."""
    deadline = time.monotonic() + args.wait_timeout
    client.retries = 0  # this loop is the retry; each try is one quick call
    last = "no answer yet"
    ready_file = getattr(args, "ready_file", None)
    if ready_file:  # the broker's own word first (broker/ready_file.py), then the API's
        while not os.path.exists(ready_file):
            if time.monotonic() >= deadline:
                out.print(f"[red]not ready after {args.wait_timeout:g}s: {ready_file} was not"
                          " written (is `brokerctl serve --ready-file` running?)[/]")
                return EXIT_ERROR
            time.sleep(0.1)
    while True:
        try:
            connected = sum(r.connected for r in client.regions())
            if connected >= args.regions:
                out.print(f"broker ready at {client.address}"
                          + (f", {connected} region(s) connected" if args.regions else ""))
                return EXIT_OK
            last = f"{connected}/{args.regions} region(s) connected"
        except BrokerUnavailable as e:  # not up yet (or its store is not): try again
            last = e.message
        if time.monotonic() >= deadline:
            out.print(f"[red]not ready after {args.wait_timeout:g}s: {last}[/]")
            return EXIT_ERROR
        time.sleep(0.25)
