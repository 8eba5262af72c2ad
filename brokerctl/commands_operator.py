"""brokerctl's operator commands: capacity, regions, teams, plans, drain, cordon."""

from __future__ import annotations

import argparse

from rich.console import Console

from brokerctl import render
from brokerctl.common import (
    EXIT_OK,
    UsageError,
    csv_values,
    kv_pairs,
    parse_time,
    show_list,
)
from brokersdk.client import BrokerClient


def cmd_capacity(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    resp = client.capacity(region=args.region or "", by_block=args.by_block,
                           include_nodes=args.nodes)
    if args.output == "json":
        out.print_json(render.to_json(resp))
        return EXIT_OK
    if not resp.rows:
        out.print("[dim]no capacity registered (no agent connected yet?)[/]")
    else:
        out.print(render.capacity_table(render.scrub(resp), by_block=args.by_block))
    if args.nodes and resp.nodes:
        out.print(render.nodes_table(render.scrub(list(resp.nodes))))
    return EXIT_OK


def cmd_regions(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    return show_list(args, out, client.regions(),
                     "[dim]no regions registered (start an agent: brokerctl agent ...)[/]",
                     render.regions_table)


def cmd_teams(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    if getattr(args, "teams_cmd", None) == "set":
        guaranteed: dict[str, int] = {}
        for g in csv_values(args.guaranteed) or ["0"]:
            n, _, accel = g.partition(":")
            try:
                guaranteed[accel] = int(n)
            except ValueError:
                raise UsageError(f"--guaranteed expects N or N:ACCELERATOR, got {g!r}") from None
        caps = {k: int(v) for k, v in kv_pairs(args.region_cap, "--region-cap").items()} \
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
            out.print(render.teams_table(render.scrub([quota])))
        return EXIT_OK
    if getattr(args, "teams_cmd", None) == "get":
        teams = [client.team(args.team)]
    else:
        teams = client.teams()
    return show_list(args, out, teams,
                     "[dim]no teams (create one: brokerctl teams set TEAM --guaranteed 8)[/]",
                     render.teams_table)


def cmd_plans(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    sub = getattr(args, "plans_cmd", None) or "list"
    if sub == "create":
        start = parse_time(args.start)
        if args.end:
            end = parse_time(args.end, now=start if args.end.startswith("+") else None)
        else:
            end = parse_time(args.duration, now=start)
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
        out.print(render.plans_table(render.scrub(list(plans))))
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
