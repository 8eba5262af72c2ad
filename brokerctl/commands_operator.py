"""brokerctl's operator commands: capacity, regions, teams, priority classes, plans,
drain, cordon."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from brokerctl import render, team_merge
from brokerctl.common import (
    EXIT_OK,
    UsageError,
    csv_values,
    did_you_mean,
    kv_pairs,
    parse_end,
    parse_time,
    show_list,
)
from brokerctl.team_merge import TeamChanges
from brokersdk.client import BrokerClient, NotFound
from brokersdk.enums import parse_strategy
from computebroker.v1 import capacity_pb2, common_pb2


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
        quota, changes, created = _set_team(args, client)
        if args.output == "json":
            out.print_json(render.to_json(quota))
            return EXIT_OK
        if created:
            out.print(f"team {args.team}: created")
        elif changes:
            out.print(Text(f"team {args.team}: " + "; ".join(
                f"{k} {'-' if old is None else old} → {'-' if new is None else new}"
                for k, old, new in changes)))
        else:
            out.print(f"team {args.team}: no change")
        out.print(render.teams_table(render.scrub([quota])))
        return EXIT_OK
    if getattr(args, "teams_cmd", None) == "get":
        teams = [client.team(args.team)]
    else:
        teams = client.teams()
    return show_list(args, out, teams,
                     "[dim]no teams (create one: brokerctl teams set TEAM --guaranteed 8)[/]",
                     render.teams_table)


def cmd_priority_classes(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    """``priority-classes [list|set NAME VALUE [--description D]|delete NAME]``."""
    sub = getattr(args, "pc_cmd", None) or "list"
    if sub == "set":
        before = {pc.name: pc for pc in client.priority_classes()}.get(args.name)
        pc = client.set_priority_class(args.name, args.value, args.description or "")
        if args.output == "json":
            out.print_json(render.to_json(pc))
            return EXIT_OK
        if before is None:
            out.print(f"priority class {pc.name}: created")
        else:
            diff = team_merge.field_changes(
                {"value": before.value, "description": before.description or None},
                {"value": pc.value, "description": pc.description or None})
            out.print(Text(f"priority class {pc.name}: " + ("; ".join(
                f"{k} {'-' if old is None else old} → {'-' if new is None else new}"
                for k, old, new in diff) or "no change")))
        out.print(render.priority_classes_table(render.scrub([pc])))
        return EXIT_OK
    if sub == "delete":
        client.delete_priority_class(args.name)
        out.print(f"priority class {args.name}: deleted")
        return EXIT_OK
    return show_list(args, out, client.priority_classes(), "[dim]no priority classes[/]",
                     render.priority_classes_table)


def cmd_plans(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    sub = getattr(args, "plans_cmd", None) or "list"
    if sub == "create":
        start = parse_time(args.start)
        end = parse_end(args.end, args.duration, start)
        if not args.force:
            check_plan_backing(client, args)
        plan = client.create_plan(
            id=getattr(args, "plan_id", None) or "",
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


def check_plan_backing(client: BrokerClient, args: argparse.Namespace) -> None:
    """Refuse a plan no agent node can ever be: an unknown region, or a region whose
    nodes none would bind to it (broker/scheduling/plan_binding.py's rules: pool equal
    to the plan's id or name, or an unlabelled training-plan node whose zone, instance
    type and accelerator match). Such a plan would read "active" and add nothing.
    ``--force`` registers it anyway (capacity that an agent will report later)."""
    regions = sorted(r.name for r in client.regions())
    if args.region not in regions:
        near = did_you_mean(args.region, regions)
        raise UsageError(
            f"unknown region {args.region!r}" + (f" (did you mean {near!r}?)" if near else "")
            + f"; regions with an agent: {', '.join(regions) or 'none'}"
            " (--force registers the plan anyway, for an agent that has not connected yet)")
    nodes = [u.node for u in client.capacity(region=args.region, include_nodes=True).nodes]
    keys = {k for k in (args.plan_id, args.name) if k}
    if any(n.pool in keys for n in nodes):
        return
    taken = {p.id for p in client.plans(include_ended=True)} | {
        p.name for p in client.plans(include_ended=True) if p.name}

    def adoptable(n: Any) -> bool:
        return (n.capacity_type == common_pb2.CAPACITY_TYPE_TRAINING_PLAN and n.pool not in taken
                and (not args.zone or n.zone == args.zone)
                and (not args.instance_type or n.instance_type == args.instance_type)
                and (not args.accelerator or n.accelerator.lower() == args.accelerator.lower()))

    if not any(adoptable(n) for n in nodes):
        label = f"training_plan: {args.name}" if args.name else "training_plan: NAME (with --name)"
        raise UsageError(
            f"no node in {args.region} can back this plan: none has pool {label}, and no"
            " unlabelled training-plan node matches its zone/instance type/accelerator"
            " (label the agent's plan nodes, or --force to register it before they exist)")


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


def _set_team(args: argparse.Namespace,
              client: BrokerClient) -> tuple[capacity_pb2.TeamQuota, list, bool]:
    """``teams set``: merge semantics (only the flags given change; team_merge.py)."""
    guaranteed: dict[str, int] | None = None
    if args.guaranteed:
        guaranteed = {}
        for g in csv_values(args.guaranteed):
            n, _, accel = g.partition(":")
            try:
                guaranteed[accel.strip().lower()] = int(n)
            except ValueError:
                raise UsageError(f"--guaranteed expects N or N:ACCELERATOR, got {g!r}") from None
    try:
        caps = {k: int(v) for k, v in kv_pairs(args.region_cap, "--region-cap").items()} \
            if args.region_cap else None
    except ValueError:
        raise UsageError("--region-cap expects REGION=GPUS with a whole number of GPUs") from None
    changes = TeamChanges(
        cohort=args.cohort, guaranteed=guaranteed, borrow_limit=args.borrow_limit,
        lend_limit=args.lend_limit,
        strategy=parse_strategy(args.strategy) if args.strategy else None,
        weight=args.weight, region_caps=caps,
    )
    try:
        current: capacity_pb2.TeamQuota | None = client.team(args.team)
    except NotFound:
        current = None
    desired = team_merge.merge(args.team, current, changes)
    diff = team_merge.field_changes(team_merge.describe(current), team_merge.describe(desired))
    return client.set_team_quota(desired), diff, current is None


def cmd_apply(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    """Declarative teams/quotas/plans (fleet.py): show the diff, then apply it."""
    import yaml

    from brokerctl import fleet

    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        doc = yaml.safe_load(text) or {}
    except OSError as e:
        raise UsageError(f"cannot read {args.file}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise UsageError(f"{args.file} is not valid YAML: {e}") from None
    changes = fleet.plan_changes(doc, client)
    fleet.render(changes, out)
    if args.dry_run:
        out.print("[dim]dry run: nothing applied[/]")
        return EXIT_OK
    done = fleet.apply(changes, client)
    out.print(f"applied {done} change(s)" if done else "no changes")
    return EXIT_OK
