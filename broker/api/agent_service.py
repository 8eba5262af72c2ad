"""AgentService.Connect: one long-lived bidirectional stream per region agent.

Implements docs/contracts.md "Agent stream semantics": Register -> RegisterAck (with the
running attempts the broker no longer wants), heartbeats, JobUpdates fenced by
attempt, command acks. The stream's handler thread drains the agent's outbound
queue (commands from the scheduler and RPC threads); a reader thread consumes what
the agent sends. A stream that ends does not fail the agent's jobs: only silence
for ``agent_timeout_s`` does (the agent may be reconnecting, or we restarting).

This servicer decides nothing about jobs: it translates what the agent says into
job operations (an update) or recovery triggers (a spot notice, a node turning
unhealthy, a missing attempt, a refused launch). Inbound messages are dispatched by
:attr:`AgentService.HANDLERS` (message kind -> method): a new kind is one entry.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from broker.agents.registry import AgentRegistry, AgentSession, AgentState
from broker.api.agent_lanes import MAX_QUEUED, Lanes
from broker.api.errors import InvalidArgument, rpc
from broker.api.validation import validate_register
from broker.auth.identity import CredentialKind, Role
from broker.auth.interceptor import principal_of
from broker.auth.policy import PermissionDenied
from broker.config import BrokerConfig
from broker.jobs import backoff, standby, updates
from broker.jobs.lifecycle import HOLDING, LAUNCHING, QUEUED, RUNNING
from broker.jobs.ops import JobOps
from broker.jobs.recovery import Signal, Trigger
from broker.jobs.updates import ATTEMPT_TERMINAL
from broker.jobs.views import JobsView
from broker.store.base import StoreError
from brokersdk.enums import SPOT_NOTICE_LABEL
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import agent_pb2_grpc
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import logs_pb2 as lpb

log = logging.getLogger(__name__)

# Every this many heartbeats an agent's every listed attempt is checked against the
# store; in between, only entries that changed (AgentService._drift).
DRIFT_FULL_EVERY = 5


def skip_refused(agent_id: str, messages: Iterator[apb.AgentMessage]) -> Iterator[apb.AgentMessage]:
    """The agent's messages, minus those the edge refused (limits, NaN, unknown enums):
    each is logged (one line, no traceback) and dropped; the stream goes on, since one
    bad heartbeat must not cut an agent off from its jobs."""
    while True:
        try:
            msg = next(messages)
        except StopIteration:
            return
        except InvalidArgument as e:
            log.warning("agent %s sent a message the broker refused: %s", agent_id, e.message)
            continue
        yield msg


def _progress_sig(r: apb.RunningAttempt) -> bytes | None:
    """A listed progress as bytes, its ``updated_time`` aside: the stored progress is
    compared without it too (``updates.tells_nothing_new``), and an agent that stamps
    each listing with the time it made it must not make every entry look new. None:
    the entry lists no progress (touching ``r.progress`` would make it list one)."""
    if not r.HasField("progress"):
        return None
    p = r.progress
    t = p.updated_time
    p.updated_time = 0
    try:
        return p.SerializeToString(deterministic=True)
    finally:
        p.updated_time = t


class AgentService(agent_pb2_grpc.AgentServiceServicer):
    """``leading``: is this replica still the leader? Checked before applying each agent
    message, so a replica that lost its lease (e.g. resumed after SIGSTOP) stops acting
    on agents at once, before its leadership thread even notices."""

    # Inbound message kind (AgentMessage oneof) -> handler method name.
    HANDLERS: dict[str, str] = {
        "heartbeat": "_heartbeat",
        "job_update": "_job_update",
        "ack": "_ack",
        "log_chunk": "_log_chunk",
        "register": "_register_again",
    }

    def __init__(self, ops: JobOps, jobs: JobsView, agents: AgentRegistry, config: BrokerConfig,
                 leading: Callable[[], bool] = lambda: True, broker_id: str = "") -> None:
        self.ops = ops
        self.jobs = jobs
        self.agents = agents
        self.config = config
        self.leading = leading
        self.broker_id = broker_id

    @rpc
    def Connect(self, request_iterator: Iterator[apb.AgentMessage],
                context: grpc.ServicerContext) -> Iterator[apb.BrokerMessage]:
        try:
            first = next(request_iterator)
        except StopIteration:
            return
        if first.WhichOneof("msg") != "register":
            raise InvalidArgument("the first message on the agent stream must be Register")
        reg = first.register
        self._check_identity(reg, context)
        self._validate_register(reg)
        before = self.agents.get(reg.agent_id)
        old_fp = backoff.fingerprint(before.record) if before is not None else None
        agent, session = self.agents.register(reg)
        if old_fp is not None and old_fp != backoff.fingerprint(reg):
            self._forget_refusals(reg.agent_id)
        agent.heartbeat_seen = {}  # a new stream: its first heartbeat checks every entry
        stale = self.reconcile(agent, reg)
        log.info("agent %s registered (%s, %d nodes, running %d, stale %d)", reg.agent_id,
                 reg.region, len(reg.nodes), len(reg.running), len(stale))
        yield apb.BrokerMessage(registered=apb.RegisterAck(
            agent_id=reg.agent_id, heartbeat_interval_s=self.config.heartbeat_interval_s,
            agent_timeout_s=self.config.agent_timeout_s,
            stale_job_ids=stale,
            log_offsets=self.ops.job_logs.offsets_for(r.job_id for r in reg.running)))
        # Known attempts the agent reported: take their state (it may have progressed).
        for r in reg.running:
            # A finished attempt listed here carries no exit code or message: taking it as
            # the attempt's end made a FAILED one look like "exit 0" (the fault campaign
            # saw jobs fail at once). The agent re-sends the full JobUpdate of every
            # unacknowledged end right after this RegisterAck (contracts §9).
            if r.job_id not in stale and r.state not in ATTEMPT_TERMINAL:
                self.ops.handle_update(agent, updates.listed(self.jobs.find(r.job_id), r))
        self.ops.poke()
        reader = threading.Thread(target=self._read, args=(agent, session, request_iterator),
                                  name=f"agent-{reg.agent_id}", daemon=True)
        reader.start()
        try:
            while context.is_active() and not session.closed.is_set():
                try:
                    msg = session.out.get(timeout=1.0)
                except queue.Empty:
                    continue
                if msg is None:
                    break
                yield msg
        finally:
            self.agents.disconnect(reg.agent_id, session)
            log.info("agent %s stream ended", reg.agent_id)

    def _forget_refusals(self, agent_id: str) -> None:
        """The agent came back configured differently (e.g. a new ``--checkpoint-root``):
        the jobs it refused may try it again now instead of after their backoff."""
        now = self.ops.clock()
        for job in self.jobs.iter(phases=QUEUED):
            if agent_id in backoff.avoided_agents(job, now):
                self.ops.refusals_forgotten(job.id, agent_id)

    def _check_identity(self, reg: apb.Register, context: grpc.ServicerContext) -> None:
        """An agent speaks only for the region and agent id its certificate names
        (broker/auth/identity.py); so no other credential can take over a live agent id."""
        who = principal_of(context)
        if who.credential is CredentialKind.INSECURE_DEV:
            return
        if who.role is not Role.AGENT:
            raise PermissionDenied(f"{who.actor} is not a region agent")
        if reg.agent_id != who.name or reg.region != who.region:
            raise PermissionDenied(
                f"this certificate is for agent {who.name!r} in region {who.region!r}; it may not"
                f" register as agent {reg.agent_id!r} in region {reg.region!r}")
        for n in reg.nodes:
            if n.region and n.region != who.region:
                raise PermissionDenied(f"node {n.id!r} claims region {n.region!r}, but this"
                                       f" agent's certificate is for region {who.region!r}")

    def _assigned(self, agent_id: str, job_id: str, attempt: int, job: pb.Job | None = None) -> bool:
        """Was attempt ``attempt`` of the job launched on this agent? Updates and logs
        about anything else change nothing (a forged JobUpdate from another agent).
        ``job``: the job as the caller just read it (None: read it here)."""
        job = job if job is not None else self.jobs.find(job_id)
        if job is None:
            return True  # unknown: handle_update only tells the sender to stop it
        if job.placement.agent_id == agent_id and job.attempt == attempt:
            return True
        if (job.HasField("standby") and job.standby.attempt == attempt
                and job.standby.placement.agent_id == agent_id):
            return True  # a make-before-break standby (launched before it is the job's attempt)
        return any(ev.type == "launched" and ev.attempt == attempt
                   and ev.details.get("agent") == agent_id for ev in self.jobs.events(job_id))

    def _validate_register(self, reg: apb.Register) -> None:
        """The inventory is user input too (issue 12): limits and enums were checked at
        the edge (check_message); here the rules that need the registry. A bad node
        refuses the whole Register: the agent hears why (INVALID_ARGUMENT on its stream)
        and nothing of it reaches the store or the scheduler."""
        validate_register(reg)
        for n in reg.nodes:
            other = self.agents.find_node(n.id)
            if other is not None and other[0].agent_id != reg.agent_id:
                raise InvalidArgument(
                    f"node {n.id!r} is already registered by agent {other[0].agent_id!r}")

    # ---- reconcile (contracts "Agent stream semantics" rule 6) --------------------------
    def reconcile(self, agent: AgentState, reg: apb.Register) -> list[str]:
        """Keep attempts the broker expects, stop stale ones, relaunch missing ones."""
        stale: list[str] = []
        reported: set[str] = set()
        for r in reg.running:
            job = self.jobs.find(r.job_id)
            if job is not None and self.ops.is_current(job, agent.agent_id, r.attempt):
                reported.add(r.job_id)
            elif job is not None and standby.is_standby(job, agent.agent_id, r.attempt):
                continue  # a make-before-break standby waiting for its go: keep it
            else:
                stale.append(r.job_id)
        for job in self.jobs.iter(phases=HOLDING):
            if standby.waiting(job) and job.standby.placement.agent_id == agent.agent_id and not any(
                    r.job_id == job.id and r.attempt == job.standby.attempt for r in reg.running):
                self.ops.standby_missing(job.id, agent.agent_id)
            if job.placement.agent_id != agent.agent_id or job.id in reported:
                continue
            self.ops.attempt_lost(job.id, agent.agent_id, Trigger.ATTEMPT_MISSING, attempt=job.attempt,
                                  message=f"agent {agent.agent_id} re-registered without attempt"
                                          f" {job.attempt}")
        return stale

    # ---- inbound -----------------------------------------------------------------------
    def _read(self, agent: AgentState, session: AgentSession,
              request_iterator: Iterator[apb.AgentMessage]) -> None:
        """Read the agent's messages: a job's updates and log chunks go to its lane
        (broker/api/agent_lanes.py: several in flight, in order per job); the rest is a
        barrier across the lanes (applied after everything sent before it, before
        anything sent after it), except an accepted command ack, handled here."""
        lanes = Lanes(lambda item: self._handle(agent, session, *item),  # type: ignore[misc]
                      name=f"agent-{agent.agent_id}")
        try:
            for msg in skip_refused(agent.agent_id, request_iterator):
                if not self.leading():
                    log.warning("agent %s: not the leader any more; dropping its stream",
                                agent.agent_id)
                    session.close()
                    break
                if not self.agents.touch(agent.agent_id, session):
                    break  # superseded by a newer stream of the same agent
                if not self._room(agent, session, lanes):
                    break
                kind = msg.WhichOneof("msg")
                handler = self.HANDLERS.get(kind or "")
                if handler is None:
                    log.warning("agent %s sent an unknown message kind %r; ignored", agent.agent_id, kind)
                    continue
                payload = getattr(msg, kind)
                if kind in ("job_update", "log_chunk"):
                    lanes.put(payload.job_id, (kind, payload))
                    continue
                if kind == "ack" and payload.accepted:
                    self._handle(agent, session, kind, payload)
                    continue
                # A heartbeat or a refusal sees every earlier message applied and no later
                # one; the reader goes on reading meanwhile (agent_lanes.py says why).
                lanes.barrier(functools.partial(self._handle, agent, session, kind, payload))
        except grpc.RpcError:
            pass
        except Exception:  # noqa: BLE001
            log.exception("agent %s: stream reader failed", agent.agent_id)
        finally:
            lanes.drain()  # the stream ends once all it carried is applied, as before
            lanes.close()
            self.agents.disconnect(agent.agent_id, session)

    def _room(self, agent: AgentState, session: AgentSession, lanes: Lanes) -> bool:
        """Wait while this stream's lanes hold ``MAX_QUEUED`` messages (False: the stream
        was superseded meanwhile). The agent stays seen while it waits: it is the
        leader that is behind, not the agent that is silent."""
        while not lanes.wait_below(MAX_QUEUED, 1.0):
            if session.closed.is_set() or not self.agents.touch(agent.agent_id, session):
                return False
        return True

    def _handle(self, agent: AgentState, session: AgentSession, kind: str, payload: object) -> None:
        """Apply one message and send its reply (a JobUpdate's ack once committed)."""
        try:
            getattr(self, self.HANDLERS[kind])(agent, payload)
            reply = self._reply(kind, payload)
            if reply is not None:
                session.send(reply)
        except StoreError as e:  # store down or fenced: the agent re-sends, unacked
            log.warning("agent %s: %s not applied (%s: %s); not acked",
                        agent.agent_id, kind, type(e).__name__, e)
            if kind == "heartbeat" and self.leading():
                # We are alive and still lead; only the store is down. Silence
                # would make the agent churn through reconnects for nothing.
                session.send(self._heartbeat_ack())
        except Exception:  # noqa: BLE001 - one bad message must not kill the stream
            log.exception("agent %s: handling %s failed", agent.agent_id, kind)

    def _register_again(self, agent: AgentState, reg: apb.Register) -> None:
        log.warning("agent %s sent Register twice on one stream; ignored", agent.agent_id)

    def _job_update(self, agent: AgentState, u: apb.JobUpdate) -> None:
        # An end is acknowledged (the agent then forgets it), so what the broker judges it
        # on must be on a replica: a re-sent end whose first write reached only the primary
        # (its WAIT timed out: not acknowledged) reads as already applied, and acking that
        # read acknowledged an end a failover would lose. The read is confirmed, and so is
        # whatever the handling read after it (a re-read on a write conflict).
        terminal = u.state in ATTEMPT_TERMINAL
        job = self.jobs.find_confirmed(u.job_id) if terminal else self.jobs.find_live(u.job_id)
        if not self._assigned(agent.agent_id, u.job_id, u.attempt, job):
            log.warning("agent %s sent an update for %s attempt %d, which it never ran: ignored",
                        agent.agent_id, u.job_id, u.attempt)
            if u.state not in ATTEMPT_TERMINAL:
                self.ops.fence(agent.agent_id, u.job_id, u.attempt)  # tells only the sender
            return
        self.ops.handle_update(agent, u, job)
        if terminal:
            self.jobs.confirm_replicated()

    def _heartbeat(self, agent: AgentState, hb: apb.Heartbeat) -> None:
        health = {h.node_id: h for h in hb.node_health}
        sick: list[str] = []
        if health:
            def apply(n: pb.Node) -> bool:
                h = health.get(n.id)
                if h is None or n.healthy == h.healthy:
                    return False
                if not h.healthy:
                    sick.append(n.id)
                n.healthy = h.healthy
                return True

            if self.agents.update_nodes(agent.agent_id, apply):
                self.ops.poke()
        if hb.HasField("store_probe"):
            err = hb.store_probe.error[:1000]
            if self.agents.set_store_probe(agent.agent_id, err, hb.store_probe.since or time.time(),
                                           hb.store_probe.outage):
                self.ops.poke()
        if hb.spot_notices:
            self._spot(agent, hb)
        self._notices_withdrawn(agent, hb, health)
        if sick:
            self._unhealthy(agent, set(sick) - {s.node_id for s in hb.spot_notices})
        self._drift(agent, hb)

    def _drift(self, agent: AgentState, hb: apb.Heartbeat) -> None:
        """Attempts the agent runs that the broker does not want: fence them; a Go lost
        to a restart: re-send it; progress only a heartbeat carried: take it.

        Why not every entry every time: a heartbeat lists every running attempt, so with
        thousands running this was a store read per attempt per heartbeat (thousands a
        second). An entry identical to the one the previous heartbeat listed for a job
        then found plainly running here (no stop, no standby, not launching) with that
        progress already stored is skipped, except on every ``DRIFT_FULL_EVERY``-th heartbeat, which checks them
        all: the broker tells an agent of every stop and move itself; this check only
        catches a lost one, now within a few heartbeats instead of one."""
        agent.heartbeats += 1
        full = agent.heartbeats % DRIFT_FULL_EVERY == 0
        seen = agent.heartbeat_seen
        now_seen: dict[str, tuple[int, int, bytes | None]] = {}
        for r in hb.running:
            sig = (r.attempt, r.state, _progress_sig(r))
            if not full and seen.get(r.job_id) == sig:
                now_seen[r.job_id] = sig
                continue
            job = self.jobs.find_live(r.job_id)
            if job is not None and standby.is_standby(job, agent.agent_id, r.attempt):
                continue  # make-before-break: held before its first step, not stale
            if job is None or not self.ops.is_current(job, agent.agent_id, r.attempt):
                self.ops.fence(agent.agent_id, r.job_id, r.attempt)
                continue
            self.ops.resend_go(job, agent.agent_id, r.attempt)  # a Go lost to a restart
            u = updates.listed(job, r)
            stored = updates.tells_nothing_new(job, u)
            if r.HasField("progress") and job.phase in (LAUNCHING, RUNNING) and not stored:
                self.ops.handle_update(agent, u, job)  # news (it may wait for the throttle)
            if stored and job.phase == RUNNING and not job.stop_reason and not job.HasField("standby"):
                now_seen[r.job_id] = sig  # in the store as listed: skipped while unchanged
        agent.heartbeat_seen = now_seen

    def _jobs_on(self, agent: AgentState, nodes: set[str] | dict[str, float]) -> list[tuple[pb.Job, list[str]]]:
        """This agent's jobs holding GPUs on any of ``nodes``, with the nodes they hit."""
        out = []
        for job in self.jobs.iter(phases=HOLDING):
            if job.placement.agent_id != agent.agent_id:
                continue
            hit = [a.node_id for a in job.placement.nodes if a.node_id in nodes]
            if hit:
                out.append((job, hit))
        return out

    def _spot(self, agent: AgentState, hb: apb.Heartbeat) -> None:
        """A 2-minute warning: trigger SPOT_NOTICE for the jobs on those nodes."""
        doomed = {s.node_id: s.deadline_time for s in hb.spot_notices}

        def mark(n: pb.Node) -> bool:
            if n.id in doomed and n.healthy:
                n.healthy = False
                n.labels[SPOT_NOTICE_LABEL] = f"{doomed[n.id]:.0f}"  # shown as "reclaimed"
                agent.spot_marked.add(n.id)
                return True
            return False

        self.agents.update_nodes(agent.agent_id, mark)
        fresh = {n: d for n, d in doomed.items() if n not in agent.spot_triggered}
        agent.spot_triggered |= fresh.keys()
        for job, hit in self._jobs_on(agent, fresh):
            deadline = min(fresh[n] for n in hit)
            self.ops.trigger(job.id, Signal(Trigger.SPOT_NOTICE, nodes=tuple(hit), deadline=deadline),
                             actor=f"agent:{agent.agent_id}",
                             message=f"spot interruption notice for {', '.join(hit)}:"
                                     " emergency checkpoint, then moving",
                             details={"nodes": ",".join(hit), "deadline": f"{deadline:.0f}"})
        self.ops.poke()

    def _notices_withdrawn(self, agent: AgentState, hb: apb.Heartbeat,
                           health: dict[str, apb.NodeHealth]) -> None:
        """A spot notice the agent no longer reports (withdrawn before its deadline, or
        the reclaim never came) gives back the node the broker took out for it, unless
        the agent itself now calls the node unhealthy. Every heartbeat lists the active
        notices, so absence is withdrawal."""
        # A node the agent itself now calls unhealthy (reclaimed at the deadline) is the
        # agent's to give back, by a health change, not by the notice going away.
        active = {s.node_id for s in hb.spot_notices}
        agent.spot_triggered &= active
        agent.spot_marked -= {n for n, h in health.items() if not h.healthy}
        if not agent.spot_marked:
            return
        back = {n for n in agent.spot_marked - active
                if n not in health or health[n].healthy}
        if not back:
            return
        agent.spot_marked -= back

        def restore(n: pb.Node) -> bool:
            if n.id in back and not n.healthy:
                n.healthy = True
                n.labels.pop(SPOT_NOTICE_LABEL, None)  # no longer "reclaimed"
                return True
            return False

        if self.agents.update_nodes(agent.agent_id, restore):
            log.info("agent %s: spot notice withdrawn, node(s) %s healthy again",
                     agent.agent_id, ", ".join(sorted(back)))
            self.ops.poke()

    def _unhealthy(self, agent: AgentState, sick: set[str]) -> None:
        """Nodes the agent reports unhealthy: trigger NODE_UNHEALTHY for the jobs on them
        (the policy decides: an elastic job moves with a checkpoint; others stay)."""
        for job, hit in self._jobs_on(agent, sick):
            self.ops.trigger(job.id, Signal(Trigger.NODE_UNHEALTHY, nodes=tuple(hit)),
                             actor=f"agent:{agent.agent_id}",
                             message=f"node(s) {', '.join(hit)} unhealthy: checkpointing to move"
                                     " off them", details={"nodes": ",".join(hit)})

    def _heartbeat_ack(self) -> apb.BrokerMessage:
        return apb.BrokerMessage(heartbeat_ack=apb.HeartbeatAck(time=time.time(),
                                                                broker_id=self.broker_id))

    def _reply(self, kind: str, payload: object) -> apb.BrokerMessage | None:
        """What the agent hears once a message was applied: a heartbeat is answered (after
        it was handled, so a leader hung on its store is silent and the agent rotates), and
        a JobUpdate is acked once committed or deliberately ignored as stale (the agent
        re-sends unacked terminal updates: contracts §9)."""
        if kind == "heartbeat":
            return self._heartbeat_ack()
        if kind == "job_update":
            assert isinstance(payload, apb.JobUpdate)
            return apb.BrokerMessage(update_ack=apb.JobUpdateAck(
                job_id=payload.job_id, attempt=payload.attempt, state=payload.state))
        return None

    def _log_chunk(self, agent: AgentState, chunk: lpb.LogChunk) -> None:
        job = self.jobs.find_live(chunk.job_id)  # read once for the check and the ingest
        if not self._assigned(agent.agent_id, chunk.job_id, chunk.attempt, job):
            log.warning("agent %s sent logs of %s attempt %d, which it never ran: ignored",
                        agent.agent_id, chunk.job_id, chunk.attempt)
            return
        self.ops.job_logs.ingest(agent.agent_id, chunk, job)

    def _ack(self, agent: AgentState, ack: apb.CommandAck) -> None:
        cmd = self.agents.pop_command(ack.command_id)
        if cmd is None or ack.accepted:
            return
        log.warning("agent %s refused %s of %s#%d: %s", agent.agent_id, cmd.kind, cmd.job_id,
                    cmd.attempt, ack.message)
        if cmd.kind == "launch":
            # Backoff, avoidance and giving up: broker/jobs/backoff.py (contracts §6 rule 12).
            self.ops.attempt_lost(cmd.job_id, agent.agent_id, Trigger.LAUNCH_REFUSED, attempt=cmd.attempt,
                                  message=f"agent {agent.agent_id} refused the launch: {ack.message}",
                                  reason=ack.message)
