"""AgentService.Connect: one long-lived bidirectional stream per region agent.

Implements TEAM.md "Agent stream semantics": Register -> RegisterAck (with the
running attempts the broker no longer wants), heartbeats, JobUpdates fenced by
attempt, command acks. The stream's handler thread drains the agent's outbound
queue (commands from the scheduler and RPC threads); a reader thread consumes what
the agent sends. A stream that ends does not fail the agent's jobs: only silence
for ``agent_timeout_s`` does (the agent may be reconnecting, or we restarting).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from broker.agents.registry import AgentSession, AgentState
from broker.api.errors import InvalidArgument, rpc
from broker.jobs.core import BrokerCore
from broker.jobs.lifecycle import HOLDING, LAUNCHING, RUNNING
from broker.store.base import NotFound, StoreError
from broker.store.jobs_query import iter_jobs
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import agent_pb2_grpc
from computebroker.v1 import common_pb2 as pb

log = logging.getLogger(__name__)


class AgentService(agent_pb2_grpc.AgentServiceServicer):
    """``leading``: is this replica still the leader? Checked before applying each agent
    message, so a replica that lost its lease (e.g. resumed after SIGSTOP) stops acting
    on agents at once, before its leadership thread even notices (issue 15 defect 7)."""

    def __init__(self, core: BrokerCore, leading: Callable[[], bool] = lambda: True,
                 broker_id: str = "") -> None:
        self.core = core
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
        self._validate_register(reg)
        agent, session = self.core.agents.register(reg)
        stale = self.reconcile(agent, reg)
        log.info("agent %s registered (%s, %d nodes, running %d, stale %d)", reg.agent_id,
                 reg.region, len(reg.nodes), len(reg.running), len(stale))
        yield apb.BrokerMessage(registered=apb.RegisterAck(
            agent_id=reg.agent_id, heartbeat_interval_s=self.core.config.heartbeat_interval_s,
            stale_job_ids=stale))
        # Known attempts the agent reported: take their state (it may have progressed).
        for r in reg.running:
            if r.job_id not in stale:
                self.core.handle_update(agent, apb.JobUpdate(
                    job_id=r.job_id, attempt=r.attempt, state=r.state, progress=r.progress))
        self.core.poke()
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
            self.core.agents.disconnect(reg.agent_id, session)
            log.info("agent %s stream ended", reg.agent_id)

    def _validate_register(self, reg: apb.Register) -> None:
        if not reg.agent_id:
            raise InvalidArgument("Register.agent_id is empty")
        if not reg.region:
            raise InvalidArgument("Register.region is empty")
        seen: set[str] = set()
        for n in reg.nodes:
            if not n.id:
                raise InvalidArgument("a registered node has an empty id")
            if n.id in seen:
                raise InvalidArgument(f"node id {n.id!r} appears twice in Register")
            if n.gpus < 0:
                raise InvalidArgument(f"node {n.id!r} has a negative GPU count")
            seen.add(n.id)
            other = self.core.agents.find_node(n.id)
            if other is not None and other[0].agent_id != reg.agent_id:
                raise InvalidArgument(
                    f"node {n.id!r} is already registered by agent {other[0].agent_id!r}")

    # ---- reconcile (TEAM.md rule 6) -------------------------------------------------
    def reconcile(self, agent: AgentState, reg: apb.Register) -> list[str]:
        """Keep attempts the broker expects, stop stale ones, relaunch missing ones."""
        core = self.core
        stale: list[str] = []
        reported: set[str] = set()
        for r in reg.running:
            try:
                job = core.store.get_job(r.job_id)
            except NotFound:
                stale.append(r.job_id)
                continue
            if core.is_current(job, agent.agent_id, r.attempt):
                reported.add(r.job_id)
            else:
                stale.append(r.job_id)
        for job in iter_jobs(core.store, phases=HOLDING):
            if job.placement.agent_id != agent.agent_id or job.id in reported:
                continue
            core.fail_over(job.id, agent.agent_id, reason="attempt_missing", attempt=job.attempt,
                           message=f"agent {agent.agent_id} re-registered without attempt"
                                   f" {job.attempt}")
        return stale

    # ---- inbound -----------------------------------------------------------------------
    def _read(self, agent: AgentState, session: AgentSession,
              request_iterator: Iterator[apb.AgentMessage]) -> None:
        try:
            for msg in request_iterator:
                if not self.leading():
                    log.warning("agent %s: not the leader any more; dropping its stream",
                                agent.agent_id)
                    session.close()
                    break
                if not self.core.agents.touch(agent.agent_id, session):
                    break  # superseded by a newer stream of the same agent
                kind = msg.WhichOneof("msg")
                try:
                    if kind == "heartbeat":
                        self._heartbeat(agent, msg.heartbeat)
                        # Liveness for the agent: answered after the heartbeat was handled,
                        # so a leader hung on its store is silent too.
                        session.send(apb.BrokerMessage(heartbeat_ack=apb.HeartbeatAck(
                            time=time.time(), broker_id=self.broker_id)))
                    elif kind == "job_update":
                        u = msg.job_update
                        self.core.handle_update(agent, u)
                        # Acked only once applied (or deliberately ignored as stale); a store
                        # error skips the ack and the agent re-sends (defect 6).
                        session.send(apb.BrokerMessage(update_ack=apb.JobUpdateAck(
                            job_id=u.job_id, attempt=u.attempt, state=u.state)))
                    elif kind == "ack":
                        self._ack(agent, msg.ack)
                    elif kind == "register":
                        log.warning("agent %s sent Register twice on one stream; ignored",
                                    agent.agent_id)
                except StoreError as e:  # store down or fenced: the agent re-sends, unacked
                    log.warning("agent %s: %s not applied (%s: %s); not acked",
                                agent.agent_id, kind, type(e).__name__, e)
                    if kind == "heartbeat" and self.leading():
                        # We are alive and still lead; only the store is down. Silence
                        # would make the agent churn through reconnects for nothing.
                        session.send(apb.BrokerMessage(heartbeat_ack=apb.HeartbeatAck(
                            time=time.time(), broker_id=self.broker_id)))
                except Exception:  # noqa: BLE001 - one bad message must not kill the stream
                    log.exception("agent %s: handling %s failed", agent.agent_id, kind)
        except grpc.RpcError:
            pass
        except Exception:  # noqa: BLE001
            log.exception("agent %s: stream reader failed", agent.agent_id)
        finally:
            self.core.agents.disconnect(agent.agent_id, session)

    def _heartbeat(self, agent: AgentState, hb: apb.Heartbeat) -> None:
        core = self.core
        health = {h.node_id: h for h in hb.node_health}
        if health:
            def apply(n: pb.Node) -> bool:
                h = health.get(n.id)
                if h is None or n.healthy == h.healthy:
                    return False
                n.healthy = h.healthy
                return True

            if core.agents.update_nodes(agent.agent_id, apply):
                core.poke()
        if hb.spot_notices:
            self._spot(agent, hb)
        # Drift: attempts the agent runs that the broker does not want -> fence them.
        for r in hb.running:
            try:
                job = core.store.get_job(r.job_id)
            except NotFound:
                core.send_stale_stop(agent, r.job_id, r.attempt)
                continue
            if not core.is_current(job, agent.agent_id, r.attempt):
                core.send_stale_stop(agent, r.job_id, r.attempt)
            elif r.HasField("progress") and job.phase in (LAUNCHING, RUNNING):
                core.handle_update(agent, apb.JobUpdate(job_id=r.job_id, attempt=r.attempt,
                                                        state=r.state, progress=r.progress))

    def _spot(self, agent: AgentState, hb: apb.Heartbeat) -> None:
        """A 2-minute warning: checkpoint the jobs on those nodes now and move them."""
        core = self.core
        doomed = {s.node_id: s.deadline_time for s in hb.spot_notices}

        def mark(n: pb.Node) -> bool:
            if n.id in doomed and n.healthy:
                n.healthy = False
                return True
            return False

        core.agents.update_nodes(agent.agent_id, mark)
        now = core.clock()
        for job in iter_jobs(core.store, phases=HOLDING):
            if job.placement.agent_id != agent.agent_id:
                continue
            hit = [a.node_id for a in job.placement.nodes if a.node_id in doomed]
            if not hit:
                continue
            deadline = min(doomed[n] for n in hit)
            grace = max(5.0, deadline - now - 10.0) if deadline else core.config.preempt_grace_s
            core.request_stop(job.id, "migrate", actor=f"agent:{agent.agent_id}",
                              reason="spot_interruption", grace_s=grace,
                              message=f"spot interruption notice for {', '.join(hit)}:"
                                      " emergency checkpoint, then moving",
                              details={"nodes": ",".join(hit), "deadline": f"{deadline:.0f}"})
        core.poke()

    def _ack(self, agent: AgentState, ack: apb.CommandAck) -> None:
        cmd = self.core.agents.pop_command(ack.command_id)
        if cmd is None or ack.accepted:
            return
        log.warning("agent %s refused %s of %s#%d: %s", agent.agent_id, cmd.kind, cmd.job_id,
                    cmd.attempt, ack.message)
        if cmd.kind == "launch":
            self.core.fail_over(cmd.job_id, agent.agent_id, reason="launch_refused",
                                attempt=cmd.attempt,
                                message=f"agent {agent.agent_id} refused the launch: {ack.message}")
