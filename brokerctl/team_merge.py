"""Merge a team's quota with the changes a command asks for, and describe the difference.

Why a module of its own: ``teams set`` used to send a whole new ``TeamQuota`` built from
the flags given, so ``teams set ml --guaranteed 8`` silently reset the cohort, the
limits and the strategy. Both ``teams set`` (flags) and ``brokerctl apply`` (a file)
now go through one pure merge (only what is given changes) and one description of
the spec fields, so what the diff shows is exactly what is sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from brokersdk.enums import strategy_name
from computebroker.v1 import capacity_pb2


@dataclass(frozen=True)
class TeamChanges:
    """What a command asks to change; ``None`` = keep the current value."""

    cohort: str | None = None
    guaranteed: dict[str, int] | None = None  # accelerator ("" = any) -> GPUs
    borrow_limit: int | None = None
    lend_limit: int | None = None
    strategy: int | None = None
    weight: float | None = None
    region_caps: dict[str, int] | None = None
    # apply -f: the file lists every accelerator entry; the ones it omits go away.
    replace_entries: bool = False


def spec_of(q: capacity_pb2.TeamQuota) -> capacity_pb2.TeamQuota:
    """Only the fields a person sets (no usage counters), entries sorted by accelerator."""
    out = capacity_pb2.TeamQuota(team=q.team, cohort=q.cohort, strategy=q.strategy,
                                 fair_share_weight=q.fair_share_weight)
    for e in sorted(q.quotas, key=lambda e: e.accelerator):
        out.quotas.add().CopyFrom(e)
    return out


def merge(team: str, current: capacity_pb2.TeamQuota | None,
          ch: TeamChanges) -> capacity_pb2.TeamQuota:
    """The quota to send: ``current`` with only the fields ``ch`` gives changed."""
    q = spec_of(current) if current is not None else capacity_pb2.TeamQuota(team=team)
    q.team = team
    if ch.cohort is not None:
        q.cohort = ch.cohort
    if ch.strategy is not None:
        q.strategy = ch.strategy
    if ch.weight is not None:
        q.fair_share_weight = ch.weight
    entries = {e.accelerator: e for e in q.quotas}
    if ch.replace_entries and ch.guaranteed is not None:
        entries = {a: e for a, e in entries.items() if a in ch.guaranteed}
    for accel, gpus in (ch.guaranteed or {}).items():
        entry = entries.get(accel)
        if entry is None:
            entry = capacity_pb2.QuotaEntry(accelerator=accel)
            entries[accel] = entry
        entry.guaranteed_gpus = int(gpus)
    if not entries:
        entries[""] = capacity_pb2.QuotaEntry(accelerator="", guaranteed_gpus=0)
    for entry in entries.values():
        if ch.borrow_limit is not None:
            entry.borrow_limit_gpus = ch.borrow_limit
        if ch.lend_limit is not None:
            entry.lend_limit_gpus = ch.lend_limit
        if ch.region_caps is not None:
            entry.ClearField("region_caps")
            for region, cap in ch.region_caps.items():
                entry.region_caps[region] = int(cap)
    del q.quotas[:]
    for accel in sorted(entries):
        q.quotas.add().CopyFrom(entries[accel])
    return q


def describe(q: capacity_pb2.TeamQuota | None) -> dict[str, Any]:
    """A flat ``{field: value}`` view of a team's spec, the unit of a diff line."""
    if q is None:
        return {}
    out: dict[str, Any] = {
        "cohort": q.cohort or "-",
        "strategy": strategy_name(q.strategy) or "lend-and-borrow",
        "weight": q.fair_share_weight or 1.0,
    }
    for e in sorted(q.quotas, key=lambda e: e.accelerator):
        key = f"guaranteed[{e.accelerator or 'any'}]"
        out[key] = e.guaranteed_gpus
        out[f"borrow-limit[{e.accelerator or 'any'}]"] = (
            e.borrow_limit_gpus if e.HasField("borrow_limit_gpus") else "unlimited")
        out[f"lend-limit[{e.accelerator or 'any'}]"] = (
            e.lend_limit_gpus if e.HasField("lend_limit_gpus") else "unlimited")
        if e.region_caps:
            out[f"region-caps[{e.accelerator or 'any'}]"] = ",".join(
                f"{r}={c}" for r, c in sorted(e.region_caps.items()))
    return out


def field_changes(before: dict[str, Any], after: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(field, old, new)`` for each field that differs (``None`` = absent)."""
    keys = list(dict.fromkeys([*before, *after]))
    return [(k, before.get(k), after.get(k)) for k in keys if before.get(k) != after.get(k)]
