"""`brokerctl`: the command line of Compute Broker.

Users: ML engineers (submit / jobs / job / watch / logs / cancel), operators
(capacity / regions / teams / plans / drain / cordon), and daemons (serve, agent).

Why argparse and not click: it is in the standard library, and its subcommand
model is enough; we only override its error path so that bad input prints one
readable line, never a usage dump or a traceback.

Rules every command follows:
* a broker error prints one red line ``error: <message>`` (plus a dim ``hint:``
  line when there is one) on stderr, exit status 2 for bad input (INVALID_ARGUMENT,
  NOT_FOUND, FAILED_PRECONDITION, ...), 1 otherwise (broker unreachable, internal);
* never a Python traceback (set BROKERCTL_DEBUG=1 to see one);
* tables fit 100 columns; ``-o json`` prints the API objects as JSON instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from brokerctl import render, render_logs
from brokersdk.client import (
    DEFAULT_ADDRESS,
    TERMINAL_PHASES,
    AlreadyExists,
    BrokerClient,
    BrokerError,
    InvalidJobSpec,
    JobSpec,
    NotFound,
    PermissionDenied,
    PreconditionFailed,
    QuotaExceeded,
    _pydantic_message,
    phase_name,
)

BAD_INPUT_ERRORS = (
    InvalidJobSpec,
    NotFound,
    AlreadyExists,
    PreconditionFailed,
    QuotaExceeded,
    PermissionDenied,
)

EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT = 0, 1, 2


class UsageError(Exception):
    """Bad command-line input (argparse or our own checks): exit 2."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


# --------------------------------------------------------------------------- helpers


def _consoles() -> tuple[Console, Console]:
    # Created per invocation so that captured stdout/stderr (tests) are honoured.
    return Console(highlight=False), Console(stderr=True, highlight=False)


def _csv(values: Sequence[str] | None) -> list[str]:
    """Flags given several times and/or comma separated: --region a,b --region c."""
    out: list[str] = []
    for v in values or []:
        out += [p.strip() for p in v.split(",") if p.strip()]
    return out


def _kv_pairs(values: Sequence[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values or []:
        if "=" not in v:
            raise UsageError(f"{flag} expects KEY=VALUE, got {v!r}")
        k, _, val = v.partition("=")
        out[k.strip()] = val
    return out


def _parse_time(value: str, now: float | None = None) -> float:
    """Epoch seconds from "now", "+2h"/"+30m"/"+45s"/"+1d", an epoch number or ISO 8601."""
    now = time.time() if now is None else now
    v = value.strip()
    if v == "now":
        return now
    if v.startswith("+"):
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
        try:
            return now + float(v[1:-1]) * units[v[-1]] if v[-1] in units else now + float(v[1:])
        except (ValueError, KeyError):
            raise UsageError(f"bad relative time {value!r} (e.g. +30m, +2h)") from None
    try:
        return float(v)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(v).timestamp()
    except ValueError:
        raise UsageError(f"bad time {value!r}: use now, +2h, epoch seconds or ISO 8601") from None


def _load_spec_file(path: str) -> dict[str, Any]:
    import yaml

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as e:
        raise UsageError(f"cannot read spec file {path}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UsageError(f"spec file {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise UsageError(f"spec file {path} must hold a mapping of job spec fields")
    return data


# --------------------------------------------------------------------------- commands


def cmd_submit(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    base = _load_spec_file(args.file) if args.file else {}
    overrides: dict[str, Any] = {}
    flag_map = {
        "name": "name",
        "team": "team",
        "priority": "priority_class",
        "nodes": "nodes",
        "gpus_per_node": "gpus_per_node",
        "accelerator": "accelerator",
        "topology_required": "topology_required",
        "topology_preferred": "topology_preferred",
        "max_price": "max_price_per_gpu_hour",
        "min_nodes": "min_nodes",
        "max_nodes": "max_nodes",
        "checkpoint_uri": "checkpoint_uri",
        "dataset_uri": "dataset_uri",
        "dataset_region": "dataset_region",
        "expected_duration": "expected_duration_s",
        "image": "image",
    }
    for flag, field in flag_map.items():
        value = getattr(args, flag)
        if value is not None:
            overrides[field] = value
    for flag, field in (
        ("allow_region", "allowed_regions"),
        ("deny_region", "denied_regions"),
        ("prefer_region", "preferred_regions"),
        ("capacity_type", "capacity_types"),
    ):
        if getattr(args, flag):
            overrides[field] = _csv(getattr(args, flag))
    if args.spot:
        overrides["spot_ok"] = True
    if args.env:
        overrides["env"] = _kv_pairs(args.env, "--env")
    if args.label:
        overrides["labels"] = _kv_pairs(args.label, "--label")
    if args.command_argv:
        overrides["command"] = list(args.command_argv)
    trainer: dict[str, Any] = {}
    for flag, field in (
        ("steps", "total_steps"),
        ("checkpoint_every", "checkpoint_every"),
        ("model", "model"),
        ("batch_size", "global_batch_size"),
        ("seed", "seed"),
        ("step_sleep", "step_sleep_s"),
    ):
        value = getattr(args, flag)
        if value is not None:
            trainer[field] = value
    if args.trainer_option:
        trainer["options"] = _kv_pairs(args.trainer_option, "--trainer-option")

    if "resources" in base or "topology" in base:  # the API's JSON form
        if overrides or trainer:
            raise UsageError(
                "flags cannot be combined with a spec file in the API's JSON form "
                "(resources: ...); use the flat form (nodes:, gpus_per_node:, ...)"
            )
        spec: Any = JobSpec.from_dict(base)
    else:
        merged = {**base, **overrides}
        if trainer:
            merged["trainer"] = {**(base.get("trainer") or {}), **trainer}
        spec = JobSpec.from_dict(merged)

    handle = client.submit(spec, client_request_id=args.request_id)
    job = handle.job
    if args.output == "json":
        out.print_json(render.to_json(job))
    else:
        verb = "submitted" if handle.created is not False else "already submitted (same request id)"
        line = Text(f"{verb} job ")
        line.append(handle.id, style="bold")
        if job is not None and job.spec.name:
            line.append(f" ({job.spec.name})")
        if job is not None:
            line.append(" — ")
            line.append_text(render.phase_text(job.phase))
            if job.pending_reason:
                line.append(f": {job.pending_reason}", style="yellow")
        out.print(line)
        if not args.wait:
            out.print(
                f"[dim]follow it: brokerctl watch {handle.id}   details: brokerctl job {handle.id}[/]"
            )
    if args.wait:
        return _watch(client, handle.id, out, include_progress=False)
    return EXIT_OK


def cmd_jobs(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    jobs = list(
        client.jobs(team=args.team or "", phases=_csv(args.phase), region=args.region or "",
                    limit=args.limit)
    )
    if args.output == "json":
        out.print_json(render.to_json(jobs))
        return EXIT_OK
    if not jobs:
        out.print("[dim]no jobs[/]")
        return EXIT_OK
    out.print(render.jobs_table(jobs))
    return EXIT_OK


def cmd_job(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    job = client.get_job(args.job_id)
    events = client.events(args.job_id)
    if args.output == "json":
        import json

        data = {
            "job": json.loads(render.to_json(job)),
            "events": json.loads(render.to_json(events)),
        }
        out.print_json(json.dumps(data))
        return EXIT_OK
    out.print(render.job_detail(job, events))
    return EXIT_OK


def cmd_migrations(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    """Recent migrations: cause (! = emergency), route, world sizes, timing breakdown."""
    migs = client.migrations(job_id=args.job or "", team=args.team or "", limit=args.limit or 0)
    if args.output == "json":
        out.print_json(render.to_json(migs))
        return EXIT_OK
    if not migs:
        out.print("no migrations yet")
        return EXIT_OK
    out.print(render.migrations_table(migs))
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    job = client.cancel(args.job_id, args.reason or "cancelled from brokerctl")
    line = Text(f"job {job.id}: ")
    line.append_text(render.phase_text(job.phase))
    if job.phase not in TERMINAL_PHASES:
        line.append(" (stopping)", style="dim")
    out.print(line)
    return EXIT_OK


def cmd_logs(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    """The ranks' own output, attempt by attempt (a separator line each)."""
    with_rank = args.rank is None
    shown = 0
    for rec in client.logs(args.job_id, follow=args.follow, rank=args.rank,
                           attempt=args.attempt, tail=args.tail):
        kind = rec.WhichOneof("kind")
        if kind == "attempt":
            with_rank = args.rank is None and rec.attempt.world_size != 1
            out.print(render_logs.attempt_separator(rec.attempt), soft_wrap=True)
        elif kind == "dropped_lines":
            out.print(render_logs.dropped(rec.dropped_lines), soft_wrap=True)
        else:
            shown += 1
            out.print(render_logs.log_line(rec.line, with_rank), soft_wrap=True)
    if not shown and not args.follow:
        out.print(f"[dim]no output from {args.job_id} yet[/]")
    return EXIT_OK


def cmd_events(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    """The job's history, one line per event with local times (``-f``: live)."""
    if args.follow:
        client.get_job(args.job_id)  # NOT_FOUND early, with the usual message
        return _watch(client, args.job_id, out, include_progress=args.progress)
    events = [e for e in client.events(args.job_id)
              if args.progress or e.type != "progress"]
    if args.output == "json":
        out.print_json(render.to_json(events))
        return EXIT_OK
    for event in events:
        out.print(render_logs.event_line(event), soft_wrap=True)
    return EXIT_OK


def _watch(client: BrokerClient, job_id: str, out: Console, include_progress: bool) -> int:
    for event in client.watch(job_id, include_progress=include_progress):
        out.print(render_logs.event_line(event), soft_wrap=True)
    job = client.get_job(job_id)
    final = Text("final: ")
    final.append_text(render.phase_text(job.phase))
    if job.message:
        final.append(f" — {job.message}")
    out.print(final)
    return EXIT_OK if job.phase in TERMINAL_PHASES and phase_name(job.phase) != "failed" else 1


def cmd_watch(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    client.get_job(args.job_id)  # NOT_FOUND early, with the usual message
    return _watch(client, args.job_id, out, include_progress=args.progress)


def cmd_capacity(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    resp = client.capacity(region=args.region or "", by_block=args.by_block,
                           include_nodes=args.nodes)
    if args.output == "json":
        out.print_json(render.to_json(resp))
        return EXIT_OK
    if not resp.rows:
        out.print("[dim]no capacity registered (no agent connected yet?)[/]")
    else:
        out.print(render.capacity_table(resp, by_block=args.by_block))
    if args.nodes and resp.nodes:
        out.print(render.nodes_table(list(resp.nodes)))
    return EXIT_OK


def cmd_regions(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    regions = client.regions()
    if args.output == "json":
        out.print_json(render.to_json(regions))
    elif not regions:
        out.print("[dim]no regions registered (start an agent: brokerctl agent ...)[/]")
    else:
        out.print(render.regions_table(regions))
    return EXIT_OK


def cmd_teams(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    if getattr(args, "teams_cmd", None) == "set":
        guaranteed: dict[str, int] = {}
        for g in _csv(args.guaranteed) or ["0"]:
            n, _, accel = g.partition(":")
            try:
                guaranteed[accel] = int(n)
            except ValueError:
                raise UsageError(f"--guaranteed expects N or N:ACCELERATOR, got {g!r}") from None
        caps = {k: int(v) for k, v in _kv_pairs(args.region_cap, "--region-cap").items()} \
            if args.region_cap else None
        quota = client.set_team_quota(
            args.team,
            cohort=args.cohort or "",
            guaranteed=guaranteed,
            borrow_limit=args.borrow_limit,
            lend_limit=args.lend_limit,
            strategy=args.strategy or 0,
            fair_share_weight=args.weight or 0.0,
            region_caps=caps,
        )
        if args.output == "json":
            out.print_json(render.to_json(quota))
        else:
            out.print(render.teams_table([quota]))
        return EXIT_OK
    if getattr(args, "teams_cmd", None) == "get":
        teams = [client.team(args.team)]
    else:
        teams = client.teams()
    if args.output == "json":
        out.print_json(render.to_json(teams))
    elif not teams:
        out.print("[dim]no teams (create one: brokerctl teams set TEAM --guaranteed 8)[/]")
    else:
        out.print(render.teams_table(teams))
    return EXIT_OK


def cmd_plans(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    sub = getattr(args, "plans_cmd", None) or "list"
    if sub == "create":
        start = _parse_time(args.start)
        if args.end:
            end = _parse_time(args.end, now=start if args.end.startswith("+") else None)
        else:
            end = _parse_time(args.duration, now=start)
        plan = client.create_plan(
            name=args.name or "",
            region=args.region,
            zone=args.zone or "",
            instance_type=args.instance_type or "",
            accelerator=args.accelerator or "",
            instance_count=args.count,
            gpus_per_instance=args.gpus_per_instance,
            start_time=start,
            end_time=end,
            team=args.team or "",
            price_per_gpu_hour=args.price or 0.0,
        )
        plans = [plan]
    elif sub == "cancel":
        plans = [client.cancel_plan(args.plan_id)]
    else:
        plans = client.plans(region=args.region or "", include_ended=args.all)
    if args.output == "json":
        out.print_json(render.to_json(plans if sub == "list" else plans[0]))
    elif not plans:
        out.print("[dim]no training plans[/]")
    else:
        out.print(render.plans_table(plans))
    return EXIT_OK


def cmd_drain(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    resp = client.drain(args.region, undrain=args.undrain, reason=args.reason or "")
    state = "draining" if resp.draining else "accepting work"
    out.print(f"region {resp.region or args.region}: [bold]{state}[/]")
    if resp.moved_job_ids:
        out.print(f"moving {len(resp.moved_job_ids)} job(s): {', '.join(resp.moved_job_ids)}")
    return EXIT_OK


def cmd_cordon(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    resp = client.cordon(args.node, uncordon=args.undo)
    state = "cordoned" if resp.cordoned else "schedulable"
    out.print(f"node {resp.node_id or args.node}: [bold]{state}[/]")
    return EXIT_OK


def cmd_serve(args: argparse.Namespace, out: Console) -> int:
    """Build a BrokerConfig from flags (and an optional YAML file) and serve until signalled."""
    from broker.config import BrokerConfig
    from broker.server import serve

    data: dict[str, Any] = {}
    if args.config:
        data.update(_load_spec_file(args.config))
    for flag, field in (
        ("listen", "listen"),
        ("store", "store"),
        ("checkpoint_root", "checkpoint_root"),
        ("scheduler_interval", "scheduler_interval_s"),
        ("heartbeat_interval", "heartbeat_interval_s"),
        ("agent_timeout", "agent_timeout_s"),
        ("metrics_listen", "metrics_listen"),
    ):
        value = getattr(args, flag)
        if value is not None:
            data[field] = value
    for key, value in _kv_pairs(args.set, "--set").items():
        data[key] = value
    known = getattr(BrokerConfig, "model_fields", None)
    if known is not None:
        unknown = sorted(k for k in data if k not in known)
        if unknown:
            raise UsageError(f"unknown broker setting(s): {', '.join(unknown)}")
    try:
        config = BrokerConfig(**data)
    except ValidationError as e:
        raise UsageError(f"bad broker configuration: {_pydantic_message(e)}") from None
    serve(config)
    return EXIT_OK


def cmd_agent(argv: list[str], broker_flag: str | None) -> int:
    """Run a region agent: everything after `agent` goes to region_agents.agent.main."""
    from region_agents.agent import main as agent_main

    if broker_flag and "--broker" not in argv and not any(a.startswith("--broker=") for a in argv):
        argv = ["--broker", broker_flag, *argv]
    rc = agent_main(argv)
    return int(rc or 0)


def cmd_demo(args: argparse.Namespace, out: Console) -> int:
    from brokerctl import demo

    return demo.run(args, console=out)


# --------------------------------------------------------------------------- parser


def build_parser() -> _Parser:
    p = _Parser(
        prog="brokerctl",
        description="Compute Broker: submit training jobs once, run them wherever capacity is.",
    )
    p.add_argument(
        "--broker",
        default=None,
        metavar="ADDR",
        help=f"broker address, or HA replicas a:1,b:2 (env BROKER_ADDRESS, default {DEFAULT_ADDRESS})",
    )
    p.add_argument("--timeout", type=float, default=10.0, help="per-call deadline in seconds")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    def add(name: str, help: str, output: bool = False, **kw: Any) -> _Parser:
        sp = sub.add_parser(name, help=help, description=help, **kw)
        if output:
            sp.add_argument("-o", "--output", choices=["table", "json"], default="table")
        return sp

    s = add("submit", "submit a training job", output=True)
    s.add_argument("-f", "--file", help="job spec YAML (flags override its fields; - = stdin)")
    s.add_argument("--name")
    s.add_argument("--team")
    s.add_argument("--priority", help="priority class, e.g. training, fine-tuning, inference")
    s.add_argument("--nodes", type=int)
    s.add_argument("--gpus-per-node", type=int)
    s.add_argument("--accelerator", help="e.g. h100 (default: any)")
    s.add_argument("--topology-required", metavar="LEVEL",
                   help="ultraserver | layer-3 | layer-2 | layer-1 | zone | region")
    s.add_argument("--topology-preferred", metavar="LEVEL")
    s.add_argument("--allow-region", action="append", metavar="R[,R]")
    s.add_argument("--deny-region", action="append", metavar="R[,R]")
    s.add_argument("--prefer-region", action="append", metavar="R[,R]")
    s.add_argument("--spot", "--spot-ok", action="store_true", help="spot capacity is acceptable")
    s.add_argument("--capacity-type", action="append", metavar="T[,T]",
                   help="on-demand | spot | training-plan | reserved")
    s.add_argument("--max-price", type=float, metavar="USD", help="max $ per GPU-hour")
    s.add_argument("--min-nodes", type=int, help="elastic: fewest nodes to resume on")
    s.add_argument("--max-nodes", type=int, help="elastic: most nodes to resume on")
    s.add_argument("--steps", type=int, help="trainer total steps")
    s.add_argument("--checkpoint-every", type=int, metavar="STEPS")
    s.add_argument("--model", help="trainer model preset (tiny, small, ...)")
    s.add_argument("--batch-size", type=int, help="global batch size")
    s.add_argument("--seed", type=int)
    s.add_argument("--step-sleep", type=float, metavar="S", help="simulated extra seconds/step")
    s.add_argument("--trainer-option", action="append", metavar="K=V")
    s.add_argument("--checkpoint-uri", help="file:///path, /abs/path or s3://bucket/prefix")
    s.add_argument("--dataset-uri")
    s.add_argument("--dataset-region")
    s.add_argument("--expected-duration", type=float, metavar="S")
    s.add_argument("--image")
    s.add_argument("--env", action="append", metavar="K=V")
    s.add_argument("--label", action="append", metavar="K=V")
    s.add_argument("--request-id", help="idempotency key (default: a new UUID)")
    s.add_argument("--wait", action="store_true", help="follow the job until it finishes")
    s.add_argument("command_argv", nargs="*", metavar="-- CMD",
                   help="custom command instead of the trainer")
    s.set_defaults(func=cmd_submit)

    s = add("jobs", "list jobs", output=True)
    s.add_argument("--team")
    s.add_argument("--phase", action="append", metavar="P[,P]", help="e.g. running,pending")
    s.add_argument("--region")
    s.add_argument("--limit", type=int, default=None)
    s.set_defaults(func=cmd_jobs)

    s = add("job", "show one job: spec, placement, progress, goodput, history", output=True)
    s.add_argument("job_id")
    s.set_defaults(func=cmd_job)

    s = add("migrations", "recent migrations (moves between capacity) with timings", output=True)
    s.add_argument("--job", help="only this job's moves")
    s.add_argument("--team")
    s.add_argument("--limit", type=int, default=None)
    s.set_defaults(func=cmd_migrations)

    s = add("cancel", "cancel a job")
    s.add_argument("job_id")
    s.add_argument("--reason")
    s.set_defaults(func=cmd_cancel)

    s = add("logs", "the ranks' stdout/stderr, attempt by attempt (-f: live)")
    s.add_argument("job_id")
    s.add_argument("-f", "--follow", action="store_true",
                   help="keep streaming (across migrations) until the job ends")
    s.add_argument("--rank", type=int, default=None, help="only this rank")
    s.add_argument("--attempt", type=int, default=None, help="only this attempt")
    s.add_argument("--tail", type=int, default=None, help="only the last N lines")
    s.set_defaults(func=cmd_logs)

    s = add("events", "a job's event history, one line each (-f: live)", output=True)
    s.add_argument("job_id")
    s.add_argument("-f", "--follow", action="store_true", help="keep going until the job ends")
    s.add_argument("--progress", action="store_true", help="also show step progress events")
    s.set_defaults(func=cmd_events)

    s = add("watch", "follow a job's events live until it finishes")
    s.add_argument("job_id")
    s.add_argument("--progress", action="store_true", help="also show step progress events")
    s.set_defaults(func=cmd_watch)

    s = add("capacity", "capacity per region / zone / pool", output=True)
    s.add_argument("--region")
    s.add_argument("--by-block", action="store_true", help="rows per layer-3 block / UltraServer")
    s.add_argument("--nodes", action="store_true", help="also list nodes")
    s.set_defaults(func=cmd_capacity)

    s = add("regions", "list regions and their agents", output=True)
    s.set_defaults(func=cmd_regions)

    s = add("teams", "list team quotas, or set one (teams set TEAM ...)", output=True)
    tsub = s.add_subparsers(dest="teams_cmd", metavar="[list|get|set]")
    tsub.add_parser("list", help="list teams")
    tg = tsub.add_parser("get", help="show one team")
    tg.add_argument("team")
    ts = tsub.add_parser("set", help="create or replace a team's quota")
    ts.add_argument("team")
    ts.add_argument("--cohort")
    ts.add_argument("--guaranteed", "--gpus", dest="guaranteed", action="append",
                    metavar="N[:ACCEL]",
                    help="guaranteed GPUs, global across regions (repeat per accelerator)")
    ts.add_argument("--borrow-limit", type=int, metavar="GPUS")
    ts.add_argument("--lend-limit", type=int, metavar="GPUS")
    ts.add_argument("--strategy", help="lend-and-borrow | lend | dont-lend")
    ts.add_argument("--weight", type=float, help="fair-share weight")
    ts.add_argument("--region-cap", action="append", metavar="REGION=GPUS")
    s.set_defaults(func=cmd_teams)

    s = add("plans", "training plans: list (default), create, cancel", output=True)
    psub = s.add_subparsers(dest="plans_cmd", metavar="[list|create|cancel]")
    pl = psub.add_parser("list", help="list plans")
    pl.add_argument("--region")
    pl.add_argument("--all", action="store_true", help="include ended / cancelled plans")
    pc = psub.add_parser("create", help="register a training plan")
    pc.add_argument("--name")
    pc.add_argument("--region", required=True)
    pc.add_argument("--zone")
    pc.add_argument("--instance-type")
    pc.add_argument("--accelerator")
    pc.add_argument("--count", type=int, required=True, help="instances")
    pc.add_argument("--gpus-per-instance", type=int, default=8)
    pc.add_argument("--start", default="now", help="now, +2h, epoch or ISO 8601")
    pc.add_argument("--end", help="+48h (after start), epoch or ISO 8601")
    pc.add_argument("--duration", default="+24h", help="if no --end: e.g. +24h")
    pc.add_argument("--team")
    pc.add_argument("--price", type=float, help="$ per GPU-hour (prepaid)")
    pcc = psub.add_parser("cancel", help="cancel a plan")
    pcc.add_argument("plan_id")
    s.set_defaults(func=cmd_plans, region=None, all=False)

    s = add("drain", "drain a region (move its jobs out), or --undrain")
    s.add_argument("region")
    s.add_argument("--undrain", action="store_true")
    s.add_argument("--reason")
    s.set_defaults(func=cmd_drain)

    s = add("cordon", "cordon a node (no new work), or --undo")
    s.add_argument("node")
    s.add_argument("--undo", action="store_true")
    s.set_defaults(func=cmd_cordon)

    s = add("serve", "run the broker (blocks until SIGINT/SIGTERM)")
    s.add_argument("--config", help="YAML file of BrokerConfig fields")
    s.add_argument("--listen", help="host:port (default 127.0.0.1:50051)")
    s.add_argument("--store", help="sqlite:///path or redis://host:port/db")
    s.add_argument("--checkpoint-root", help="default checkpoint location for jobs")
    s.add_argument("--scheduler-interval", type=float, metavar="S")
    s.add_argument("--heartbeat-interval", type=float, metavar="S")
    s.add_argument("--agent-timeout", type=float, metavar="S")
    s.add_argument("--metrics-listen", metavar="HOST:PORT",
                   help="serve Prometheus metrics on /metrics here (default off)")
    s.add_argument("--set", action="append", metavar="FIELD=VALUE", help="any BrokerConfig field")
    s.set_defaults(local=cmd_serve)

    add("agent", "run a region agent (all further arguments go to the agent; see agent --help)")

    s = add("demo", "embedded broker + 3 simulated regions + a few real training jobs")
    from brokerctl import demo

    demo.add_arguments(s)
    s.set_defaults(local=cmd_demo)
    return p


_GLOBAL_WITH_VALUE = {"--broker", "--timeout"}


def _split_agent_argv(argv: list[str]) -> tuple[list[str], list[str]] | None:
    """If the command is `agent`, return (global argv, agent argv): the agent's own
    flags must reach it untouched, so argparse never sees them."""
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok in _GLOBAL_WITH_VALUE:
            i += 2
            continue
        if tok.startswith("-"):
            i += 1
            continue
        if tok == "agent":
            return argv[:i], argv[i + 1 :]
        return None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `brokerctl`; returns the exit status (never raises on user errors)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    out, err = _consoles()
    debug = bool(os.environ.get("BROKERCTL_DEBUG"))
    address = DEFAULT_ADDRESS
    try:
        parser = build_parser()
        split = _split_agent_argv(argv)
        if split is not None:
            gargs = parser.parse_args([*split[0], "regions"])
            return cmd_agent(
                split[1], gargs.broker or os.environ.get("BROKER_ADDRESS") or DEFAULT_ADDRESS
            )
        args = parser.parse_args(argv)
        if not getattr(args, "cmd", None):
            parser.print_help()
            return EXIT_BAD_INPUT
        address = args.broker or os.environ.get("BROKER_ADDRESS") or DEFAULT_ADDRESS
        if hasattr(args, "local"):
            return args.local(args, out)
        with BrokerClient(address, timeout=args.timeout) as client:
            return args.func(args, client, out)
    except SystemExit as e:  # --help, or a delegated main() calling sys.exit
        code = e.code
        return code if isinstance(code, int) else (0 if code is None else EXIT_ERROR)
    except UsageError as e:
        _error(err, str(e))
        return EXIT_BAD_INPUT
    except BrokerError as e:
        _error(err, e.message, e.hint)
        if debug:
            traceback.print_exc()
        return EXIT_BAD_INPUT if isinstance(e, BAD_INPUT_ERRORS) else EXIT_ERROR
    except TimeoutError as e:
        _error(err, str(e))
        return EXIT_ERROR
    except KeyboardInterrupt:
        err.print("[dim]interrupted[/]")
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as e:  # last resort: one line, never a traceback (unless debugging)
        _error(err, f"unexpected {type(e).__name__}: {e}", "set BROKERCTL_DEBUG=1 for details")
        if debug:
            traceback.print_exc()
        return EXIT_ERROR


def _error(err: Console, message: str, hint: str | None = None) -> None:
    line = Text("error: ", style="bold red")
    line.append(message, style="red")
    err.print(line, soft_wrap=True)
    if hint:
        err.print(Text(f"hint: {hint}", style="dim"), soft_wrap=True)


if __name__ == "__main__":
    sys.exit(main())
