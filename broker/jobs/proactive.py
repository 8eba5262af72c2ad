"""Proactive moves: which running jobs to move *without* being forced, as data.

Why a separate pure step: the recovery policy (:mod:`broker.jobs.recovery`) answers "a
trigger happened, how do we stop?"; these functions answer "should we trigger a move at
all?". Both look only at the scheduler's snapshot and its decisions, so the fleet
simulator and a broker pass can call them on the same state and get the same answer.
A :class:`Proposal` carries the :class:`~broker.jobs.recovery.Signal` to send through
the job's policy (``JobOps.trigger`` live, the simulator's agent loop in simulation).

Two rules, each gated by *gain > cost* in one currency:

* :func:`defragment` (policy ``defragment``): a large gang waits because no UltraServer /
  layer-3 block has room, while small movable jobs sit in one. Gain = the gang's GPUs x
  the time until that block would free by itself (the longest expected remaining time of
  the jobs to move); cost = each moved job's GPUs x its move time (checkpoint write +
  transfer + read + process start). Moved jobs must fit elsewhere right now.
* :func:`better_capacity` (policy ``better-capacity``): cheaper or prepaid capacity is
  free after the pass; a job paying more moves when (price difference) x GPUs x expected
  remaining time exceeds the price of its GPUs during the move.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import placement
from broker.jobs.recovery import Signal, Trigger
from placement.firstfit import allowed_types

Seconds = Callable[[placement.RunningJob], float]
# May this running job be moved by this rule (the job's own consent: its recovery policy)?
MayMove = Callable[[placement.RunningJob], bool]
# Could this running job run on this node (its accelerator, regions, capacity types)?
Fits = Callable[[placement.RunningJob, placement.NodeInfo], bool]


@dataclass(frozen=True)
class Proposal:
    job_id: str
    signal: Signal
    gain: float  # GPU-seconds (defragment) or dollars (better capacity)
    cost: float  # same unit
    message: str


def free_after(snap: placement.Snapshot, dec: placement.Decisions) -> dict[str, int]:
    """Free GPUs per usable node once this pass's admissions are launched."""
    used: dict[str, int] = defaultdict(int)
    for r in snap.running:
        for n, g in r.allocations:
            used[n] += g
    for a in dec.admissions:
        for n, g in a.assignments:
            used[n] += g
    out = {}
    for n in snap.nodes:
        if not n.healthy or n.cordoned or n.region in snap.draining_regions:
            continue
        if n.plan_end is not None and not (n.plan_start or 0.0) <= snap.now < n.plan_end:
            continue
        out[n.id] = max(0, n.gpus - used[n.id])
    return out


def _domain(n: placement.NodeInfo, level: placement.TopologyLevel) -> str:
    if level == placement.TopologyLevel.ULTRASERVER:
        return n.ultraserver
    if level == placement.TopologyLevel.LAYER_3:
        return n.layer3
    return ""


def _fits_elsewhere(jobs: list[placement.RunningJob], free: dict[str, int], outside: list[str],
                    info: dict[str, placement.NodeInfo], fits: Fits | None) -> bool:
    """Greedy: every moved job's per-node shares fit on distinct nodes outside the block
    (nodes the job could run on, when ``fits`` says which)."""
    room = {n: free[n] for n in outside}
    for r in sorted(jobs, key=lambda r: -r.gpus):
        for _, g in r.allocations:
            best = max((n for n in room if room[n] >= g and (fits is None or fits(r, info[n]))),
                       key=lambda n: room[n], default=None)
            if best is None:
                return False
            room[best] -= g
    return True


def defragment(snap: placement.Snapshot, dec: placement.Decisions, *, move_s: Seconds,
               remaining_s: Seconds, movable_gpus: int, min_gang_nodes: int = 2,
               busy: frozenset[str] = frozenset(), may_move: MayMove | None = None,
               fits: Fits | None = None) -> list[Proposal]:
    """Moves that free one block for the first waiting gang that fits nowhere (see module doc).
    ``busy``: jobs already being moved (a block is freed one move at a time). ``may_move``
    and ``fits`` (None = every job, every node: the simulator's jobs have no other
    constraints) are the live broker's: only jobs whose policy consents move, and only
    where each could run."""
    if busy:
        return []
    admitted = {a.job_id for a in dec.admissions}
    reserved = {r.job_id for r in dec.reservations}
    gang = next((j for j in snap.pending if j.nodes >= min_gang_nodes and j.id not in admitted
                 and j.id not in reserved and dec.pending_reasons.get(j.id, "").startswith("needs ")),
                None)
    if gang is None:
        return []
    level = gang.required if gang.required in (placement.TopologyLevel.ULTRASERVER,
                                               placement.TopologyLevel.LAYER_3) else gang.preferred
    if level not in (placement.TopologyLevel.ULTRASERVER, placement.TopologyLevel.LAYER_3):
        return []
    free = free_after(snap, dec)
    info = {n.id: n for n in snap.nodes}
    types = allowed_types(gang)
    eligible = [n for n in snap.nodes if n.id in free and n.capacity_type in types
                and (not gang.accelerator or n.accelerator == gang.accelerator)
                and (not gang.allowed_regions or n.region in gang.allowed_regions)
                and n.region not in gang.denied_regions and n.gpus >= gang.gpus_per_node]
    on_node: dict[str, list[placement.RunningJob]] = defaultdict(list)
    for r in snap.running:
        for n, _ in r.allocations:
            on_node[n].append(r)
    blocks: dict[tuple[str, str], list[placement.NodeInfo]] = defaultdict(list)
    for n in eligible:
        d = _domain(n, level)
        if d:
            blocks[(n.agent_id, d)].append(n)
    best: tuple[float, list[placement.RunningJob], tuple[str, ...]] | None = None
    g = gang.gpus_per_node
    for key in sorted(blocks):
        nodes = blocks[key]
        if len(nodes) < gang.nodes:
            continue
        # Per node: the jobs to move so it has g free GPUs (None = a job that may not move).
        options = []
        for n in nodes:
            if free[n.id] >= g:
                options.append((0.0, n.id, ()))
                continue
            jobs = on_node[n.id]
            ok = all(r.preemptible and not r.stopping and r.gpus <= movable_gpus
                     and r.priority <= gang.priority and len(r.allocations) == 1
                     and (may_move is None or may_move(r)) for r in jobs)
            if ok:
                options.append((sum(r.gpus * move_s(r) for r in jobs), n.id, tuple(jobs)))
        if len(options) < gang.nodes:
            continue
        options.sort(key=lambda o: (o[0], o[1]))
        chosen = options[:gang.nodes]
        moved = {r.id: r for _, _, js in chosen for r in js}
        if not moved:
            continue  # it fits already: the engine will place it
        cost = sum(r.gpus * move_s(r) for r in moved.values())
        gain = gang.gpus * max(remaining_s(r) for r in moved.values())
        block_ids = {n.id for n in nodes}
        outside = [n for n in free if n not in block_ids]
        if gain <= cost or not _fits_elsewhere(list(moved.values()), free, outside, info, fits):
            continue
        if best is None or gain - cost > best[0]:
            best = (gain - cost, sorted(moved.values(), key=lambda r: r.id), tuple(sorted(block_ids)))
    if best is None:
        return []
    _, moved_jobs, block = best
    cost_each = {r.id: r.gpus * move_s(r) for r in moved_jobs}
    gain = gang.gpus * max(remaining_s(r) for r in moved_jobs)
    return [Proposal(r.id, Signal(Trigger.DEFRAGMENT, nodes=block), gain, cost_each[r.id],
                     f"moved to free a {level.name.lower()} block for {gang.id} ({gang.gpus} GPUs):"
                     f" gain {gain:.0f} GPU-s > move cost {sum(cost_each.values()):.0f} GPU-s")
            for r in moved_jobs]


def better_capacity(snap: placement.Snapshot, dec: placement.Decisions, *, move_s: Seconds,
                    remaining_s: Seconds, max_moves: int = 4,
                    busy: frozenset[str] = frozenset(), may_move: MayMove | None = None,
                    fits: Fits | None = None) -> list[Proposal]:
    """Moves of on-demand jobs onto free prepaid (plan) capacity (see module doc);
    ``may_move`` and ``fits`` as in :func:`defragment`."""
    free = free_after(snap, dec)
    info = {n.id: n for n in snap.nodes}
    plan_free = {n: f for n, f in free.items()
                 if f > 0 and info[n].capacity_type == placement.CapacityType.TRAINING_PLAN}
    if not plan_free:
        return []
    out: list[Proposal] = []
    cands = []
    for r in snap.running:
        if r.stopping or not r.preemptible or r.id in busy or not r.allocations:
            continue
        if may_move is not None and not may_move(r):
            continue
        here = info.get(r.allocations[0][0])
        if here is None or here.capacity_type != placement.CapacityType.ON_DEMAND:
            continue
        rem = remaining_s(r)
        price = here.price_per_gpu_hour
        saving = price * r.gpus * rem / 3600.0  # plan capacity is prepaid: marginal price 0
        cost = price * r.gpus * move_s(r) / 3600.0
        if saving > cost:
            cands.append((-(saving - cost), r.id, r, rem, saving, cost))
    cands.sort(key=lambda c: (c[0], c[1]))
    plan_nodes = sorted(plan_free)
    for _, _, r, rem, saving, cost in cands:
        if len(out) >= max_moves:
            break
        need = sorted((g for _, g in r.allocations), reverse=True)
        # Cheap refusals first (same decisions: such capacity could take no share), so a
        # fleet whose free plan capacity is scattered costs comparisons, not ``fits`` calls.
        if max(plan_free.values()) < need[0] or sum(plan_free.values()) < r.gpus:
            continue
        smallest, until = need[-1], rem + move_s(r)
        by_agent: dict[str, list[str]] = defaultdict(list)
        for n in plan_nodes:
            if plan_free[n] < smallest:
                continue
            if fits is not None and not fits(r, info[n]):
                continue
            end = info[n].plan_end
            if end is not None and end - snap.now < until:
                continue  # the plan ends before the job would: no saving
            by_agent[info[n].agent_id].append(n)
        placed = None
        for agent in sorted(by_agent):
            room = {n: plan_free[n] for n in by_agent[agent]}
            take = []
            for g in need:
                n = max((n for n in room if room[n] >= g), key=lambda n: (room[n], n), default=None)
                if n is None:
                    break
                room[n] -= g
                take.append((n, g))
            if len(take) == len(need):
                placed = take
                break
        if placed is None:
            continue
        for n, g in placed:
            plan_free[n] -= g
        out.append(Proposal(r.id, Signal(Trigger.BETTER_CAPACITY, nodes=tuple(n for n, _ in r.allocations)),
                            saving, cost, f"free prepaid plan capacity: saves ${saving:.2f} over"
                                          f" {rem / 3600:.1f} h for a ${cost:.2f} move"))
    return out
