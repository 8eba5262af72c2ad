"""`brokerctl apply -f fleet.yaml`: teams (with their quotas), priority classes and training
plans, declared.

Why declarative: operators keep the fleet's governance in a file under review, like
``kubectl apply``. The command computes a plan of changes against the broker's state,
shows it as a diff (``+`` create, ``~`` change, ``=`` unchanged, ``!`` conflict), and
applies it unless ``--dry-run``. Applying the same file twice changes nothing the
second time (every change is a put of the merged state; plans are matched by name).

Decisions as data: each entry becomes a :class:`Change` (what, how, the field diff and
the call that applies it); rendering and applying walk that list in one place.

File format (docs/contracts.md "Fleet file")::

    priority_classes:
      urgent: {value: 1000, description: on-call fixes}
      batch: 10                        # shorthand: the value alone
    teams:
      ml:
        cohort: research
        strategy: lend-and-borrow      # lend | dont-lend
        weight: 1.0
        guaranteed: 16                 # or per accelerator: {h100: 16, any: 4}
        borrow_limit: 8
        lend_limit: 4
        region_caps: {us-east-2: 8}
    plans:
      p5-week:                         # the plan's name (agents' nodes may carry it)
        region: us-west-2
        instance_type: p5.48xlarge
        accelerator: h100
        count: 4
        gpus_per_instance: 8
        start: 2026-12-01T00:00:00Z    # or now, +2h
        duration: 7d                   # or end: ...
        team: ml
        price: 2.5

A team's or priority class's listed fields are the whole truth for it (omitted ones go
back to their defaults: no description); teams, classes and plans the file does not
name are left alone (deleting a class is `brokerctl priority-classes delete`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from rich.console import Console
from rich.text import Text

from brokerctl import team_merge
from brokerctl.common import UsageError, parse_end, parse_time
from brokerctl.team_merge import TeamChanges
from brokersdk.client import BrokerClient
from brokersdk.enums import parse_strategy, plan_state_name
from computebroker.v1 import capacity_pb2

TEAM_KEYS = {"cohort", "strategy", "weight", "guaranteed", "borrow_limit", "lend_limit",
             "region_caps"}
SECTIONS = ("priority_classes", "teams", "plans")
PRIORITY_KEYS = {"value", "description"}
PLAN_KEYS = {"region", "zone", "instance_type", "accelerator", "count", "gpus_per_instance",
             "start", "end", "duration", "team", "price", "id"}


class Action(Enum):
    CREATE = "+"
    UPDATE = "~"
    UNCHANGED = "="
    CONFLICT = "!"


STYLE = {Action.CREATE: "green", Action.UPDATE: "yellow", Action.UNCHANGED: "dim",
         Action.CONFLICT: "bold red"}


@dataclass
class Change:
    kind: str
    name: str
    action: Action
    fields: list[tuple[str, Any, Any]] = field(default_factory=list)
    note: str = ""
    apply: Callable[[BrokerClient], object] | None = None


def _entries(section: Any, what: str) -> dict[str, dict[str, Any]]:
    """``{name: fields}`` from a mapping or a list of mappings with ``name:``."""
    if section is None:
        return {}
    if isinstance(section, list):
        out = {}
        for item in section:
            if not isinstance(item, dict) or not item.get("name"):
                raise UsageError(f"each of {what} needs a name: got {item!r}")
            out[str(item["name"])] = {k: v for k, v in item.items() if k != "name"}
        return out
    if isinstance(section, dict):
        for name, v in section.items():
            if not isinstance(v, dict):
                raise UsageError(f"{what}.{name} must be a mapping of fields, got {v!r}")
        return {str(k): dict(v) for k, v in section.items()}
    raise UsageError(f"{what} must be a mapping (name: fields) or a list")


def _check_keys(fields: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise UsageError(f"{where}: unknown field(s) {', '.join(unknown)}; "
                         f"allowed: {', '.join(sorted(allowed))}")


def _int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise UsageError(f"{where} must be a whole number >= 0, got {v!r}")
    return v


def team_changes(name: str, f: dict[str, Any]) -> TeamChanges:
    _check_keys(f, TEAM_KEYS, f"teams.{name}")
    g = f.get("guaranteed", 0)
    if isinstance(g, dict):
        guaranteed = {("" if str(k) in ("any", "") else str(k).lower()): _int(v, f"teams.{name}.guaranteed.{k}")
                      for k, v in g.items()}
    else:
        guaranteed = {"": _int(g, f"teams.{name}.guaranteed")}
    caps = f.get("region_caps")
    if caps is not None and not isinstance(caps, dict):
        raise UsageError(f"teams.{name}.region_caps must be a mapping REGION: GPUS")
    weight = f.get("weight", 0.0)
    if not isinstance(weight, int | float) or weight < 0:
        raise UsageError(f"teams.{name}.weight must be a number >= 0, got {weight!r}")
    return TeamChanges(
        cohort=str(f.get("cohort") or ""),
        guaranteed=guaranteed,
        borrow_limit=None if f.get("borrow_limit") is None else _int(f["borrow_limit"], f"teams.{name}.borrow_limit"),
        lend_limit=None if f.get("lend_limit") is None else _int(f["lend_limit"], f"teams.{name}.lend_limit"),
        strategy=parse_strategy(str(f["strategy"])) if f.get("strategy") else 0,
        weight=float(weight),
        region_caps={str(k): _int(v, f"teams.{name}.region_caps.{k}") for k, v in (caps or {}).items()},
        replace_entries=True,
    )


def desired_team(name: str, f: dict[str, Any]) -> capacity_pb2.TeamQuota:
    """The team exactly as the file declares it (no current state merged in: the file
    is the whole truth for a team it names, so applying it twice is a no-op)."""
    q = team_merge.merge(name, None, team_changes(name, f))
    for e in q.quotas:  # unset limits = unlimited, as the file omits them
        if f.get("borrow_limit") is None:
            e.ClearField("borrow_limit_gpus")
        if f.get("lend_limit") is None:
            e.ClearField("lend_limit_gpus")
    return q


def desired_priority_class(name: str, f: Any) -> capacity_pb2.PriorityClass:
    """The class as the file declares it: ``NAME: VALUE`` or ``NAME: {value, description}``."""
    where = f"priority_classes.{name}"
    if not isinstance(f, dict):
        f = {"value": f}
    _check_keys(f, PRIORITY_KEYS, where)
    value = f.get("value")
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{where}.value must be a whole number (higher runs first), got {value!r}")
    if not -(2**31) <= value < 2**31:
        raise UsageError(f"{where}.value {value} is out of range (a 32-bit whole number;"
                         " the broker's limit is stricter, see docs/contracts.md \"Limits\")")
    return capacity_pb2.PriorityClass(name=name, value=value,
                                      description=str(f.get("description") or ""))


def describe_priority_class(pc: capacity_pb2.PriorityClass | None) -> dict[str, Any]:
    return {} if pc is None else {"value": pc.value, "description": pc.description or None}


def _priority_sections(section: Any) -> dict[str, Any]:
    """``{name: value-or-fields}`` from a mapping or a list of mappings with ``name:``."""
    if section is None:
        return {}
    if isinstance(section, dict):
        return {str(k): v for k, v in section.items()}
    return _entries(section, "priority_classes")


def priority_class_changes(section: Any, client: BrokerClient) -> list[Change]:
    """Create (``+``) or update (``~``) each declared class; ``=`` when it matches."""
    declared = _priority_sections(section)
    if not declared:
        return []
    current = {pc.name: pc for pc in client.priority_classes()}
    out = []
    for name, f in declared.items():
        want = desired_priority_class(name, f)
        have = current.get(name)
        diff = team_merge.field_changes(describe_priority_class(have), describe_priority_class(want))
        action = Action.CREATE if have is None else Action.UPDATE if diff else Action.UNCHANGED
        out.append(Change("priority class", name, action, diff if diff else [],
                          apply=lambda c, pc=want: c.set_priority_class(pc)))
    return out


def desired_plan(name: str, f: dict[str, Any], now: float) -> tuple[capacity_pb2.TrainingPlan, bool]:
    """The plan the file declares, and whether its times are absolute (comparable)."""
    _check_keys(f, PLAN_KEYS, f"plans.{name}")
    for key in ("region", "count"):
        if f.get(key) in (None, ""):
            raise UsageError(f"plans.{name}.{key} is required")
    start_s = str(f.get("start", "now"))
    start = parse_time(start_s, now=now)
    end_s = None if f.get("end") is None else str(f["end"])
    end = parse_end(end_s, str(f.get("duration", "24h")), start)
    # Times are comparable with the live plan's when the file pins them: an absolute start
    # (then the end is absolute, or start + duration). "now"/"+2h" move on every apply.
    absolute = start_s.strip() != "now" and not start_s.strip().startswith("+")
    plan = capacity_pb2.TrainingPlan(
        id=str(f.get("id") or ""), name=name, region=str(f["region"]), zone=str(f.get("zone") or ""),
        instance_type=str(f.get("instance_type") or ""),
        accelerator=str(f.get("accelerator") or "").lower(),
        instance_count=_int(f["count"], f"plans.{name}.count"),
        gpus_per_instance=_int(f.get("gpus_per_instance", 8), f"plans.{name}.gpus_per_instance"),
        start_time=start, end_time=end, team=str(f.get("team") or ""),
        price_per_gpu_hour=float(f.get("price") or 0.0))
    return plan, absolute


def describe_plan(p: capacity_pb2.TrainingPlan, with_times: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "region": p.region, "zone": p.zone or "-", "instance_type": p.instance_type or "-",
        "accelerator": p.accelerator or "-", "count": p.instance_count,
        "gpus_per_instance": p.gpus_per_instance, "team": p.team or "shared",
        "price": f"{p.price_per_gpu_hour:.2f}",
    }
    if with_times:
        out["start"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime(p.start_time)) + "Z"
        out["end"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime(p.end_time)) + "Z"
    return out


def plan_changes(doc: dict[str, Any], client: BrokerClient, now: float | None = None) -> list[Change]:
    """What applying ``doc`` would do, against the broker's current state."""
    now = time.time() if now is None else now
    if not isinstance(doc, dict):
        raise UsageError("the fleet file must be a mapping with teams:, priority_classes:"
                         " and/or plans:")
    unknown = sorted(set(doc) - set(SECTIONS))
    if unknown:
        raise UsageError(f"unknown section(s) {', '.join(unknown)}; allowed: {', '.join(SECTIONS)}")
    # Classes first: a team's jobs may name a class the same file creates.
    changes: list[Change] = priority_class_changes(doc.get("priority_classes"), client)
    teams = _entries(doc.get("teams"), "teams")
    current_teams = {t.team: t for t in client.teams()} if teams else {}
    for name, f in teams.items():
        want = desired_team(name, f)
        have = current_teams.get(name)
        diff = team_merge.field_changes(team_merge.describe(have), team_merge.describe(want))
        if have is None:
            changes.append(Change("team", name, Action.CREATE, diff,
                                  apply=lambda c, q=want: c.set_team_quota(q)))
        elif diff:
            changes.append(Change("team", name, Action.UPDATE, diff,
                                  apply=lambda c, q=want: c.set_team_quota(q)))
        else:
            changes.append(Change("team", name, Action.UNCHANGED))
    plans = _entries(doc.get("plans"), "plans")
    live = [p for p in client.plans(include_ended=False)] if plans else []
    for name, f in plans.items():
        want, absolute = desired_plan(name, f, now)
        have = next((p for p in live if p.name == name and p.region == want.region), None)
        after = describe_plan(want, absolute)
        if have is None:
            changes.append(Change("plan", name, Action.CREATE,
                                  team_merge.field_changes({}, describe_plan(want, True)),
                                  apply=lambda c, p=want: c.create_plan(p)))
            continue
        diff = team_merge.field_changes(describe_plan(have, absolute), after)
        if not diff:
            changes.append(Change("plan", name, Action.UNCHANGED,
                                  note=f"{have.id}, {plan_state_name(have.state) or '?'}"))
        else:
            changes.append(Change(
                "plan", name, Action.CONFLICT, diff,
                note=f"training plans cannot change in place: `brokerctl plans cancel {have.id}` "
                     "and apply again"))
    return changes


def _value(v: Any) -> str:
    return "-" if v is None else str(v)


def render(changes: list[Change], out: Console) -> None:
    for ch in changes:
        head = Text(f"{ch.action.value} {ch.kind} {ch.name}", style=STYLE[ch.action])
        if ch.note:
            head.append(f"  ({ch.note})", style="dim" if ch.action != Action.CONFLICT else "red")
        out.print(head)
        if ch.action == Action.UNCHANGED:
            continue
        for key, old, new in ch.fields:
            line = Text(f"    {key}: ")
            if ch.action == Action.CREATE:
                line.append(_value(new), style="green")
            else:
                line.append(_value(old), style="red")
                line.append(" → ")
                line.append(_value(new), style="green")
            out.print(line)
    counts = {a: sum(1 for c in changes if c.action == a) for a in Action}
    out.print(f"{counts[Action.CREATE]} to create, {counts[Action.UPDATE]} to change, "
              f"{counts[Action.UNCHANGED]} unchanged"
              + (f", {counts[Action.CONFLICT]} in conflict" if counts[Action.CONFLICT] else ""))


def apply(changes: list[Change], client: BrokerClient) -> int:
    """Apply every create/update (after a conflict-free check); returns how many."""
    if any(c.action == Action.CONFLICT for c in changes):
        raise UsageError("nothing applied: resolve the conflicts above first")
    done = 0
    for c in changes:
        if c.apply is not None and c.action in (Action.CREATE, Action.UPDATE):
            c.apply(client)
            done += 1
    return done
