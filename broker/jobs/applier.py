"""The one write path: compare-and-set an Outcome, then run its commands.

Why here and only here: a transition may be computed several times (each lost CAS
race re-reads the job and re-runs it), but its commands must run exactly once, and
only after the write committed, so an agent never runs an attempt the store does
not know about (a crash between the two leaves a LAUNCHING job whose Launch was
never sent: the agent's reconcile or its timeout relaunches it). The Outcome is
returned to the caller, so nothing leaves the retry loop through side channels.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.api.errors import NotFound as ApiNotFound
from broker.auth.audit import PendingAudit, pending_audit
from broker.jobs.hot_jobs import HotJobs
from broker.jobs.outcome import Command, Outcome, SendGo, SendLaunch, SendStop, WakeScheduler
from broker.store.base import NotFound, Store, StoreError, VersionConflict
from broker.store.group_commit import GroupCommit, LoopSink
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb

if TYPE_CHECKING:
    from broker.agents.registry import AgentRegistry
    from broker.config import BrokerConfig
    from broker.jobs.hub import EventHub
    from broker.telemetry import BrokerTelemetry

log = logging.getLogger(__name__)

# A transition bound to its input: (job, now) -> Outcome, or None to write nothing.
Step = Callable[[pb.Job, float], "Outcome | None"]


class Applier:
    """Writes outcomes (CAS, retried) and executes their commands after commit."""

    def __init__(self, store: Store, hub: EventHub, agents: AgentRegistry, telemetry: BrokerTelemetry,
                 config: BrokerConfig, clock: Callable[[], float] = time.time,
                 max_retries: int = 50) -> None:
        self.store = store
        self.hub = hub
        self.agents = agents
        self.telemetry = telemetry
        self.config = config
        self.clock = clock
        self.max_retries = max_retries
        self._poke: Callable[[], None] = lambda: None
        self._queued: Callable[[], None] = self._poke  # a new job's wake-up (set_poke)
        # Concurrent submits share one store write (broker/store/group_commit.py).
        self.creates = GroupCommit(store)
        # Told every committed job (the scheduler's live-job set, broker/scheduling/live_jobs.py).
        self._listeners: list[Callable[[pb.Job], None]] = []
        # The jobs agents run, as last committed: their streams read them from memory
        # (broker/jobs/hot_jobs.py). Told before the listeners, in _committed.
        self.hot = HotJobs()

    def set_poke(self, poke: Callable[[], None], queued: Callable[[], None] | None = None) -> None:
        """The scheduler loop's wake-up (a no-op while this replica is a standby);
        ``queued``: its wake-up for new jobs alone (default: ``poke``)."""
        self._poke = poke
        self._queued = queued or poke

    def poke(self) -> None:
        self._poke()

    def add_listener(self, fn: Callable[[pb.Job], None]) -> None:
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[pb.Job], None]) -> None:
        if fn in self._listeners:
            self._listeners.remove(fn)

    def get(self, job_id: str) -> pb.Job:
        try:
            return self.store.get_job(job_id)
        except NotFound as e:
            raise ApiNotFound(f"job {job_id!r} not found") from e

    def find(self, job_id: str) -> pb.Job | None:
        """The stored job, or None when there is none."""
        try:
            return self.store.get_job(job_id)
        except NotFound:
            return None

    def apply(self, job_id: str, step: Step, current: pb.Job | None = None) -> Outcome | None:
        """Run ``step`` on the stored job and CAS-write its outcome (re-reading and
        re-running on a conflict); then run the commands. Returns the outcome with
        the stored job (new version), or None when the step wrote nothing.
        ``current``: the job as the caller just read it, used for the first try (the
        version check makes a stale one a conflict, then it is re-read): an agent
        report costs one store read, not two."""
        for _ in range(self.max_retries):
            if current is None or current.id != job_id:
                current = self.get(job_id)
            out = step(current, self.clock())
            if out is None:
                return None
            try:
                stored = self.store.update_job(out.job, current.version, out.events)
            except VersionConflict:
                current = None
                continue
            done = Outcome(job=stored, events=out.events, commands=out.commands)
            self._committed(done)
            return done
        raise RuntimeError(f"job {job_id}: gave up after {self.max_retries} write conflicts")

    def create(self, out: Outcome) -> Outcome:
        """Insert a new job (submit); raises the store's AlreadyExists on a duplicate.
        The calling RPC's audit record, if any, is committed in the same write (one
        commit to wait for, not two: broker/auth/audit.py ``PendingAudit``)."""
        pending = pending_audit()
        stored = self.creates.create(out.job, out.events, (pending.rider(),) if pending else ())
        if pending is not None:
            pending.committed()
        done = Outcome(job=stored, events=out.events, commands=out.commands)
        self._committed(done)
        return done

    async def create_soon(self, out: Outcome, pending: PendingAudit | None,
                          sink: LoopSink) -> Outcome:
        """:meth:`create` for a caller on an event loop (the API workers' grpc.aio
        server): the write joins the group commit through the writer's own thread and
        this coroutine resumes once the group is committed, so the loop never blocks on
        the store. ``pending``: the call's audit record, committed with the job."""
        fut = self.creates.create_soon(sink, out.job, out.events,
                                       (pending.rider(),) if pending else ())

        def committed(f: asyncio.Future) -> None:
            # On the loop, whether or not the caller still waits (a cancelled or timed-out
            # caller's job is stored all the same: the core must hear of it, and its
            # audit record rode along), before the caller resumes.
            if f.cancelled() or f.exception() is not None:
                return
            if pending is not None:
                pending.committed()
            self._committed(Outcome(job=f.result(), events=out.events, commands=out.commands))

        fut.add_done_callback(committed)
        stored = await asyncio.shield(fut)
        return Outcome(job=stored, events=out.events, commands=out.commands)

    def created_elsewhere(self, jobs: list[pb.Job]) -> None:
        """Jobs an API worker process created in the store (broker/api/workers.py): told
        to the listeners and watchers as this process's own creations are, then one
        wake-up of the scheduler for the batch. Creations are the only job writes made
        outside this applier: a new id conflicts with no one, and every later write of
        the job is made here."""
        for job in jobs:
            for fn in list(self._listeners):
                fn(job)
            # Not echoed to the workers: a creation's watchers start after it and read its
            # history from the store (in a storm of submits the echo was ~5% of the CPU).
            self.hub.notify(job.id, tap=False)
        if jobs:
            self._queued()

    def _committed(self, out: Outcome) -> None:
        self.hot.committed(out.job)
        for fn in list(self._listeners):
            fn(out.job)
        if out.events:
            self.hub.notify(out.job.id)
        for cmd in out.commands:
            try:
                self.run(cmd, out.job)
            except StoreError as e:  # store down or fenced: the next pass redoes it
                log.warning("command %s for %s not run: %s: %s", type(cmd).__name__, out.job.id,
                            type(e).__name__, e)
            except Exception:  # noqa: BLE001 - a side effect must not undo a commit
                log.exception("command %s for %s failed", type(cmd).__name__, out.job.id)

    def run(self, cmd: Command, job: pb.Job) -> None:
        """Execute one command; its telemetry (launch/stop spans and counts) goes with it."""
        if isinstance(cmd, WakeScheduler):
            (self._queued if cmd.new_job else self._poke)()
        elif isinstance(cmd, SendLaunch):
            msg = apb.BrokerMessage(launch=cmd.launch)
            self.telemetry.launched(job, msg.launch)  # span + TRACEPARENT in the Launch env
            if not self.agents.send(cmd.agent_id, msg, "launch", cmd.launch.job_id, cmd.launch.attempt):
                log.warning("launch of %s attempt %d: agent %s went away; reconcile/timeout will "
                            "relaunch", cmd.launch.job_id, cmd.launch.attempt, cmd.agent_id)
        elif isinstance(cmd, SendStop):
            self._stop(cmd, job)
        elif isinstance(cmd, SendGo):
            msg = apb.BrokerMessage(go=apb.Go(job_id=cmd.job_id, attempt=cmd.attempt,
                                              resume_from=cmd.resume_from, reason=cmd.reason))
            self.agents.send(cmd.agent_id, msg, "go", cmd.job_id, cmd.attempt)

    def _stop(self, cmd: SendStop, job: pb.Job) -> None:
        if cmd.kind is None:
            self.fence(cmd.agent_id, cmd.job_id, cmd.attempt)
            return
        msg = apb.BrokerMessage(stop=apb.Stop(
            job_id=cmd.job_id, attempt=cmd.attempt, reason=cmd.kind.wire,
            checkpoint_first=cmd.checkpoint_first, grace_s=cmd.grace_s))
        self.telemetry.stop_sent(job, cmd.kind.value, checkpoint_first=cmd.checkpoint_first,
                                 grace_s=cmd.grace_s)
        self.agents.send(cmd.agent_id, msg, "stop", cmd.job_id, cmd.attempt)

    def fence(self, agent_id: str, job_id: str, attempt: int) -> None:
        """Tell an agent to kill an attempt the broker no longer wants (rate-limited)."""
        agent = self.agents.get(agent_id)
        if agent is None:
            return
        now = self.clock()
        key = (job_id, attempt)
        if now - agent.stale_stops.get(key, 0.0) < max(5.0, self.config.heartbeat_interval_s * 2):
            return
        agent.stale_stops[key] = now
        msg = apb.BrokerMessage(stop=apb.Stop(job_id=job_id, attempt=attempt,
                                              reason=apb.STOP_REASON_STALE_ATTEMPT,
                                              checkpoint_first=False, grace_s=0))
        self.agents.send(agent_id, msg, "stop", job_id, attempt)
        log.info("stale attempt %s#%d on %s: sent Stop{STALE_ATTEMPT}", job_id, attempt, agent_id)
