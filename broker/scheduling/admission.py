"""The live scheduler's admission cache: ``placement.incremental.AdmissionCache`` fed
by the differences between one pass's snapshot and the next.

Why: a from-scratch pass (``placement.schedule``) rebuilds the capacity index from
every node and the quota ledger's usage and victim lists from every running job
before it looks at the queue. When one job was submitted or one attempt finished,
that rebuild is most of the pass. Here the fleet side stays alive across passes
(Kueue's cache feeding its per-cycle snapshot) and is changed by exactly what
differs between consecutive snapshots.

Why diff snapshots instead of listening to events: the snapshot is already the
scheduler's whole truth for a pass (``snapshot.py``), so a delta derived from it
cannot miss a change that happened by another path (an agent lost, a node cordoned,
a job rewritten behind the applier's back, another replica scheduling while this
one lost the lease). The diff is cheap because the snapshot's parts are reused
objects (``SnapshotMemo`` for jobs, ``NodeMemo`` for nodes): an unchanged running
job or node list is the *same object* as last pass, so most comparisons are one
identity test.

One place decides: the pass is ``placement.scheduler._Pass`` either way; the cache
only avoids recomputing its fleet input, and its decisions are identical to
``placement.schedule`` on the same snapshot (tests/placement/test_incremental.py,
tests/broker/test_admission_cache.py). What it cannot follow falls back:

* a node list that differs (an agent's inventory: a node's health or cordon, nodes
  added or removed) builds again the capacity partitions of the changed nodes only
  (``set_nodes``), or the whole index when a partition appears or vanishes or a
  plan's node changed; a change of draining regions and the clock crossing a plan's
  start or end rebuild the index (``AdmissionCache`` itself);
* a snapshot it cannot represent (two running entries with one id) or any error in
  the cached path drops the cache and decides from scratch for that pass.

Counts of each (``AdmissionStats``) are logged and kept on the loop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import StrEnum

import placement
from placement.incremental import AdmissionCache

log = logging.getLogger(__name__)


class Fallback(StrEnum):
    """Why a pass was decided from scratch instead of on the cache."""

    DUPLICATE_RUNNING = "duplicate_running_id"
    ERROR = "error"


@dataclass
class AdmissionStats:
    """What the cache did so far (logs, tests, benchmarks)."""

    passes: int = 0
    index_rebuilds: int = 0  # the capacity index built from every node (first pass included)
    partition_rebuilds: int = 0  # partitions built again for changed nodes (not the whole index)
    running_changes: int = 0  # running entries added, replaced or removed by delta
    from_scratch: dict[Fallback, int] = field(default_factory=dict)


class LiveAdmission:
    """Decide a snapshot's pass on a kept-alive ``AdmissionCache``."""

    def __init__(self, verify: bool = False) -> None:
        """``verify``: also run ``placement.schedule`` on every snapshot and record any
        difference in ``mismatches`` (tests; doubles the cost of a pass)."""
        self._cache: AdmissionCache | None = None
        self._nodes: tuple[placement.NodeInfo, ...] | None = None
        self._running: dict[str, placement.RunningJob] = {}
        self.verify = verify
        self.mismatches: list[str] = []
        self.stats = AdmissionStats()

    def decide(self, snap: placement.Snapshot) -> placement.Decisions:
        """``placement.schedule(snap)``, computed on the cache when it can be."""
        self.stats.passes += 1
        try:
            cache = self._feed(snap)
            decisions = None
            if cache is not None:
                built, parts = cache.rebuilds, cache.partition_rebuilds
                decisions = cache.schedule(snap.now, snap.pending, snap.teams, snap.draining_regions,
                                           snap.spares)
                self._count(cache, built, parts, len(snap.nodes))
        except Exception:  # noqa: BLE001 - a cache bug must cost speed, never a decision
            log.exception("admission cache failed; this pass is decided from scratch")
            decisions = None
            self._fallback(Fallback.ERROR)
        if decisions is None:
            return placement.schedule(snap)
        if self.verify:
            want = placement.schedule(snap)
            if decisions != want:
                self.mismatches.append(f"pass {self.stats.passes}: cached decisions differ from scratch")
                log.error("admission cache decided differently from a from-scratch pass")
        return decisions

    def _fallback(self, why: Fallback) -> None:
        self.stats.from_scratch[why] = self.stats.from_scratch.get(why, 0) + 1
        log.warning("admission cache dropped (%s): this pass is decided from scratch", why.value)
        self.reset()

    def reset(self) -> None:
        """Forget everything: the next pass builds the cache afresh."""
        self._cache = None
        self._nodes = None
        self._running = {}

    def _feed(self, snap: placement.Snapshot) -> AdmissionCache | None:
        """The cache brought to ``snap``'s nodes and running jobs (None: cannot be)."""
        running = {r.id: r for r in snap.running}
        if len(running) != len(snap.running):
            self._fallback(Fallback.DUPLICATE_RUNNING)
            return None
        cache = self._cache
        if cache is None:
            cache = self._cache = AdmissionCache(snap.nodes, snap.running)
        else:
            if snap.nodes is not self._nodes:
                cache.set_nodes(snap.nodes)  # rebuilds the index only if a node differs
            old = self._running
            changes = 0
            for rid, r in running.items():
                o = old.get(rid)
                if o is not r and o != r:
                    cache.add_running(r)  # replaces an older copy of the same job
                    changes += 1
            for rid in old.keys() - running.keys():
                cache.remove_running(rid)
                changes += 1
            self.stats.running_changes += changes
        self._nodes = snap.nodes
        self._running = running
        return cache

    def _count(self, cache: AdmissionCache, built: int, parts: int, nodes: int) -> None:
        """What the pass just did to the index (stats, and a log line for a full build)."""
        if cache.rebuilds > built:
            self.stats.index_rebuilds += cache.rebuilds - built
            log.info("admission cache: capacity index rebuilt from %d nodes (rebuild %d)",
                     nodes, cache.rebuilds)
        self.stats.partition_rebuilds += cache.partition_rebuilds - parts
