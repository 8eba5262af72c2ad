"""Admission cache: the capacity index and running-job bookkeeping kept alive across
passes and fed by deltas (Kueue's cache feeding its per-cycle snapshot).

Why: a from-scratch pass rebuilds the capacity index (every node), the quota
ledger's usage and the victim lists (every running job) before it looks at a single
pending job. When one job arrives or one attempt ends, that rebuild is nearly all
of the pass. Here the fleet side is built once and then changed by exactly the
deltas the caller reports (:meth:`AdmissionCache.add_running`,
:meth:`~AdmissionCache.remove_running`, :meth:`~AdmissionCache.set_nodes`), so a
pass costs the pending queue plus the change, not the fleet.

Decisions are identical to ``placement.schedule`` on the equivalent snapshot
(tests/placement/test_incremental.py checks random sequences of submits, finishes
and node changes against from-scratch passes). What makes that exact:

* A pass mutates the index (admissions, holds for preempting jobs, victim
  simulations). Every change is journaled; before the next pass each touched
  node is set back to ``max(0, gpus - used)`` (the from-scratch rule) and the
  free-GPU buckets it sits in are put back in node order
  (:meth:`CapacityIndex.restore`): domain counts are sums, so bucket order is the
  only place history could survive, and best fit takes a bucket's first node.
* A node added, removed or changed (an agent's inventory update: health, a cordon)
  builds again only the capacity partitions (agent, capacity type, pool, ...) its old
  and new version belong to (:meth:`CapacityIndex.rebuild_partition`): a partition's
  slots, domains and buckets depend on its own nodes alone, so the result is the index
  a full build makes (tests/placement/test_node_deltas.py compares them). At 2,000
  nodes an agent's node health changing every few seconds rebuilt the whole index
  each time.
* What the cheap path cannot follow rebuilds the index from the kept nodes and
  running jobs through the same :func:`placement.scheduler.build_fleet`: a node
  change that makes a partition appear or vanish, or touches a training plan's nodes;
  the draining regions changing; the clock crossing a training plan's start or end
  (a node enters or leaves the usable set).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

from placement.gc_pause import gc_paused
from placement.model import Decisions, JobRequest, NodeInfo, RunningJob, Snapshot, TeamQuota
from placement.scheduler import Fleet, _by_id, _Pass, build_fleet, usable_nodes
from placement.topology import Slot, partition_key


class AdmissionCache:
    """Nodes and running jobs, known by delta; :meth:`schedule` runs one pass."""

    def __init__(self, nodes: Iterable[NodeInfo] = (), running: Iterable[RunningJob] = ()) -> None:
        self._nodes: dict[str, NodeInfo] = {n.id: n for n in nodes}
        self._running: dict[str, RunningJob] = {}
        self._used: dict[str, int] = {}  # node id -> GPUs running jobs hold on it
        self._fleet: Fleet | None = None
        self._built_at = 0.0
        self._draining: frozenset[str] = frozenset()
        self._bounds: list[float] = []  # plan starts and ends: crossing one rebuilds
        self._dirty: set[str] = set()  # nodes whose ``used`` changed since the last pass
        self._changed_nodes: set[str] = set()  # node ids added, removed or changed since
        self.rebuilds = 0  # full index builds so far (for benchmarks and tests)
        self.partition_rebuilds = 0  # partitions built again for node changes
        for r in running:
            self.add_running(r)

    # ---- deltas ------------------------------------------------------------------------

    def set_nodes(self, nodes: Iterable[NodeInfo]) -> None:
        """The fleet's nodes now (an agent registered, a node changed or went away).
        The next pass builds again only the partitions the changed nodes are in (or the
        whole index, when that cannot be exact: see the module doc)."""
        new = {n.id: n for n in nodes}
        old = self._nodes
        if new == old:
            return
        self._nodes = new
        if self._fleet is None:
            return
        changed = {i for i in old.keys() | new.keys() if old.get(i) != new.get(i)}
        if any(n is not None and (n.plan_start is not None or n.plan_end is not None)
               for i in changed for n in (old.get(i), new.get(i))):
            self._fleet = None  # a plan's window bounds the kept index (_bounds): build afresh
            return
        self._changed_nodes |= changed

    def add_running(self, r: RunningJob) -> None:
        """A job now holds GPUs (admitted, or a new copy of a running job's state)."""
        if r.id in self._running:
            self.remove_running(r.id)
        self._running[r.id] = r
        fleet = self._fleet
        for node_id, g in r.allocations:
            self._used[node_id] = self._used.get(node_id, 0) + g
            self._dirty.add(node_id)
        if fleet is not None:
            fleet.by_team.setdefault(r.team, []).append(r)
            g = fleet.rgpus[id(r)] = r.gpus
            k = (r.team, r.accelerator)
            fleet.running_by_acc[k] = fleet.running_by_acc.get(k, 0) + g

    def remove_running(self, job_id: str) -> RunningJob | None:
        """A job released its GPUs (finished, failed, stopped)."""
        r = self._running.pop(job_id, None)
        if r is None:
            return None
        for node_id, g in r.allocations:
            left = self._used.get(node_id, 0) - g
            if left:
                self._used[node_id] = left
            else:
                self._used.pop(node_id, None)
            self._dirty.add(node_id)
        fleet = self._fleet
        if fleet is not None:
            team = fleet.by_team[r.team]
            del team[next(i for i, x in enumerate(team) if x is r)]  # not __eq__ field by field
            del fleet.rgpus[id(r)]
            k = (r.team, r.accelerator)
            left = fleet.running_by_acc[k] - fleet_gpus(r)
            if left:
                fleet.running_by_acc[k] = left
            else:
                del fleet.running_by_acc[k]
        return r

    @property
    def running(self) -> dict[str, RunningJob]:
        return self._running

    @property
    def nodes(self) -> dict[str, NodeInfo]:
        return self._nodes

    # ---- one pass ------------------------------------------------------------------------

    def schedule(self, now: float, pending: Iterable[JobRequest], teams: Iterable[TeamQuota] = (),
                 draining_regions: frozenset[str] = frozenset(),
                 spares: frozenset[str] = frozenset()) -> Decisions:
        """``placement.schedule`` of the snapshot (now, the kept nodes and running
        jobs, ``pending``, ``teams``, ``draining_regions``, ``spares``), same decisions.
        The pass reads no node list but the spares' (their pending-reason note)."""
        nodes = self._nodes
        snap = Snapshot(now=now, nodes=tuple(nodes[i] for i in sorted(spares) if i in nodes), running=(),
                        pending=tuple(pending), teams=tuple(teams),
                        draining_regions=frozenset(draining_regions), spares=frozenset(spares))
        with gc_paused():
            fleet = self._ready(now, snap.draining_regions)
            return _Pass(snap, fleet).run()

    def fleet_ready(self, now: float, draining: frozenset[str] = frozenset()) -> bool:
        """True when a pass at ``now`` reuses the kept index; False when it will rebuild
        it (first pass, a node change, the draining regions or the clock crossing a
        training plan's start or end)."""
        return not (self._fleet is None or frozenset(draining) != self._draining
                    or bisect_right(self._bounds, now) != bisect_right(self._bounds, self._built_at))

    def _ready(self, now: float, draining: frozenset[str]) -> Fleet:
        fleet = self._fleet
        if fleet is None or not self.fleet_ready(now, draining):
            return self._rebuild(now, draining)
        self._undo(fleet)
        if self._changed_nodes and not self._apply_node_changes(fleet, now, draining):
            return self._rebuild(now, draining)
        return fleet

    def _apply_node_changes(self, fleet: Fleet, now: float, draining: frozenset[str]) -> bool:
        """Build again the partitions the changed nodes were or are in (after
        ``_undo``: every other slot is at its from-scratch state). False when that
        cannot give a full build's index: a partition would appear or vanish."""
        changed, self._changed_nodes = self._changed_nodes, set()
        index = fleet.index
        usable, _ = usable_nodes(sorted(self._nodes.values(), key=_by_id), self._used, now, draining)
        keys = [partition_key(n) for n, _ in usable]
        if set(keys) != {p.key for p in index.partitions}:
            return False
        was = (index.slot_by_id.get(i) for i in changed)
        affected = {partition_key(s.info) for s in was if s is not None}
        affected |= {k for (n, _), k in zip(usable, keys, strict=True) if n.id in changed}
        for key in affected:
            index.rebuild_partition([m for m, k in zip(usable, keys, strict=True) if k == key])
            self.partition_rebuilds += 1
        index.journal = []
        region_of = fleet.region_of
        for i in changed:
            n = self._nodes.get(i)
            if n is None:
                region_of.pop(i, None)
            else:
                region_of[i] = n.region
        return True

    def _rebuild(self, now: float, draining: frozenset[str]) -> Fleet:
        full = Snapshot(now=now, nodes=tuple(self._nodes.values()), running=tuple(self._running.values()),
                        pending=(), draining_regions=draining)
        fleet = build_fleet(full)
        fleet.region_of = {n.id: n.region for n in self._nodes.values()}
        fleet.index.journal = []
        fleet.future.journal = []
        self._fleet, self._built_at, self._draining = fleet, now, draining
        self._bounds = sorted({t for n in self._nodes.values() for t in (n.plan_start, n.plan_end)
                               if t is not None})
        self._dirty.clear()
        self._changed_nodes.clear()
        self.rebuilds += 1
        return fleet

    def _undo(self, fleet: Fleet) -> None:
        """Back to the from-scratch state: the last pass's changes undone, the
        running-job deltas since applied, buckets in node order."""
        index, used = fleet.index, self._used
        touched: dict[Slot, None] = dict.fromkeys(s for s, _ in index.journal or ())
        slot_of = index.slot_by_id
        for node_id in self._dirty:
            s = slot_of.get(node_id)
            if s is not None:
                touched[s] = None
        free_of = {}
        for s in touched:
            f = s.info.gpus - used.get(s.info.id, 0)
            free_of[s] = f if f > 0 else 0
        index.restore(touched, free_of)
        index.journal = []
        index.forget_found()  # a per-pass cache, as in a from-scratch pass: memory stays bounded
        future = fleet.future
        if future.journal:
            slots = dict.fromkeys(s for s, _ in future.journal)
            future.restore(slots, {s: s.info.gpus for s in slots})
            future.journal = []
        self._dirty.clear()


def fleet_gpus(r: RunningJob) -> int:
    return sum(g for _, g in r.allocations)
