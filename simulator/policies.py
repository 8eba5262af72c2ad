"""The scheduling policies compared, as data: what each changes in the real inputs.

Why data: every policy runs the same engine (``placement.schedule``) and the same
transitions; a policy only decides (1) the quotas and region limits the engine sees,
(2) whether the engine sees the network topology, (3) which recovery policy
(:mod:`broker.jobs.recovery`) answers interruptions, and (4) which proactive moves
(:mod:`broker.jobs.proactive`) run after a pass.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from broker.jobs.recovery import (
    POLICIES,
    RecoveryPolicy,
)


class PolicyKind(enum.StrEnum):
    OURS = "ours"
    STATIC = "static-quota"
    KUEUE = "kueue-region"
    FIFO = "single-region-fifo"
    FAILOVER = "skypilot-failover"
    NO_MIGRATION = "ours-no-migration"
    NO_TOPOLOGY = "ours-no-topology"
    NO_DEFRAG = "ours-no-defrag"
    NO_GAIN_RULE = "ours-no-gain-rule"
    BETTER_CAPACITY = "ours-better-capacity"


class Quotas(enum.Enum):
    GLOBAL = "global"  # guarantees across regions, borrowing in one cohort
    STATIC = "static"  # guarantee pinned to the home region, no borrowing
    REGION = "region"  # Kueue per region: guarantee in the home region, borrowing in its cohort
    NONE = "none"  # no quotas (FIFO with backfill in queue order)


class Proactive(enum.Enum):
    NONE = "none"
    DEFRAG = "defragment"
    BETTER = "better-capacity"


@dataclass(frozen=True)
class Policy:
    kind: PolicyKind
    quotas: Quotas
    home_only: bool  # jobs may only run in their team's home region
    topology: bool  # the engine sees UltraServers / network layers
    recovery: RecoveryPolicy
    proactive: Proactive = Proactive.NONE
    spot: bool = True  # small jobs may use spot
    rotate_region_on_failure: bool = False  # SkyPilot: next region first after a failure
    # the scenario's preempt_gain_factor applies (preempt only when it pays); off = the
    # ablation that preempts whenever the bounds allow
    gain_rule: bool = True
    summary: str = ""


_R = POLICIES
TABLE: dict[PolicyKind, Policy] = {p.kind: p for p in (
    # ours moves a waiting gang's blockers (small jobs in the block it needs) when the gang's
    # gain beats their move: without it one team's 32-GPU gangs waited 270 h on the whole
    # trace (docs/simulator.md, "What ours changed")
    Policy(PolicyKind.OURS, Quotas.GLOBAL, False, True, _R["defragment"], Proactive.DEFRAG,
           summary="global quotas with borrowing, topology-aware, checkpoint-and-move on spot/plan end/drain,"
                   " moves small jobs out of a block for a waiting gang when the gain beats the move"),
    Policy(PolicyKind.STATIC, Quotas.STATIC, True, True, _R["move-anywhere"],
           summary="each team's guarantee pinned to its home region, no borrowing"),
    Policy(PolicyKind.KUEUE, Quotas.REGION, True, True, _R["move-anywhere"],
           summary="Kueue per region: each team's guarantee in its home region, borrowing the unused"
                   " guarantees of the teams of that region (one cohort per region), no cross-region"
                   " dispatch"),
    Policy(PolicyKind.FIFO, Quotas.NONE, True, True, _R["no-migration"],
           summary="one region per team, FIFO with backfill, no quotas, no migration"),
    Policy(PolicyKind.FAILOVER, Quotas.NONE, False, True, _R["failover"], rotate_region_on_failure=True,
           summary="SkyPilot-style: any region, home first; on interruption restart from the last"
                   " periodic checkpoint in the next region, same size"),
    Policy(PolicyKind.NO_MIGRATION, Quotas.GLOBAL, False, True, _R["no-migration"],
           summary="ours, but no moves: interruptions kill and restart from the last periodic checkpoint"
                   " (so no defragmentation either)"),
    Policy(PolicyKind.NO_TOPOLOGY, Quotas.GLOBAL, False, False, _R["move-anywhere"],
           summary="ours, but the engine does not see UltraServers / network layers (so no"
                   " defragmentation either)"),
    Policy(PolicyKind.NO_DEFRAG, Quotas.GLOBAL, False, True, _R["move-anywhere"],
           summary="ours without defragmentation (the previous ours)"),
    Policy(PolicyKind.NO_GAIN_RULE, Quotas.GLOBAL, False, True, _R["defragment"], Proactive.DEFRAG,
           gain_rule=False,
           summary="ours, but a job near its stated end is preempted too (no preempt-only-when-it-pays rule)"),
    Policy(PolicyKind.BETTER_CAPACITY, Quotas.GLOBAL, False, True, _R["better-capacity"], Proactive.BETTER,
           summary="ours without defragmentation + move to free prepaid plan capacity when the saving"
                   " beats the move cost"),
)}

DEFAULT = (PolicyKind.OURS, PolicyKind.STATIC, PolicyKind.KUEUE, PolicyKind.FIFO, PolicyKind.FAILOVER,
           PolicyKind.NO_MIGRATION, PolicyKind.NO_TOPOLOGY, PolicyKind.NO_DEFRAG, PolicyKind.NO_GAIN_RULE,
           PolicyKind.BETTER_CAPACITY)


def parse(names: str) -> tuple[PolicyKind, ...]:
    """Comma-separated policy names -> kinds (clear error for an unknown one)."""
    out = []
    for n in (x.strip() for x in names.split(",")):
        if not n:
            continue
        try:
            out.append(PolicyKind(n))
        except ValueError:
            raise ValueError(f"unknown policy {n!r}; known: {', '.join(k.value for k in PolicyKind)}") from None
    return tuple(out) or DEFAULT
