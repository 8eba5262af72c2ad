"""The scheduler loop: snapshot -> ``placement.schedule`` (pure) -> apply.

Runs every ``scheduler_interval_s`` and whenever poked (a submit, a finished or
requeued attempt, an agent (re)connecting), so queue latency is not bounded by the
interval. One pass also runs housekeeping (lost agents, stop/cancel timeouts).
With several broker replicas only the holder of the "scheduler" lease schedules.
"""

from __future__ import annotations

import logging
import threading
import time

import placement
from broker.jobs.core import BrokerCore
from broker.jobs.lifecycle import LIVE, PENDING, QUEUED, Tx
from broker.scheduling import plan_watch
from broker.scheduling import snapshot as snap
from broker.store.base import KIND_PLAN, KIND_REGION, KIND_TEAM
from broker.store.jobs_query import iter_jobs
from broker.workdirs.checks import broken_store_note
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb

log = logging.getLogger(__name__)


class SchedulerLoop:
    def __init__(self, core: BrokerCore, holder: str) -> None:
        self.core = core
        self.holder = holder
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0
        core.set_poke(self.poke)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def poke(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        interval = self.core.config.scheduler_interval_s
        while not self._stop.is_set():
            self._wake.wait(interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - the loop must survive one bad pass
                log.exception("scheduler pass failed")

    def run_once(self) -> placement.Decisions | None:
        core = self.core
        ttl = max(3 * core.config.scheduler_interval_s, 5.0)
        if not core.store.acquire_lease("scheduler", self.holder, ttl):
            return None
        live = list(iter_jobs(core.store, phases=LIVE))
        core.housekeeping(live)
        plans = core.store.list_records(KIND_PLAN, cpb.TrainingPlan)
        plan_watch.check(core, live, plans)  # type: ignore[arg-type]  # moves ahead of plan ends
        live = list(iter_jobs(core.store, phases=LIVE))
        now = core.clock()
        regions = core.store.list_records(KIND_REGION, cpb.RegionInfo)
        draining = [r.name for r in regions if isinstance(r, cpb.RegionInfo) and r.draining]
        snapshot = snap.build(
            now=now, agents=core.agents.all(), jobs=live,
            teams=core.store.list_records(KIND_TEAM, cpb.TeamQuota),  # type: ignore[arg-type]
            plans=plans,  # type: ignore[arg-type]
            draining=draining, priority_of=core.priority_of,
        )
        self.passes += 1
        core.telemetry.observe(snapshot, live, core.agents.all())
        if not snapshot.pending and not snapshot.running:
            return placement.Decisions()
        with core.telemetry.schedule_pass(snapshot):
            t0 = time.perf_counter()
            decisions = placement.schedule(snapshot)
            core.telemetry.placed(time.perf_counter() - t0)
            self.apply(decisions, live, snapshot)
        return decisions

    def apply(self, decisions: placement.Decisions, live: list[pb.Job],
              snapshot: placement.Snapshot) -> None:
        core = self.core
        by_id = {j.id: j for j in live}
        admitted = set()
        for adm in decisions.admissions:
            if core.launch(adm.job_id, adm) is not None:
                admitted.add(adm.job_id)
                core.telemetry.admitted(by_id.get(adm.job_id), adm, snapshot.now)
        for pre in decisions.preemptions:
            victim = by_id.get(pre.job_id)
            beneficiary = by_id.get(pre.for_job_id)
            if victim is None:
                continue
            who = (f"{pre.for_job_id} (team {beneficiary.spec.team}, priority"
                   f" {beneficiary.spec.priority_class})" if beneficiary else pre.for_job_id)
            stopping = core.request_stop(
                pre.job_id, "preempt", actor="scheduler", reason=pre.reason or "preempted",
                message=f"preempted for {who}: {pre.message or pre.reason}; work at risk"
                        f" {pre.work_lost_gpu_s:.0f} GPU-s since the last checkpoint",
                details={"for_job": pre.for_job_id,
                         "for_team": beneficiary.spec.team if beneficiary else "",
                         "work_lost_gpu_s": f"{pre.work_lost_gpu_s:.1f}"},
            )
            if stopping is not None:
                core.telemetry.preempted(victim, pre.reason)
        reasons = dict(decisions.pending_reasons)
        if not snapshot.nodes:
            default = ("no regions registered yet" if not core.agents.any_registered()
                       else "no region agent is connected")
        else:
            default = ""
        # Say why a connected region takes nothing (broker/workdirs/checks.py).
        store_note = broken_store_note(a.record for a in core.agents.connected())
        if store_note and not snapshot.nodes:
            default = store_note
        reserved = {r.job_id: r for r in getattr(decisions, "reservations", [])}
        for job in live:
            if job.phase not in QUEUED or job.id in admitted:
                continue
            reason = default or reasons.get(job.id, "")
            if store_note and store_note not in reason:
                reason = f"{reason}; {store_note}" if reason else store_note
            if job.id in reserved:
                r = reserved[job.id]
                reason = reason or (r.explanation or f"reserved on plan {r.pool} from {r.start_time:.0f}")
            if reason and reason != job.pending_reason and job.phase == PENDING:
                self._set_reason(job.id, reason)

    def _set_reason(self, job_id: str, reason: str) -> None:
        def fn(tx: Tx) -> bool:
            if tx.job.phase != PENDING or tx.job.pending_reason == reason:
                return False
            tx.job.pending_reason = reason
            return True

        self.core.lifecycle.mutate(job_id, fn)
