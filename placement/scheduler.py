"""The placement decision engine the broker calls: ``schedule(snapshot) -> Decisions``.

Pure and deterministic: no I/O, no clock, no randomness; inputs are put in a
canonical order first (nodes and running jobs by id, pending jobs by priority,
submit time, id), so a shuffled snapshot gives the same decisions.

One pass, Kueue-style:

1. **Guaranteed phase.** Pending jobs in priority order whose team stays within
   its guarantee are tried first (Kueue puts non-borrowing workloads first).
   If one cannot be placed, it may *reclaim*: preempt borrowing jobs of other
   teams in its cohort (and, second choice, lower-priority jobs of its own team).
2. **Borrowing phase, fair share.** The remaining jobs need borrowed quota. They
   are served team by team in order of the team's current weighted borrowed
   share (borrowed GPUs / weight, lowest first; for a single resource this is
   DRF), each team's jobs in priority order; the share is re-evaluated after
   every admission, so one large borrower cannot starve the others.
   A job whose team's quota is full may preempt lower-priority jobs of its own
   team.
3. **Surplus.** Jobs still pending *for quota* are tried once more, in the same
   fair-share order as phase 2, now also borrowing the usable capacity no guarantee covers
   (``QuotaLedger.lend_surplus``: capacity minus the sum of the guarantees).
   Placement only, no preemption. Why: when the fleet outgrows the guarantees (a
   training plan running) those GPUs belonged to no one and stayed idle while a
   bursting team queued; the fleet simulator measured 12.5 h mean wait for one
   team's 1-GPU jobs that SkyPilot-style failover ran in under an hour.

A job whose admission needs preemptions is *not* admitted in the same pass: the
engine emits the Preemptions, holds the free part of the chosen nodes for it
for the rest of the pass, and leaves it pending ("waiting for N preempted jobs
to checkpoint"). Next pass, once the broker suspended the victims, it fits.

Victims: already-stopping jobs first (free soon, cost nothing), then borrowers
before own-team jobs, then lowest priority, then (reclaims) the team furthest above
its guarantee first (borrowed GPUs / weight, Kueue's fair-sharing preemption; in the
fleet simulator it cut preemptions by 18-31 % on three scenarios against taking the
cheapest job of any borrower), then least work lost
(GPU-seconds since the last durable checkpoint + restart_cost_s x GPUs), then
largest first (fewer victims). Victims are added until a simulated placement
succeeds, then the unneeded ones are dropped in reverse order (Kueue's
minimisation), so only victims that actually let the job place are chosen.

Placement of one job (see ``placement.topology``):

* Eligible capacity: accelerator, allowed/denied regions, draining regions,
  capacity types (SPOT only when the job lists it; empty = anything but spot),
  max price (training plans are prepaid, so the cap does not apply), excluded
  nodes, healthy and uncordoned nodes, plan windows (below).
* Ranking (lexicographic): ``preferred`` topology met, when possible anywhere;
  capacity tier (active training plan, prepaid < spot < on-demand/reserved);
  data locality (no egress when the cluster is in ``dataset_region``);
  preferred-region rank; then tightest domain (one node, one UltraServer, one
  layer-3 block, ... one cluster) and price; best fit inside a level.
  ``required`` is a hard limit. A team's optional ``region_caps`` remove the
  regions where it would exceed its ceiling.
* Elastic jobs (0 < min_nodes < nodes): the full size first, else the largest
  size in [min_nodes, nodes) that fits quota and capacity.

Training plans: a plan node is used only inside [plan_start, plan_end), and only
by a job whose next safe point (min of checkpoint_interval_s and
expected_duration_s; one hour when neither is known) falls before plan_end.
A scheduled plan is future capacity: a gang that fits nowhere now gets a
Reservation on the plan's nodes at plan_start. Plan nodes marked
``available_before_plan`` are backfilled before the start only with work whose
next safe point falls before plan_start.

Cost: one pass is O(jobs x partitions x domains-per-level) with failed shapes
cached (capacity only shrinks during a pass, so a shape that failed fails
again), and at most ``MAX_PREEMPTION_SEARCHES`` victim simulations per pass.

Over 400 lines on purpose: it is one pure algorithm (two phases, victim search and
minimisation, plan reservations) whose steps share the pass state (``_Pass``), and its
decisions are pinned by golden digests (tests/placement/test_perf_equivalence.py), so it
reads best top to bottom in one place; the capacity index is ``topology.py``.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import defaultdict
from dataclasses import dataclass
from operator import attrgetter, itemgetter

from placement.firstfit import accepts, allowed_types
from placement.gc_pause import gc_paused
from placement.model import (
    Admission,
    CapacityType,
    Decisions,
    JobRequest,
    NodeInfo,
    Preemption,
    Reservation,
    RunningJob,
    Snapshot,
    TopologyLevel,
)
from placement.quota import QuotaLedger
from placement.topology import (
    AGENT_LEVEL,
    LEVEL_NAMES,
    NODE_LEVEL,
    CapacityIndex,
    Domain,
    Partition,
    Slot,
    level_of,
    partition_key,
)

UNKNOWN_SAFE_POINT_S = 3600.0
# Victim simulations per pass: each costs about a millisecond at 20k GPUs; jobs past
# the cap are tried again next pass (the broker runs a pass every second or so).
MAX_PREEMPTION_SEARCHES = 16
MAX_MINIMISE_TRIES = 16
REASON_RECLAIM = "reclaim_lent_quota"
REASON_PRIORITY = "higher_priority"

Placed = tuple[Partition, int, Domain | None, list[Slot]]


_by_id = attrgetter("id")
_by_submit_id = attrgetter("submit_time", "id")
_by_priority = attrgetter("priority")
_first = itemgetter(0)
# What the static eligibility filters and the ranking read of a job (one C-level call).
_elig_sig = attrgetter("accelerator", "allowed_regions", "denied_regions", "capacity_types",
                       "max_price_per_gpu_hour", "gpus_per_node", "dataset_region", "preferred_regions")
# level_of per TopologyLevel, looked up by int (enum members hash in Python code).
_LEVEL = {int(lvl): level_of(lvl) for lvl in TopologyLevel}


def schedule(snapshot: Snapshot) -> Decisions:
    """Decide admissions, preemptions, reservations and pending reasons. Pure."""
    with gc_paused():
        return _Pass(snapshot).run()


def _tier_text(part: Partition) -> str:
    if part.capacity_type == CapacityType.TRAINING_PLAN:
        return f"training plan {part.pool or '?'} (prepaid)"
    if part.capacity_type == CapacityType.SPOT:
        return f"spot at ${part.price:.2f}/GPU-h"
    return f"{part.capacity_type.name.lower()} at ${part.price:.2f}/GPU-h"


def safe_point_s(job: JobRequest) -> float:
    """Seconds from a fresh start until the job checkpoints or finishes."""
    c, e = job.checkpoint_interval_s, job.expected_duration_s
    if c > 0:
        return min(c, e) if e > 0 else c
    return e if e > 0 else UNKNOWN_SAFE_POINT_S


def work_lost_gpu_s(run: RunningJob, now: float) -> float:
    if run.stopping:
        return 0.0
    since = run.last_checkpoint_time or run.started_time
    return max(0.0, now - since) * run.gpus + run.restart_cost_s * run.gpus


def usable_nodes(nodes: list[NodeInfo], used: dict[str, int], now: float,
                 draining: frozenset[str]) -> tuple[list[tuple[NodeInfo, int]], list[tuple[NodeInfo, int]]]:
    """(node, free GPUs) of the nodes usable now and of the scheduled plans' nodes:
    the one rule both the from-scratch pass and the kept-alive cache build from."""
    now_nodes, future_nodes = [], []
    for n in nodes:
        if not n.healthy or n.cordoned or n.region in draining:
            continue
        if n.plan_end is not None and now >= n.plan_end:
            continue
        if n.plan_start is not None and now < n.plan_start:  # a plan not started yet
            future_nodes.append((n, n.gpus))
            if not n.available_before_plan:
                continue
        free = n.gpus - used.get(n.id, 0)
        now_nodes.append((n, free if free > 0 else 0))
    return now_nodes, future_nodes


@dataclass
class Fleet:
    """What a pass reads about the fleet, built once per pass from scratch or kept
    alive across passes and updated by deltas (``placement.incremental``). A pass
    mutates ``index``/``future`` (admissions, holds, victim simulations); the cache
    undoes that through the indexes' journals. Everything else is read-only."""

    index: CapacityIndex
    future: CapacityIndex
    by_team: dict[str, list[RunningJob]]
    rgpus: dict[int, int]  # id(RunningJob) -> its GPUs
    running_by_acc: dict[tuple[str, str], int]  # (team, accelerator) -> GPUs running
    region_of: dict[str, str]  # node id -> region, every node of the snapshot


def build_fleet(snap: Snapshot) -> Fleet:
    nodes = sorted(snap.nodes, key=_by_id)
    running = sorted(snap.running, key=_by_id)
    used: dict[str, int] = {}
    for r in running:
        for node_id, g in r.allocations:
            used[node_id] = used.get(node_id, 0) + g
    now_nodes, future_nodes = usable_nodes(nodes, used, snap.now, snap.draining_regions)
    by_team: dict[str, list[RunningJob]] = defaultdict(list)
    rgpus: dict[int, int] = {}
    by_acc: dict[tuple[str, str], int] = {}
    for r in running:
        by_team[r.team].append(r)
        g = rgpus[id(r)] = r.gpus
        k = (r.team, r.accelerator)
        by_acc[k] = by_acc.get(k, 0) + g
    return Fleet(index=CapacityIndex(now_nodes), future=CapacityIndex(future_nodes, future=True),
                 by_team=by_team, rgpus=rgpus, running_by_acc=by_acc,
                 region_of={n.id: n.region for n in nodes} if any(t.region_caps for t in snap.teams) else {})


class _Pass:
    def __init__(self, snap: Snapshot, fleet: Fleet | None = None) -> None:
        """``fleet``: prebuilt from ``snap.nodes``/``snap.running`` (the incremental
        cache); None builds it here. Same decisions either way."""
        self.now = snap.now
        self.snap = snap
        # Queue order (-priority, submit_time, id) as two stable C-level sorts: the
        # same order as one sort on a built key tuple, at half the cost.
        self.pending = sorted(snap.pending, key=_by_submit_id)
        self.pending.sort(key=_by_priority, reverse=True)
        if fleet is None:
            fleet = build_fleet(snap)
        self.index = fleet.index
        self.future = fleet.future
        self.ledger = QuotaLedger(snap.teams, (), snap.pending, running_by_acc=fleet.running_by_acc)
        self.caps: dict[str, dict[str, int]] = {t.team: dict(t.region_caps) for t in snap.teams if t.region_caps}
        self.region_used: dict[tuple[str, str], int] = defaultdict(int)
        self.by_team = fleet.by_team
        # RunningJob.gpus sums its allocations on every access; victim search reads it often.
        self.rgpus = fleet.rgpus
        if self.caps:
            region_of = fleet.region_of
            for team in self.caps:
                for r in fleet.by_team.get(team, ()):
                    for node_id, g in r.allocations:
                        self.region_used[(r.team, region_of.get(node_id, ""))] += g
        self.decisions = Decisions()
        self.claimed: set[str] = set()
        self.elig_cache: dict[tuple, object] = {}
        self.elig_by_safe: dict[tuple, list[tuple[tuple, Partition]]] = {}
        # per eligible list (by id): (rank group, price, risk, partition) for _place
        self.place_plan: dict[int, list[tuple[tuple, float, float, Partition]]] = {}
        self.fail_cache: dict[tuple, int] = {}
        self.searches = 0
        self.preempt_fail: dict[tuple, int] = {}
        self.block_cache: dict[tuple, tuple[int, str]] = {}
        self.tier_text: dict[int, str] = {}
        self.reserve_fail: set[tuple] = set()
        self.lower_gpus: dict[tuple, int] = {}
        self.victim_lists: dict[tuple, list[tuple[tuple, RunningJob]]] = {}
        self.alloc_slots: dict[int, list[tuple[Slot, int]]] = {}
        self.reason_cache: dict[tuple, str] = {}
        self.reclaim_lists: dict[tuple, list[tuple[tuple, RunningJob, str]]] = {}
        self.useful_cache: dict[tuple, tuple[list, dict[Slot, int]]] = {}
        # job shape -> (index version, future version, reason): see _try
        self.no_room: dict[tuple, tuple[int, int, str]] = {}
        # jobs left pending for quota in phases 1-2: phase 3 (the surplus) tries them
        self.quota_blocked: set[str] = set()
        # (index version, capacity with the reserved spares free): see _spare_note
        self.spare_view: tuple[int, CapacityIndex] | None = None
        # partition key -> its spares' GPUs, and the index's partitions by key (once a pass)
        self.spare_sizes: dict[tuple, list[int]] | None = None
        self.parts_by_key: dict[tuple, Partition] = {}

    # ---- driver -----------------------------------------------------------------------

    def run(self) -> Decisions:
        led = self.ledger
        keyof = led.job_key
        try_ = self._try
        deferred: dict[str, list[tuple[JobRequest, str]]] = {}
        if not led.enabled:
            for job in self.pending:
                try_(job, keyof(job))
            return self.decisions
        within = led.within_guarantee
        for job in self.pending:
            team, nodes, mn = job.team, job.nodes, job.min_nodes
            key = keyof(job)
            elastic = 0 < mn < nodes
            if within(team, key, (mn if elastic else nodes) * job.gpus_per_node):  # _min_gpus
                # not elastic: that was the full size, so _try need not ask again
                try_(job, key, None if elastic else True)
            else:
                deferred.setdefault(team, []).append((job, key))
        heap = []
        for order, team in enumerate(sorted(deferred)):
            heap.append((led.share(team, deferred[team][0][1]), order, team, 0))
        heapq.heapify(heap)
        share = led.share
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            _, order, team, i = pop(heap)
            jobs = deferred[team]
            n = len(jobs)
            while True:
                job, key = jobs[i]
                settled = self._quiet(job, key) and self._out_of_quota(job, key)
                if not settled:
                    try_(job, key)
                i += 1
                if i >= n:
                    break
                nxt = (share(team, jobs[i][1]), order, team, i)
                if heap and heap[0] < nxt:
                    push(heap, nxt)
                    break
                # else nxt is the smallest entry (entries never tie: `order` is
                # unique), so push + pop would hand it straight back: skip both.
                if settled and jobs[i][1] == key:
                    # Nothing changed since the job before (no admission, no
                    # preemption), so for the team's following jobs on the same
                    # quota line the share and the test above give the same answer
                    # every time: settle the out-of-quota run in one tight loop.
                    i = self._settle_out_of_quota(team, key, jobs, i)
                    if i >= n:
                        break
                    if jobs[i][1] != key:  # a new line: its share decides the turn
                        nxt = (share(team, jobs[i][1]), order, team, i)
                        if heap and heap[0] < nxt:
                            push(heap, nxt)
                            break
        if self.quota_blocked:
            self._lend_surplus()
        return self.decisions

    def _lend_surplus(self) -> None:
        """Phase 3: quota-blocked jobs, in fair-share order, on capacity still free, with the
        surplus (capacity no guarantee covers) lendable too. No preemption."""
        led = self.ledger
        if not any(q.can_borrow and q.cohort and q.borrow_limit != 0 for q in led.quota.values()):
            return  # nobody may borrow (static quotas): the surplus can change nothing
        if not any(p.root.cnt[1] for p in self.index.partitions if p.maxg >= 1):
            return  # nothing free anywhere: nothing to lend (the common busy pass)
        led.lend_surplus(sum(s.info.gpus for s in self.index.slot_by_id.values()))
        if not led.surplus_left():
            return
        keyof, blocked, reasons = led.job_key, self.quota_blocked, self.decisions.pending_reasons
        queues: dict[str, list[tuple[JobRequest, str]]] = {}
        for job in self.pending:  # queue order within a team
            if job.id in blocked:
                queues.setdefault(job.team, []).append((job, keyof(job)))
        share = led.share
        heap = [(share(team, q[0][1]), order, team, 0) for order, (team, q) in enumerate(sorted(queues.items()))]
        heapq.heapify(heap)
        while heap:
            _, order, team, i = heapq.heappop(heap)
            q = queues[team]
            job, key = q[i]
            if self._place_surplus(job, key):
                del reasons[job.id]
            if i + 1 < len(q):
                heapq.heappush(heap, (share(team, q[i + 1][1]), order, team, i + 1))

    def _place_surplus(self, job: JobRequest, key: str) -> bool:
        """Admit one quota-blocked job on free capacity if the ledger's room (with the
        surplus) holds it; no preemption."""
        led = self.ledger
        g, nodes, mn = job.gpus_per_node, job.nodes, job.min_nodes
        room = led.room(job.team, key)
        n = nodes if room == math.inf else min(nodes, int(room) // g)
        if n < (mn if 0 < mn < nodes else nodes):
            return False
        elig = self._eligible(job)
        if not elig:
            return False
        req = _LEVEL.get(job.required) or level_of(job.required)
        pref = (_LEVEL.get(job.preferred) or level_of(job.preferred)) if job.preferred else req
        placed = self._place(job, n, elig, pref, req)
        if placed is None:
            return False
        self._admit(job, key, placed)
        return True

    def _quiet(self, job: JobRequest, key: str) -> bool:
        """True when ``_try`` of this job, if it is out of quota, can only record the
        quota reason: the preemption searches are spent, or no search could start
        (its team has no lower-priority victim on this quota line, so the quota-blocked
        ``_preempt`` returns before searching, now and for the rest of the pass) and
        some capacity is eligible (else the reason says there is none)."""
        if self.searches >= MAX_PREEMPTION_SEARCHES:
            return True
        return self._lower(job.team, key, job.priority) == 0 and bool(self._eligible(job))

    def _lower(self, team: str, key: str, priority: int) -> int:
        """GPUs of the team's preemptible (or already stopping) running jobs on this
        quota line below ``priority``: what a quota-blocked job may free (cached; the
        running set does not change during a pass)."""
        lk = (team, key, priority)
        lower = self.lower_gpus.get(lk)
        if lower is None:
            led = self.ledger
            lower = self.lower_gpus[lk] = sum(
                self.rgpus[id(r)] for r in self.by_team.get(team, ())
                if r.priority < priority and (r.victim_at(self.now) or r.stopping)
                and led.key(r.team, r.accelerator) == key
            )
        return lower

    def _out_of_quota(self, job: JobRequest, key: str) -> bool:
        """Borrowing phase, for a job ``_quiet`` vouches for: most jobs left are
        simply over their team's quota. This is ``_try``'s first test (same outcome
        and reason text) in one call: True when the job was recorded as pending for
        quota, False when ``_try`` must handle it."""
        g, nodes, mn = job.gpus_per_node, job.nodes, job.min_nodes
        if nodes <= 0 or g <= 0:
            return False
        led = self.ledger
        team = job.team
        gpus = nodes * g
        used = led.usage(team, key)
        if used + gpus <= led.guaranteed(team, key):  # within_guarantee: _try admits or places
            return False
        room = led.room(team, key)
        if room == math.inf or min(nodes, int(room) // g) >= (mn if 0 < mn < nodes else nodes):
            return False
        rk = (team, key, gpus, used, room)
        msg = self.reason_cache.get(rk)
        if msg is None:
            msg = self.reason_cache[rk] = led.explain(team, key, gpus)
        self.decisions.pending_reasons[job.id] = msg
        self.quota_blocked.add(job.id)
        return True

    def _settle_out_of_quota(self, team: str, key: str, jobs: list[tuple[JobRequest, str]], i: int) -> int:
        """``_out_of_quota`` for ``jobs[i:]`` while they stay on ``key`` and out of
        quota, with the ledger read once (it cannot change in between). Returns the
        index of the first job it did not settle."""
        led = self.ledger
        room = led.room(team, key)
        if room == math.inf:
            return i
        used, nominal, iroom = led.usage(team, key), led.guaranteed(team, key), int(room)
        reasons, cache = self.decisions.pending_reasons, self.reason_cache
        spent = self.searches >= MAX_PREEMPTION_SEARCHES
        calm: dict[int, bool] = {}  # priority -> no lower-priority victim (``_quiet``'s first test)
        eligible = self._eligible
        n = len(jobs)
        while i < n:
            job, k = jobs[i]
            g, nodes, mn = job.gpus_per_node, job.nodes, job.min_nodes
            if k != key or nodes <= 0 or g <= 0:
                break
            gpus = nodes * g
            if used + gpus <= nominal or min(nodes, iroom // g) >= (mn if 0 < mn < nodes else nodes):
                break
            if not spent:  # _quiet(job, key), its victim test read once per priority
                p = job.priority
                ok = calm.get(p)
                if ok is None:
                    ok = calm[p] = self._lower(team, key, p) == 0
                if not ok or not eligible(job):
                    break
            rk = (team, key, gpus, used, room)
            msg = cache.get(rk)
            if msg is None:
                msg = cache[rk] = led.explain(team, key, gpus)
            reasons[job.id] = msg
            self.quota_blocked.add(job.id)
            i += 1
        return i

    @staticmethod
    def _min_gpus(job: JobRequest) -> int:
        if 0 < job.min_nodes < job.nodes:
            return job.min_nodes * job.gpus_per_node
        return job.gpus

    # ---- one job ----------------------------------------------------------------------

    def _try(self, job: JobRequest, key: str, within_full: bool | None = None) -> None:
        """Admit, plan preemptions for, reserve for, or explain one pending job.
        ``within_full``: the caller already knows the full size is within the
        team's guarantee (None = find out)."""
        g, nodes, mn = job.gpus_per_node, job.nodes, job.min_nodes
        if nodes <= 0 or g <= 0:
            self._pending(job, "job asks for no GPUs (nodes and gpus_per_node must be > 0)")
            return
        lo = mn if 0 < mn < nodes else nodes
        led = self.ledger
        if within_full or led.within_guarantee(job.team, key, nodes * g):
            # room() >= guarantee headroom >= the full size: skip computing it (the
            # room cache is reset by every admission, and most admissions are here).
            n_quota = nodes
        else:
            room = led.room(job.team, key)
            n_quota = nodes if room == math.inf else min(nodes, int(room) // g)
        spent = self.searches >= MAX_PREEMPTION_SEARCHES
        if n_quota < lo and spent:
            self._quota_pending(job, key)  # fast path: nothing more to try this pass
            return
        # Once the searches are spent, a job that found no capacity leaves the pass
        # exactly as it found it, so the next job of the same shape (everything the
        # rest of this method reads of a job, bar its id, team and priority, which
        # only the spent search would read) at the same index versions gets the same
        # reason: at fleet scale thousands of queued jobs are that one case.
        memo = None
        if spent and not job.excluded_nodes and job.team not in self.caps:
            memo = (_elig_sig(job), safe_point_s(job), nodes, mn, n_quota, job.required, job.preferred)
            hit = self.no_room.get(memo)
            if hit is not None and hit[0] == self.index.version and hit[1] == self.future.version:
                self.decisions.pending_reasons[job.id] = hit[2]
                return
        elig = self._eligible(job)
        if not elig:
            req = _LEVEL.get(job.required) or level_of(job.required)
            self._pending(job, self._with_spare_note(job, req, self._no_capacity_reason(job)))
            return
        req = _LEVEL.get(job.required) or level_of(job.required)
        pref = (_LEVEL.get(job.preferred) or level_of(job.preferred)) if job.preferred else req
        if n_quota < lo:
            # Quota is the blocker: a higher-priority job may preempt its own team's
            # lower-priority jobs.
            if self._preempt(job, key, job.nodes, elig, pref, req, quota_blocked=True):
                return
            self._quota_pending(job, key)
            return
        placed = None
        n = n_quota
        if n == job.nodes:
            placed = self._place(job, n, elig, pref, req)
        if placed is None and lo < job.nodes:
            ub = max(self.index.largest_block(p, g, req)[0] for _, p in elig)
            n = min(n_quota, job.nodes - 1 if n_quota == job.nodes else n_quota, ub)
            if n >= lo:
                placed = self._place(job, n, elig, pref, req)
        if placed is not None:
            self._admit(job, key, placed)
            return
        target = n_quota
        if self._preempt(job, key, target, elig, pref, req, quota_blocked=False):
            return
        if job.nodes >= 2 and self._reserve(job, req):
            return
        msg = self._capacity_reason(job, elig, req)
        self._pending(job, msg)
        if memo is not None:
            self.no_room[memo] = (self.index.version, self.future.version, msg)

    # ---- eligibility and ranking ----------------------------------------------------

    def _eligible(self, job: JobRequest) -> list[tuple[tuple, Partition]]:
        """Eligible partitions, best-ranked first. Cached in two steps: the static
        filters by job signature, then the plan-window check (which depends on the
        job's safe point) by which windowed partitions it passes, so jobs with
        different durations still share one list object (and one fail cache).
        A front cache by (signature, safe point) skips the window checks for the
        many jobs that repeat both; it returns the very same list object."""
        sig = _elig_sig(job)
        c, e = job.checkpoint_interval_s, job.expected_duration_s  # safe_point_s, inlined
        t_safe = (min(c, e) if e > 0 else c) if c > 0 else e if e > 0 else UNKNOWN_SAFE_POINT_S
        fk = (sig, t_safe)
        out = self.elig_by_safe.get(fk)
        if out is None:
            out = self.elig_by_safe[fk] = self._eligible_slow(job, sig, t_safe)
        return out

    def _eligible_slow(self, job: JobRequest, sig: tuple, t_safe: float) -> list[tuple[tuple, Partition]]:
        hit = self.elig_cache.get(sig)
        if hit is None:
            base = []
            types = allowed_types(job)
            for p in self.index.partitions:
                if self._static_ok(job, p, 0.0, future=False, types=types):
                    base.append((self._rank(job, p), p))
            base.sort(key=lambda x: x[0])
            windowed = [p for _, p in base if p.plan_start is not None or p.plan_end is not None]
            hit = self.elig_cache[sig] = (base, windowed)
        base, windowed = hit
        if not windowed:
            return base
        passes = tuple(self._window_ok(p, t_safe) for p in windowed)
        wkey = (sig, passes)
        out = self.elig_cache.get(wkey)
        if out is None:
            out = [(r, p) for r, p in base if not (p.plan_start is not None or p.plan_end is not None)
                   or self._window_ok(p, t_safe)]
            self.elig_cache[wkey] = out
        return out

    def _window_ok(self, p: Partition, t_safe: float) -> bool:
        """A job may start on a plan's nodes now only if its next safe point comes
        before the plan ends (and, when backfilling before the start, before the start)."""
        if p.plan_start is not None and self.now < p.plan_start and self.now + t_safe > p.plan_start:
            return False
        return not (p.plan_end is not None and self.now + t_safe > p.plan_end)

    def _static_ok(self, job: JobRequest, p: Partition, t_safe: float, future: bool,
                   types: frozenset[CapacityType] | None = None) -> bool:
        if not accepts(job, p.region, p.accelerator):
            return False
        if p.capacity_type not in (types if types is not None else allowed_types(job)):
            return False
        is_plan = p.capacity_type == CapacityType.TRAINING_PLAN
        if job.max_price_per_gpu_hour and not is_plan and p.price > job.max_price_per_gpu_hour:
            return False
        if p.maxg < job.gpus_per_node:
            return False
        if not future:
            return True  # plan windows: see _window_ok
        start = p.plan_start if p.plan_start is not None else self.now
        return not (p.plan_end is not None and start + t_safe > p.plan_end)

    def _rank(self, job: JobRequest, p: Partition) -> tuple:
        ct = p.capacity_type
        tier = 0 if ct == CapacityType.TRAINING_PLAN else 1 if ct == CapacityType.SPOT else 2
        egress = 1 if job.dataset_region and p.region != job.dataset_region else 0
        prefs = job.preferred_regions
        pref_rank = prefs.index(p.region) if p.region in prefs else len(prefs)
        price = 0.0 if ct == CapacityType.TRAINING_PLAN else p.price
        return (tier, egress, pref_rank, price, p.risk, p.order)

    # ---- placement ------------------------------------------------------------------

    def _place(self, job: JobRequest, n: int, elig, pref: int, req: int, cache: bool = True) -> Placed | None:
        g = job.gpus_per_node
        index = self.index
        excluded = []
        if job.excluded_nodes:
            excluded = [index.slot_by_id[i] for i in sorted(job.excluded_nodes) if i in index.slot_by_id]
        use_cache = cache and not excluded
        caps = self.caps.get(job.team) if self.caps else None
        ck = (id(elig), g, pref, req, job.team if caps else "")
        if use_cache and self.fail_cache.get(ck, 1 << 30) <= n:
            return None
        plan = self.place_plan.get(id(elig))
        if plan is None:  # the rank tuple's slices, once per eligible list
            plan = self.place_plan[id(elig)] = [(rank[:3], rank[3], rank[4], part) for rank, part in elig]
        saved = [(s, s.free) for s in excluded]
        for s in excluded:
            index.set_free(s, 0)
        find, best_single = index.find, index.best_single
        try:
            levels = (pref, req) if pref < req else (req,)
            for max_level in levels:
                best = None
                best_key = None
                best_group = None
                for group, price, risk, part in plan:
                    if best is not None and group != best_group:
                        break
                    if g > part.maxg or part.root.cnt[g] < n:
                        continue  # find's own first test, without the call
                    if caps and part.region in caps and (
                        self.region_used[(job.team, part.region)] + n * g > caps[part.region]
                    ):
                        continue
                    if n == 1:  # find's single-node branch, without the call
                        slot = best_single(part, g)
                        if slot is None:
                            continue
                        r = (NODE_LEVEL, None, [slot])
                    else:
                        r = find(part, n, g, max_level)
                        if r is None:
                            continue
                    level, dom, slots = r
                    k = (level, price, risk, part.order)
                    if best_key is None or k < best_key:
                        best, best_key, best_group = (part, level, dom, slots), k, group
                if best is not None:
                    return best
        finally:
            for s, f in saved:
                self.index.set_free(s, f)
        if use_cache:
            self.fail_cache[ck] = min(n, self.fail_cache.get(ck, 1 << 30))
        return None

    def _admit(self, job: JobRequest, key: str, placed: Placed) -> None:
        """Take the GPUs, charge the quota, and say where and why, for people."""
        part, level, dom, slots = placed
        g = job.gpus_per_node
        self.index.take_each(slots, g)
        n = len(slots)
        team, nodes = job.team, job.nodes
        self.ledger.admit(team, key, n * g, nodes * g)
        if team in self.caps:
            self.region_used[(team, part.region)] += n * g
        if dom is None:
            node_id = slots[0].info.id
            where = f"one node ({node_id})"
            assignments: tuple[tuple[str, int], ...] = ((node_id, g),)
        else:
            where = f"one {LEVEL_NAMES[level]} {dom.label}"
            assignments = tuple([(s.info.id, g) for s in slots])
        tier = self.tier_text.get(part.order) if not part.future else None
        if tier is None:
            tier = self.tier_text[part.order] = _tier_text(part)
        expl = f"{n}x{g} GPUs in {where}; {tier}"
        ds = job.dataset_region
        backfill = part.plan_start is not None and self.now < part.plan_start
        if n < nodes or ds or backfill:
            extra = []
            if n < nodes:
                extra.append(f"elastic: {n} of {nodes} nodes")
            if ds:
                extra.append("data local" if part.region == ds else f"data egress from {ds}")
            if backfill:
                extra.append(f"backfill before plan start at {part.plan_start:.0f}")
            expl += "; " + "; ".join(extra)
        # positional: the dataclass's field order (job_id, agent_id, region,
        # assignments, capacity_type, pool, price_per_gpu_hour, explanation)
        self.decisions.admissions.append(
            Admission(job.id, part.agent_id, part.region, assignments, part.capacity_type, part.pool,
                      part.price, expl)
        )

    # ---- preemption -----------------------------------------------------------------

    def _preempt(self, job, key, n, elig, pref, req, quota_blocked: bool) -> bool:
        """Plan victims so ``job`` can place next pass. True when preemptions were emitted."""
        led = self.ledger
        if not led.enabled or self.searches >= MAX_PREEMPTION_SEARCHES or n <= 0:
            return False
        g = job.gpus_per_node
        reclaim = not quota_blocked and led.within_guarantee(job.team, key, n * g)
        cohort = led.quota[job.team].cohort if job.team in led.quota else ""
        memo = (job.team, key, job.priority, quota_blocked, reclaim, id(elig), g, pref, req)
        if self.preempt_fail.get(memo, 1 << 30) <= n:
            return False
        need_quota = n * g - int(led.room(job.team, key)) if quota_blocked else 0
        if quota_blocked:
            lower = self._lower(job.team, key, job.priority)
            if lower < need_quota:  # upper bound (ignores victims already claimed)
                self.preempt_fail[memo] = min(n, self.preempt_fail.get(memo, 1 << 30))
                return False
        cands: list[tuple[tuple, RunningJob, str]] = []
        claimed = self.claimed
        if reclaim and cohort:
            lenders = tuple(other for other in led.cohorts.get(cohort, ())
                            if other != job.team and led.borrowed(other, key) > 0)
            # The borrowers' victims in one order (a pass asks for the same merge for
            # every reclaiming job of a team: sort once; claimed ones filtered after).
            rk = (key, lenders)
            merged = self.reclaim_lists.get(rk)
            if merged is None:
                shares = {other: led.share(other, key) for other in lenders}
                merged = [((ck[0], ck[1], -shares[other]) + ck[2:], r, REASON_RECLAIM)
                          for other in lenders for ck, r in self._victims_of(other, key)]
                merged.sort(key=_first)
                self.reclaim_lists[rk] = merged
            cands.extend([c for c in merged if c[1].id not in claimed] if claimed else merged)
        prio = job.priority
        own_cands = [(ck, r, REASON_PRIORITY) for ck, r in self._victims_of(job.team, key)
                     if r.priority < prio and r.id not in claimed]
        # Upper bound before any simulation: the gang must fit in ONE partition, so
        # some partition needs n nodes with >= g GPUs once every candidate is gone.
        keep_all = need_quota > 0
        if cands:  # the borrowers' part, shared by the pass's reclaims with this shape
            uk = (rk, id(elig), len(claimed), keep_all)
            hit = self.useful_cache.get(uk)
            if hit is None:
                hit = self.useful_cache[uk] = self._useful(cands, elig, keep_all, [], {})
            useful, freed = self._useful(own_cands, elig, keep_all, list(hit[0]), dict(hit[1]))
        else:
            useful, freed = self._useful(own_cands, elig, keep_all, [], {})
        cands = useful
        gained: dict[int, int] = defaultdict(int)
        for sl, gg in freed.items():
            if sl.free < g <= sl.free + gg:
                gained[id(sl.part)] += 1
        rg = self.rgpus
        own_total = sum(rg[id(c[1])] for c in cands if c[1].team == job.team)
        if own_total < need_quota or not any(p.root.cnt[g] + gained[id(p)] >= n for _, p in elig if g <= p.maxg):
            self.preempt_fail[memo] = min(n, self.preempt_fail.get(memo, 1 << 30))
            return False
        self.searches += 1
        # Prefixes too short to place even on paper are not simulated (a job's
        # excluded nodes are, as _place reorders them: keep that history exact).
        k_min = 0 if job.excluded_nodes else self._fewest_victims(cands, elig, n, g, req, freed)
        if k_min > len(cands):  # no prefix can work: the search's only trace is bucket order
            self._as_if_searched(cands)
            self.preempt_fail[memo] = min(n, self.preempt_fail.get(memo, 1 << 30))
            return False
        # Shortest prefix of the victim order that lets the job place (quota and
        # topology), found by galloping + bisection: both "enough quota freed" and
        # "a domain holds the gang" only get truer as victims are added.
        own = [rg[id(r)] if r.team == job.team else 0 for _, r, _ in cands]
        cur = 0

        def move_to(k: int) -> None:
            """Release victims cands[cur:k] (or take back cands[k:cur], last first) as
            one batch of index changes, in the order the one-by-one loop used: the
            galloping search moves hundreds of victims in steady-state passes."""
            nonlocal cur
            if cur < k:
                self.index.shift_each([(sl, gg) for i in range(cur, k) for sl, gg in self._alloc_slots(cands[i][1])])
            elif cur > k:
                self.index.shift_each([(sl, -gg) for i in range(cur - 1, k - 1, -1)
                                       for sl, gg in self._alloc_slots(cands[i][1])])
            cur = k

        def works(k: int) -> Placed | None:
            if k < k_min or sum(own[:k]) < need_quota:
                return None
            move_to(k)
            return self._place(job, n, elig, pref, req, cache=False)

        total = len(cands)
        placed = None
        lo_k, hi_k, step = 0, total, 1  # invariant: works(hi_k) once placed is set
        while True:
            k = min(step, total)
            r = works(k)
            if r is not None:
                hi_k, placed = k, r
                break
            lo_k = k
            if k == total:
                break
            step *= 2
        if placed is None:
            move_to(0)
            self.preempt_fail[memo] = min(n, self.preempt_fail.get(memo, 1 << 30))
            return False
        while hi_k - lo_k > 1:
            mid = (lo_k + hi_k) // 2
            r = works(mid)
            if r is not None:
                hi_k, placed = mid, r
            else:
                lo_k = mid
        move_to(hi_k)
        chosen = [(r, why) for _, r, why in cands[:hi_k]]
        # Minimise: drop victims that are not needed, last added first (bounded tries).
        freed_quota = sum(own[:hi_k])
        for r, _why in list(reversed(chosen[:-1]))[:MAX_MINIMISE_TRIES]:
            self._release(r, give=False)
            fq = freed_quota - (rg[id(r)] if r.team == job.team else 0)
            trial = self._place(job, n, elig, pref, req, cache=False) if fq >= need_quota else None
            if trial is not None:
                # by identity: the same element list.remove finds (ids are unique),
                # without the dataclass's field-by-field __eq__ on every other victim
                del chosen[next(i for i, c in enumerate(chosen) if c[0] is r)]
                freed_quota, placed = fq, trial
            else:
                self._release(r, give=True)
        for r, _ in chosen:
            self._release(r, give=False)
        cur = 0
        # Hold the currently free part of the target for this job for the rest of the pass.
        part, level, dom, slots = placed
        for s in slots:
            self.index.take(s, min(s.free, g))
        for r, _ in chosen:
            self.claimed.add(r.id)
            led.add(r.team, led.key(r.team, r.accelerator), -rg[id(r)])
            if r.team in self.caps:
                for node_id, gg in r.allocations:
                    sl = self.index.slot_by_id.get(node_id)
                    if sl is not None:
                        self.region_used[(r.team, sl.part.region)] -= gg
        led.admit(job.team, key, n * g, job.gpus)
        if job.team in self.caps:
            self.region_used[(job.team, part.region)] += n * g
        where = "one node" if dom is None else f"one {LEVEL_NAMES[level]} {dom.label}"
        names = []
        for r, why in chosen:
            lost = self._lost(r)
            if why == REASON_RECLAIM:
                msg = (f"preempted by {job.id}: team {job.team} reclaims its guaranteed quota lent to "
                       f"team {r.team}; {lost:.0f} GPU-s of work since the last checkpoint")
            else:
                msg = (f"preempted by {job.id} (priority {job.priority} > {r.priority}) because team "
                       f"{job.team}'s quota is full; {lost:.0f} GPU-s of work since the last checkpoint")
            if not r.stopping:
                self.decisions.preemptions.append(
                    Preemption(job_id=r.id, for_job_id=job.id, reason=why, work_lost_gpu_s=lost, message=msg)
                )
            names.append(r.id)
        kinds = sorted({why for _, why in chosen})
        self._pending(
            job,
            f"waiting for {len(chosen)} preempted job(s) to checkpoint ({', '.join(names)}; "
            f"{' and '.join(kinds)}); then {n}x{g} GPUs in {where}",
        )
        return True

    def _useful(self, cands: list, elig: list[tuple[tuple, Partition]], keep_all: bool, useful: list,
                freed: dict[Slot, int]) -> tuple[list, dict[Slot, int]]:
        """The candidates that free something on an eligible partition (all of them when
        quota must be freed too), appended to ``useful``, and what they free per node,
        added to ``freed``."""
        parts = {id(p) for _, p in elig}
        known = self.alloc_slots
        for c in cands:
            hit = False
            slots = known.get(id(c[1]))
            if slots is None:
                slots = self._alloc_slots(c[1])
            for sl, gg in slots:  # the victim's usable nodes, as slot_of gives them
                if id(sl.part) in parts:
                    freed[sl] = freed.get(sl, 0) + gg
                    hit = True
            if hit or keep_all:
                useful.append(c)
        return useful, freed

    def _fewest_victims(self, cands: list, elig: list[tuple[tuple, Partition]], n: int, g: int,
                        max_level: int, freed: dict[Slot, int]) -> int:
        """Fewest leading victims after which some eligible domain the gang may use
        (level <= ``max_level``, the job's required one) has ``n`` nodes with ``g``
        free GPUs: necessary for any placement, so the search skips the shorter
        prefixes without simulating them (same answer: ``_place`` fails there)."""
        parts = [p for _, p in elig if g <= p.maxg]
        if n == 1:
            max_level = AGENT_LEVEL  # one node: best fit over the partition, any level
        # A domain that holds the gang already: no bound (quota may still need victims).
        # Only domains the gang may use count (``find``: levels up to ``max_level``, the
        # partition itself only at the cluster level): a partition with n free nodes
        # scattered over blocks is no reason to simulate every short prefix.
        if max_level >= AGENT_LEVEL:
            if any(p.root.cnt[g] >= n for p in parts):
                return 0
        elif any(d.cnt[g] >= n for p in parts for lvl, ds in p.levels.items() if lvl <= max_level
                 for d in ds):
            return 0
        # The domains each topology chain may use (one list per chain, not per node).
        usable: dict[int, list[Domain]] = {}
        gained: dict[int, int] = {}
        # Every candidate gone first (``freed``: what all of them release on the
        # eligible partitions): the counts only grow along the prefix, so when even
        # that holds the gang nowhere, no prefix does, without the ordered walk.
        reach = False
        for sl, gg in freed.items():
            if sl.free < g <= sl.free + gg:
                ds = usable.get(id(sl.doms))
                if ds is None:
                    ds = usable[id(sl.doms)] = [d for d in sl.doms if d.level <= max_level]
                for d in ds:
                    got = gained[id(d)] = gained.get(id(d), 0) + 1
                    if d.cnt[g] + got >= n:
                        reach = True
                if reach:
                    break
        if not reach:
            return len(cands) + 1
        ok = {id(p) for p in parts}
        gained = {}
        acc: dict[Slot, int] = {}
        known = self.alloc_slots
        for k, c in enumerate(cands, start=1):
            slots = known.get(id(c[1]))
            if slots is None:
                slots = self._alloc_slots(c[1])
            for sl, gg in slots:
                if id(sl.part) not in ok:
                    continue
                f = sl.free + acc.get(sl, 0)
                acc[sl] = f - sl.free + gg
                if f < g <= f + gg:
                    ds = usable.get(id(sl.doms))
                    if ds is None:
                        ds = usable[id(sl.doms)] = [d for d in sl.doms if d.level <= max_level]
                    for d in ds:
                        got = gained[id(d)] = gained.get(id(d), 0) + 1
                        if d.cnt[g] + got >= n:
                            return k
        return len(cands) + 1

    def _as_if_searched(self, cands: list) -> None:
        """The index as a failed search leaves it, without simulating: releasing every
        victim and taking them back (last first) restores every count, and each node
        touched ends at the back of its free-GPU bucket, in the order of its last
        take. Bucket order steers best fit, so it must match to the node."""
        last: dict[Slot, None] = {}
        for i in range(len(cands) - 1, -1, -1):
            for sl, gg in self._alloc_slots(cands[i][1]):
                if gg:
                    last.pop(sl, None)
                    last[sl] = None
        index = self.index
        journal = index.journal
        for sl in last:
            if sl.free > 0:
                bucket = sl.part.buckets[sl.klass][sl.free]
                bucket.pop(sl, None)
                bucket[sl] = None
                if journal is not None:
                    journal.append((sl, sl.free))
        index.version += 1

    def _victims_of(self, team: str, key: str) -> list[tuple[tuple, RunningJob]]:
        """A team's preemptible jobs on one quota line, cheapest victim first (cached)."""
        ck = (team, key)
        out = self.victim_lists.get(ck)
        if out is None:
            led_key, rg, now = self.ledger.key, self.rgpus, self.now
            out = []
            for r in self.by_team.get(team, ()):
                # a job already stopping counts as soon-free, whatever its preemptible flag
                if not (r.victim_at(now) or r.stopping) \
                        or led_key(r.team, r.accelerator) != key:
                    continue
                gpus = rg[id(r)]
                if r.stopping:
                    out.append(((0, r.priority, 0.0, -gpus, r.id), r))
                else:  # _lost(r), inlined: every running job of the team, every pass
                    since = r.last_checkpoint_time or r.started_time
                    lost = max(0.0, now - since) * gpus + r.restart_cost_s * gpus
                    out.append(((1, r.priority, lost, -gpus, r.id), r))
            out.sort(key=_first)
            self.victim_lists[ck] = out
        return out

    def _lost(self, r: RunningJob) -> float:
        """work_lost_gpu_s(r, now) with the job's GPU count read from ``rgpus``."""
        if r.stopping:
            return 0.0
        gpus = self.rgpus[id(r)]
        since = r.last_checkpoint_time or r.started_time
        return max(0.0, self.now - since) * gpus + r.restart_cost_s * gpus

    def _alloc_slots(self, r: RunningJob) -> list[tuple[Slot, int]]:
        """A running job's (slot, GPUs) on usable nodes, in allocation order (cached)."""
        out = self.alloc_slots.get(id(r))
        if out is None:
            slot_of = self.index.slot_by_id
            out = self.alloc_slots[id(r)] = [(slot_of[n], g) for n, g in r.allocations if n in slot_of]
        return out

    def _release(self, r: RunningJob, give: bool) -> None:
        """Give a victim's GPUs back to the index (or take them again), node by node."""
        set_free = self.index.set_free
        for s, g in self._alloc_slots(r):
            set_free(s, s.free + g if give else s.free - g)

    # ---- reservations on scheduled plans ----------------------------------------------

    def _reserve(self, job: JobRequest, req: int) -> bool:
        if not self.future.partitions:
            return False
        t_safe = safe_point_s(job)
        fk = (job.accelerator, job.allowed_regions, job.denied_regions, job.capacity_types,
              job.max_price_per_gpu_hour, job.gpus_per_node, job.nodes, t_safe, req, self.future.version)
        if fk in self.reserve_fail:
            return False
        best = None
        for p in sorted(self.future.partitions, key=lambda p: (p.plan_start or 0.0, self._rank(job, p))):
            if not self._static_ok(job, p, t_safe, future=True):
                continue
            r = self.future.find(p, job.nodes, job.gpus_per_node, req)
            if r is not None:
                best = (p, r)
                break
        if best is None:
            self.reserve_fail.add(fk)
            return False
        p, (level, dom, slots) = best
        g = job.gpus_per_node
        for s in slots:
            self.future.take(s, g)
        where = "one node" if dom is None else f"one {LEVEL_NAMES[level]} {dom.label}"
        start = p.plan_start or self.now
        expl = f"reserved {job.nodes}x{g} GPUs in {where} of training plan {p.pool or '?'} from t={start:.0f}"
        self.decisions.reservations.append(
            Reservation(
                job_id=job.id, agent_id=p.agent_id, region=p.region, pool=p.pool,
                start_time=start, assignments=tuple((s.info.id, g) for s in slots), explanation=expl,
            )
        )
        self._pending(job, f"no room now; {expl} (in {max(0.0, start - self.now) / 3600:.1f} h)")
        return True

    # ---- reasons --------------------------------------------------------------------

    def _quota_pending(self, job: JobRequest, key: str) -> None:
        led = self.ledger
        team, gpus = job.team, job.nodes * job.gpus_per_node
        rk = (team, key, gpus, led.usage(team, key), led.room(team, key))
        msg = self.reason_cache.get(rk)
        if msg is None:
            msg = self.reason_cache[rk] = led.explain(team, key, gpus)
        self.decisions.pending_reasons[job.id] = msg
        self.quota_blocked.add(job.id)

    def _pending(self, job: JobRequest, reason: str) -> None:
        self.decisions.pending_reasons[job.id] = reason

    def _capacity_reason(self, job: JobRequest, elig, req: int) -> str:
        g = job.gpus_per_node
        ck = (id(elig), g, req, self.index.version)
        hit = self.block_cache.get(ck)
        if hit is None:
            best, label = 0, ""
            for _, p in elig:
                c, lab = self.index.largest_block(p, g, req)
                if c > best:
                    best, label = c, lab
            hit = self.block_cache[ck] = (best, label)
        best, label = hit
        scope = "one cluster" if req >= AGENT_LEVEL else f"one {LEVEL_NAMES[req]}"
        size = f"{job.gpus} GPUs ({job.nodes} node(s) x {g})"
        if 0 < job.min_nodes < job.nodes:
            size += f", or at least {job.min_nodes} node(s)"
        where = f" in {label}" if best else ""
        msg = f"needs {size} within {scope}; largest free block is {best * g} GPUs{where}"
        caps = self.caps.get(job.team, {})
        capped = sorted({p.region for _, p in elig if p.region in caps
                         and self.region_used[(job.team, p.region)] + job.gpus > caps[p.region]})
        if capped:
            msg += "; team {} is at its region cap in {}".format(
                job.team, ", ".join(f"{r} ({self.region_used[(job.team, r)]}/{caps[r]} GPUs)" for r in capped))
        return self._with_spare_note(job, req, msg)

    def _with_spare_note(self, job: JobRequest, req: int, msg: str) -> str:
        """``msg``, led by :meth:`_spare_note` when there is one."""
        if not self.snap.spares:
            return msg
        note = self._spare_note(job, req)
        return f"{note}; {msg}" if note else msg

    def _spare_note(self, job: JobRequest, req: int) -> str:
        """Why a job that found no room would have found some: the free capacity it
        needs includes its pools' reserved spares (free nodes kept for replacing lost
        nodes in place, broker/scheduling/spares.py; cordoned in the snapshot, so the
        ordinary reasons cannot tell a spare from a busy node). Empty when it would not
        fit even with the spares, or would fit without them.

        Asks the same ``find`` the placement does, on a second index of the spares'
        partitions with the spares free (built once per index version: a busy pass
        reuses it for every job left without room). First a count that cannot be wrong
        the other way: a partition whose free nodes plus spares of at least ``g`` GPUs
        are fewer than the job's nodes cannot hold it, and when none can, the second
        index is not built (the common case of a full fleet: no rebuild per admission)."""
        g = job.gpus_per_node
        n = job.min_nodes if 0 < job.min_nodes < job.nodes else job.nodes
        if not self._spares_could_hold(n, g):
            return ""
        index = self._spare_index(job.excluded_nodes)
        types = allowed_types(job)
        t_safe = safe_point_s(job)
        spares = self.snap.spares
        for part in sorted(index.partitions, key=lambda p: self._rank(job, p)):
            if not self._static_ok(job, part, 0.0, future=False, types=types):
                continue
            if (part.plan_start is not None or part.plan_end is not None) and not self._window_ok(part, t_safe):
                continue
            found = index.find(part, n, g, req)
            if found is None:
                continue
            taken = sum(1 for s in found[2] if s.info.id in spares)
            if not taken:
                continue
            held = sum(1 for s in index.slot_by_id.values() if s.part is part and s.info.id in spares)
            return (f"only reserved spares are free in pool {part.pool or '(default)'} of"
                    f" {part.region}/{part.agent_id}: {taken} of the {n} node(s) it needs would be"
                    f" spares (the pool keeps {held} free for replacing lost nodes in place)")
        return ""

    def _spares_could_hold(self, n: int, g: int) -> bool:
        """Some partition with spares has at least ``n`` nodes of ``g`` free GPUs when its
        spares count as free (topology and eligibility aside: a necessary condition)."""
        if self.spare_sizes is None:
            sizes: dict[tuple, list[int]] = defaultdict(list)
            spares = self.snap.spares
            for node in self.snap.nodes:
                if node.id in spares and node.healthy:
                    sizes[partition_key(node)].append(node.gpus)
            self.spare_sizes = sizes
            self.parts_by_key = {p.key: p for p in self.index.partitions}
        for key, gpus in self.spare_sizes.items():
            k = sum(1 for x in gpus if x >= g)
            if not k:
                continue
            part = self.parts_by_key.get(key)
            have = part.root.cnt[g] if part is not None and g <= part.maxg else 0
            if have + k >= n:
                return True
        return False

    def _spare_index(self, excluded: frozenset[str]) -> CapacityIndex:
        """The free capacity of the partitions holding reserved spares, the spares free,
        without ``excluded``; the one without exclusions cached per index version."""
        cached = self.spare_view
        if not excluded and cached is not None and cached[0] == self.index.version:
            return cached[1]
        spares = self.snap.spares
        infos = [dataclasses.replace(n, cordoned=False) for n in self.snap.nodes
                 if n.id in spares and n.healthy and n.id not in excluded]
        keys = {partition_key(n) for n in infos}
        free = [(s.info, s.free) for s in self.index.slot_by_id.values()
                if s.info.id not in excluded and partition_key(s.info) in keys]
        index = CapacityIndex(free + [(n, n.gpus) for n in infos])
        if not excluded:
            self.spare_view = (self.index.version, index)
        return index

    def _no_capacity_reason(self, job: JobRequest) -> str:
        parts = []
        if job.accelerator:
            parts.append(f"accelerator {job.accelerator}")
        parts.append(f"{job.gpus_per_node} GPU(s) per node")
        if job.allowed_regions:
            parts.append("regions " + ",".join(sorted(job.allowed_regions)))
        if job.denied_regions:
            parts.append("not in " + ",".join(sorted(job.denied_regions)))
        types = sorted(CapacityType(t).name.lower() for t in allowed_types(job))
        parts.append("capacity " + "/".join(types))
        if job.max_price_per_gpu_hour:
            parts.append(f"at most ${job.max_price_per_gpu_hour:.2f}/GPU-h")
        plans = [p for p in self.index.partitions if p.capacity_type == CapacityType.TRAINING_PLAN]
        note = ""
        if plans and CapacityType.TRAINING_PLAN in allowed_types(job):
            note = f" (training plans must outlast the job's next checkpoint, {safe_point_s(job):.0f}s away)"
        return "no usable capacity matches " + ", ".join(parts) + note
