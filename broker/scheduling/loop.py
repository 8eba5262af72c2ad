"""The scheduler loop: snapshot -> ``placement.schedule`` (pure) -> apply.

The pass runs on the admission cache (``admission.py``): the same decisions as
``placement.schedule`` on the snapshot, with the capacity index and running-job
bookkeeping kept alive and fed by the differences from the previous snapshot.

Runs every ``scheduler_interval_s`` and whenever poked (a submit, a finished or
requeued attempt, an agent (re)connecting), so queue latency is not bounded by the
interval. One pass also runs housekeeping (lost agents, stop/cancel timeouts) and
planned moves (plan ends); both return the jobs they rewrote into the same pass, so
the live jobs are read once per pass. After placement it looks for proactive moves
(better capacity, defragmentation: ``proactive_watch.py``).
With several broker replicas only the holder of the "scheduler" lease schedules.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import placement
from broker.jobs import backoff, precopy, standby, store_wait
from broker.jobs.causes import Cause
from broker.jobs.lifecycle import CHECKPOINTING, LIVE, PENDING, QUEUED
from broker.jobs.ops import JobOps
from broker.jobs.recovery import Signal, Trigger
from broker.jobs.views import JobsView, RecordsView
from broker.scheduling import (
    exclusions,
    grow_watch,
    plan_watch,
    preemption_rules,
    replacements,
    warm_spares,
)
from broker.scheduling.admission import LiveAdmission
from broker.scheduling.live_jobs import LiveJobs
from broker.scheduling.proactive_watch import ProactiveWatch
from broker.scheduling.snapshot import NodeMemo, SnapshotMemo
from broker.scheduling.usage import build_snapshot
from broker.store.base import KIND_USAGE_SERIES, StoreError
from broker.telemetry import series as usage_series
from broker.workdirs.checks import broken_store_note
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb

log = logging.getLogger(__name__)

Lease = Callable[[str, str, float], bool]  # Store.acquire_lease
# A pass's admissions are launched this many at a time: each Launch is a store write
# that returns after its commit, and concurrent writes share one commit (the store's
# write group). One after another, a pass admitting a queue of hundreds launched at
# the disk's fsync rate: 2-3 jobs/s in the Kubernetes scale benchmark at 2,000 nodes,
# where the launch path's profile was mostly the store's commit.
LAUNCH_THREADS = 8


def merged(live: list[pb.Job], changed: Iterable[pb.Job]) -> list[pb.Job]:
    """``live`` with the jobs this pass already rewrote (a terminal one leaves it)."""
    new = {j.id: j for j in changed}
    if not new:
        return live
    return [j for j in (new.get(job.id, job) for job in live) if j.phase in LIVE]


class SchedulerLoop:
    def __init__(self, ops: JobOps, jobs: JobsView, records: RecordsView, lease: Lease,
                 holder: str) -> None:
        self.ops = ops
        self.jobs = jobs
        self.records = records
        self.lease = lease
        self.holder = holder
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0
        self.last_snapshot: placement.Snapshot | None = None  # what the last pass decided on
        # Live jobs kept from the applier's commits between full reads (live_jobs.py).
        # What it reads from the store goes to the agent streams' memory copies too
        # (broker/jobs/hot_jobs.py: the newer version wins), so a job changed behind
        # the applier's back is seen there within one re-read.
        hot = ops.applier.hot

        def read_all() -> Iterator[pb.Job]:
            for job in self.jobs.iter(phases=LIVE):
                hot.committed(job)
                yield job

        def read_one(job_id: str) -> pb.Job | None:
            job = self.jobs.find(job_id)
            if job is not None:
                hot.committed(job)
            return job

        self.live = LiveJobs(read_all, read_versions=lambda: self.jobs.versions(LIVE), read_one=read_one)
        self._requests = SnapshotMemo()
        self._nodes = NodeMemo()
        # The placement pass runs on a kept-alive capacity index and running-job
        # bookkeeping fed by the differences between snapshots (admission.py):
        # same decisions as placement.schedule, at the cost of the change.
        self.admission = LiveAdmission()
        # Unforced moves (better capacity, defragmentation) for jobs whose policy asks.
        self.proactive = ProactiveWatch(ops)
        # Whether the last pass had a usable node: while it had none, a submit's
        # wake-up is not taken (job_queued), the interval pass sees the new jobs.
        self._capacity = True
        self._launcher = ThreadPoolExecutor(LAUNCH_THREADS, thread_name_prefix="scheduler-launch")
        ops.applier.set_poke(self.poke, self.job_queued)
        ops.applier.add_listener(self.live.committed)
        self.series = ops.telemetry.series  # usage over time (series.py)
        self._series_saved = time.monotonic()

    def start(self) -> None:
        self._load_series()
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.ops.applier.remove_listener(self.live.committed)
        self.live.detach()
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._launcher.shutdown(wait=False)
        self._save_series()

    # ---- usage over time (broker/telemetry/series.py) --------------------------------
    def _load_series(self) -> None:
        """A new leader (a restart, a failover) continues the series the store holds."""
        self.series.sample_s = self.ops.config.usage_sample_s
        try:
            state = self.records.get(KIND_USAGE_SERIES, usage_series.SERIES_KEY)
        except StoreError as e:
            log.warning("usage series not loaded (starting empty): %s", e)
            return
        if isinstance(state, cpb.UsageSeriesState):
            self.series.load(state, self.ops.clock())

    def _save_series(self) -> None:
        if not self.series.dirty:
            return
        self._series_saved = time.monotonic()
        try:
            self.records.put(KIND_USAGE_SERIES, usage_series.SERIES_KEY,
                             self.series.to_state(self.ops.clock()))
        except StoreError as e:  # store down or fenced: the next save tries again
            log.warning("usage series not saved: %s", e)

    def _sample_series(self, snapshot: placement.Snapshot, now: float) -> None:
        if self.series.due(now):
            self.series.sample(now, usage_series.sample_snapshot(snapshot))
        if time.monotonic() - self._series_saved >= self.ops.config.usage_save_s:
            self._save_series()

    def poke(self) -> None:
        self._wake.set()

    def job_queued(self) -> None:
        """A submit's wake-up: a pass only when the last one had a usable node.

        Why: with no usable node (no agent connected yet, every region away) a pass
        can place nothing; the new job already says why it waits (set at submit), and
        each woken pass is O(queue) (the live set, the snapshot, the pending-reason
        walk) paced to ``scheduler_busy_share`` of a core, i.e. a fixed share of the
        CPU that every submit of a storm paid, more the larger the backlog. What can
        make the job placeable wakes the loop itself (an agent connecting or
        reporting nodes, quotas, plans, classes: ``poke``), and the interval pass
        runs regardless, so nothing waits longer than ``scheduler_interval_s``."""
        if self._capacity:
            self._wake.set()

    def _run(self) -> None:
        interval = self.ops.config.scheduler_interval_s
        while not self._stop.is_set():
            self._wake.wait(interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            t0 = time.monotonic()
            try:
                self.run_once()
            except StoreError as e:  # store down or this broker fenced: expected, no traceback
                log.warning("scheduler pass skipped: %s: %s", type(e).__name__, e)
            except Exception:  # noqa: BLE001 - the loop must survive one bad pass
                self.live.forget()  # read the store afresh next time
                log.exception("scheduler pass failed")
            # Wake-ups coalesce: submits arriving during a pass (or this pause) make one
            # next pass. The pause keeps passes to ``scheduler_busy_share`` of the
            # time (at most one interval): one process, one GIL, the rest is the API's.
            share = self.ops.config.scheduler_busy_share
            self._stop.wait(min((time.monotonic() - t0) * (1 / share - 1), interval))

    def run_once(self) -> placement.Decisions | None:
        """One pass over ONE read of the live jobs: housekeeping and planned moves return
        the jobs they rewrote, which replace their stale copies before placement."""
        ops = self.ops
        ttl = max(3 * ops.config.scheduler_interval_s, 5.0)
        if not self.lease("scheduler", self.holder, ttl):
            return None
        live = self.live.current()
        live = merged(live, ops.housekeeping(live))
        plans = self.records.plans()
        now = ops.clock()
        live = merged(live, plan_watch.check(ops, live, plans, now))
        def snapshot_of(jobs: list[pb.Job]) -> placement.Snapshot:
            return build_snapshot(now=now, agents=ops.agents.all(), jobs=jobs,
                                  teams=self.records.teams().values(), plans=plans,
                                  regions=self.records.regions().values(),
                                  priority_of=ops.priority_of, memo=self._requests,
                                  make_before_break=ops.config.make_before_break,
                                  node_memo=self._nodes,
                                  preemption=preemption_rules.from_config(ops.config))

        snapshot = snapshot_of(live)
        # Only jobs with exclusions can be forgiven: the map holds those alone (most passes
        # have none, and to_forgive then returns at once instead of walking the queue).
        excluding = {j.id: j for j in live if j.excluded_nodes}
        forgiven = ops.forgive_exclusions(exclusions.to_forgive(snapshot, excluding)) if excluding else []
        if forgiven:  # rare: rebuild so this pass already places them
            live = merged(live, forgiven)
            snapshot = snapshot_of(live)
        # Jobs that lost nodes: replaced in place on a spare, or sent to the store path,
        # before placement can hand their survivors to anyone else (replacements.py).
        relaunched = replacements.relaunch_lost(ops, live, snapshot)
        # Jobs stopped to grow back: on their full-size nodes at once (grow_watch.py).
        relaunched += grow_watch.relaunch_grown(ops, merged(live, relaunched), snapshot)
        if relaunched:
            live = merged(live, relaunched)
            snapshot = snapshot_of(live)
        self.last_snapshot = snapshot
        self._capacity = bool(snapshot.nodes)
        self.passes += 1
        telemetry = ops.telemetry
        telemetry.observe(snapshot, live, ops.agents.all())
        self._sample_series(snapshot, now)
        if not snapshot.pending and not snapshot.running:
            return placement.Decisions()
        with telemetry.schedule_pass(snapshot):
            t0 = time.perf_counter()
            # No usable node: the engine could only say "no capacity" per job, and
            # apply() replaces every such reason by the fleet-wide one, so skip the
            # O(queue) pass (a broker whose agents are away keeps taking submits).
            decisions = self.admission.decide(snapshot) if snapshot.nodes else placement.Decisions()
            telemetry.placed(time.perf_counter() - t0)
            self.apply(decisions, live, snapshot)
        if snapshot.nodes:
            self.proactive.check(live, snapshot, decisions)
            grow_watch.check(ops, live, snapshot, decisions)
        return decisions

    def _release_unplaced(self, job: pb.Job, snapshot: placement.Snapshot) -> None:
        """A proactive move held for its pre-copy whose standby this pass could not place
        (it was in the snapshot: the move was decided by an earlier pass) stops now."""
        if precopy.unplaced_releasable(job) and any(
                r.id == standby.request_id(job.id) for r in snapshot.pending):
            self.ops.release_unplaced(job.id)

    def apply(self, decisions: placement.Decisions, live: list[pb.Job],
              snapshot: placement.Snapshot) -> None:
        ops = self.ops
        # by id: only for the (few) admissions and preemptions, not built per pass
        by_id = {j.id: j for j in live} if decisions.admissions or decisions.preemptions else {}
        admitted = set()
        launches = []
        for adm in decisions.admissions:
            moving = standby.job_of(adm.job_id)
            if moving is not None:  # make-before-break: the destination of a move
                ops.reserve_standby(moving, dataclasses.replace(adm, job_id=moving))
                continue
            launches.append(adm)
        # several at once (LAUNCH_THREADS): their writes share commits; each Launch is
        # still sent only after its own job's write committed (the applier); each names
        # its pool's spares (warm_spares.py)
        def launch(a: placement.Admission) -> pb.Job | None:
            return ops.launch(a.job_id, a,
                              spare_nodes=warm_spares.of_pool(snapshot, a.agent_id, a.pool))

        launched = (list(self._launcher.map(launch, launches))
                    if len(launches) > 1 else [launch(a) for a in launches])
        for adm, out in zip(launches, launched, strict=True):
            if out is not None:
                admitted.add(adm.job_id)
                job = by_id.get(adm.job_id)
                ops.telemetry.admitted(job, adm, snapshot.now)
                if job is not None:
                    self.series.admitted(job.spec.team, snapshot.now)
        for pre in decisions.preemptions:
            victim = by_id.get(pre.job_id)
            beneficiary = by_id.get(pre.for_job_id)
            if victim is None or standby.job_of(pre.for_job_id) is not None:
                continue  # a standby never preempts: the move still works without it
            who = (f"{pre.for_job_id} (team {beneficiary.spec.team}, priority"
                   f" {beneficiary.spec.priority_class})" if beneficiary else pre.for_job_id)
            stopping = ops.trigger(
                pre.job_id, Signal(Trigger.PREEMPTED, cause=Cause.parse(pre.reason)), actor="scheduler",
                # placement's message already says why and the work at risk: name the
                # beneficiary's team and class in it rather than repeat it
                message=(pre.message.replace(f"by {pre.for_job_id}", f"by {who}", 1) if pre.message
                         else f"preempted for {who}: {pre.reason}; work at risk"
                              f" {pre.work_lost_gpu_s:.0f} GPU-s since the last checkpoint"),
                details={"for_job": pre.for_job_id,
                         "for_team": beneficiary.spec.team if beneficiary else "",
                         "work_lost_gpu_s": f"{pre.work_lost_gpu_s:.1f}"},
            )
            if stopping is not None:
                ops.telemetry.preempted(victim, pre.reason)
        placed_standby = {standby.job_of(a.job_id) for a in decisions.admissions}
        reasons = dict(decisions.pending_reasons)
        if not snapshot.nodes:
            default = ("no regions registered yet" if not ops.agents.any_registered()
                       else "no region agent is connected")
        else:
            default = ""
        # Say why a connected region takes nothing (broker/workdirs/checks.py).
        store_note = broken_store_note(a.record for a in ops.agents.connected())
        if store_note and not snapshot.nodes:
            default = store_note
        reserved = {r.job_id: r for r in getattr(decisions, "reservations", [])}
        # when each region's store probe last turned healthy (a waiting job's note says
        # the store answers again once that is after its last failed attempt)
        store_ok: dict[str, float] = {}
        for a in ops.agents.connected():
            ok = a.record.checkpoint_store_ok_since
            if ok > store_ok.get(a.region, 0.0):
                store_ok[a.region] = ok
        for job in live:  # one walk over the live jobs per pass: keep its cheap tests first
            if job.phase not in QUEUED or job.id in admitted:
                if job.phase == CHECKPOINTING and job.id not in placed_standby:
                    self._release_unplaced(job, snapshot)
                continue
            reason = default or reasons.get(job.id, "")
            if store_note and store_note not in reason:
                reason = f"{reason}; {store_note}" if reason else store_note
            if job.id in reserved:
                r = reserved[job.id]
                reason = reason or (r.explanation or f"reserved on plan {r.pool} from {r.start_time:.0f}")
            # agents that refused it lately
            refused = backoff.pending_note(job, snapshot.now) if job.refusals else ""
            if refused and refused not in reason:
                reason = f"{refused}; {reason}" if reason else refused
            outage = (store_wait.pending_note(job, snapshot.now,
                                              store_ok.get(job.store_wait.region, 0.0))
                      if job.store_wait.count else "")
            if outage and outage not in reason:
                reason = f"{outage}; {reason}" if reason else outage
            if reason and reason != job.pending_reason and job.phase == PENDING:
                ops.set_pending_reason(job.id, reason)
