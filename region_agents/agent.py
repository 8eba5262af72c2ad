"""The region agent daemon: ``brokerctl agent`` (docs/contracts.md section 6, "Agent stream semantics").

Why this shape: the agent dials *out* (regions need no inbound ports) over one
bidirectional ``AgentService.Connect`` stream, and everything it knows lives in
this process, not in the stream. A broker restart or a network blip therefore
costs nothing but a reconnect: trainer processes keep running, the agent
re-registers with what it runs, and the broker reconciles (like an Armada
executor or a kubelet re-syncing after an API server outage).

Threads (all daemon):
* connector: dial, Register, receive commands; reconnect with exponential
  backoff (tenacity, capped at ``max_backoff_s``) forever until stopped.
* ticker: poll the executor (state changes, progress at most ~1/s per job),
  poll node signals (spot notices, health flips), send Heartbeats, re-send terminal
  updates the broker has not acknowledged, and watch the leader's liveness.

Issue 15 hardening (docs/contracts.md §9): the channel has gRPC
keepalives, and a broker that sends nothing (no HeartbeatAck, ack or command) for
``leader_timeout_s`` is treated as hung: the stream is dropped and the next
``--broker`` address is dialled (a SIGSTOPped leader never closes its socket). A
terminal JobUpdate is kept until the broker acknowledges it (JobUpdateAck, sent after
the store commit) and re-sent on every reconnect and every few heartbeats. Attempts
survive an agent restart: the local executor keeps durable records and re-adopts them.

Self-fence (cross-host fencing): an agent that has not heard a broker answer for
``self_fence_s`` (3/4 of the broker's ``agent_timeout_s``, told in RegisterAck) kills its
own attempts, so a partitioned agent's ranks are gone before the broker can declare it
lost and relaunch its jobs elsewhere (region_agents/fencing.py states the invariant).

Over 400 lines on purpose: :class:`RegionAgent` is one object whose two threads share
its state (attempts, staging, unacknowledged updates, the live session), and the message
handlers, the tick and the reconnect logic each read all of it; the pieces with a job of
their own are already modules (config.py, session.py, staging.py, fencing.py, signals.py,
logship.py).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable

import grpc
from tenacity import Retrying, retry_if_exception_type, stop_when_event_set, wait_exponential

from broker.stop_signals import StopSignals
from brokersdk.credentials import make_channel
from checkpoint_layout.roots import RootError, canonical, check_under
from checkpoint_layout.standby_go import Go, GoAction
from computebroker.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from region_agents.config import AgentConfig, broker_credentials, make_executor
from region_agents.executors.base import (
    AS,
    EXIT_RESUME_UNAVAILABLE,
    EXIT_STORE_UNAVAILABLE,
    TERMINAL_STATES,
    AttemptEvent,
    AttemptSpec,
    Executor,
)
from region_agents.fencing import AttemptLedger, BrokerContact, lease_margin, self_fence_after
from region_agents.inventory import Inventory, InventoryError
from region_agents.logship import LogShipper
from region_agents.resume_views import resume_refusal
from region_agents.session import Session
from region_agents.signals import NodeSignals
from region_agents.staging import Staging, copy_tuning, drop_if_superseded, plan_staging, under
from region_agents.staging import s3_client as staging_s3_client
from region_agents.store_probe import probe_store, resolve_store
from region_agents.workdir import WorkdirCache

log = logging.getLogger("region_agents.agent")

AGENT_VERSION = "0.1.0"
DEFAULT_HEARTBEAT_S = 2.0
RECENT_TERMINAL_S = 120.0  # how long a finished attempt is re-reported on re-register
LEADER_TIMEOUT_HEARTBEATS = 4.0  # silent broker for this many heartbeat intervals = hung
MIN_LEADER_TIMEOUT_S = 6.0
MIN_RESEND_S = 5.0  # unacked terminal updates are re-sent at most this often
PARK_WAIT_S = 900.0  # a pre-copy report waits at most this long for its standby to park
# gRPC keepalive on the agent's channel: a peer that stops answering HTTP/2 pings (host
# gone, link cut) fails the stream even when no message is due. The broker's server
# options permit pings every 5 s (broker/server.py).
CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


def rpc_error_text(e: grpc.RpcError) -> str:
    """``UNAVAILABLE: failed to connect ...`` on one line: the default repr of a stream's
    error is a five-line dump, printed on every (re)connect attempt while a broker starts."""
    code, details = getattr(e, "code", None), getattr(e, "details", None)
    if callable(code) and callable(details):
        name, text = getattr(code(), "name", str(code())), details()
        return f"{name}: {text}" if text else name
    return str(e)


class _Disconnected(Exception):
    """The stream ended before the broker acknowledged our Register."""


# The broker refuses longer texts (broker/api/limits.py): clip them here, so an unusual
# error text can never make a terminal update undeliverable (re-sent forever).
ACK_MESSAGE_MAX = 4000
UPDATE_MESSAGE_MAX = 60_000


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, keeping its end (errors say most there)."""
    return text if len(text) <= limit else "..." + text[-(limit - 3):]


class RegionAgent:
    """One region's agent. ``start()`` returns at once; ``stop()`` joins the threads."""

    def __init__(self, config: AgentConfig, executor: Executor | None = None,
                 inventory: Inventory | None = None) -> None:
        self.config = config
        if executor is None or inventory is None:
            made_ex, made_inv = make_executor(config)
            executor = executor or made_ex
            inventory = inventory or made_inv
        if config.region and inventory.region and config.region != inventory.region:
            raise ValueError(
                f"--region {config.region!r} does not match the inventory's region {inventory.region!r}"
            )
        inventory.checkpoint_bucket = resolve_store(inventory.checkpoint_bucket)
        self.inventory = inventory
        # Probe the checkpoint store once (Register.checkpoint_store_error); a broken
        # store keeps this region out of placements instead of failing jobs later.
        self.store_error, self.store_outage = probe_store(inventory.checkpoint_bucket)
        self.store_error_since = time.time() if self.store_error else 0.0
        self._store_probed_at = time.time()
        self._store_probe_changed = False
        if self.store_error:
            log.error("checkpoint store %s is not usable: %s", inventory.checkpoint_bucket,
                      self.store_error)
        self.region = config.region or inventory.region
        self.agent_id = config.agent_id or inventory.agent_id or f"{self.region}-agent"
        self.executor = executor
        os.makedirs(config.work_dir, exist_ok=True)
        self.signals = NodeSignals(config.work_dir, {n.id: n.healthy for n in inventory.nodes})
        self.ledger = AttemptLedger()
        # Terminal updates not yet acknowledged by the broker (re-sent until they are).
        self._unacked: dict[tuple[str, int], agent_pb2.JobUpdate] = {}
        self._recent_terminal: dict[tuple[str, int], tuple[float, agent_pb2.JobUpdate]] = {}
        for job_id, attempt in executor.known_attempts().items():
            self.ledger.seen(job_id, attempt)
        for ev in executor.recover():  # attempts a previous agent process left behind
            upd = ev.to_proto()
            self._unacked[(ev.job_id, ev.attempt)] = upd
            self._recent_terminal[(ev.job_id, ev.attempt)] = (time.time(), upd)
        for r in executor.running():  # adopted attempts (e.g. Kubernetes Jobs after a restart)
            self.ledger.launched(r.job_id, r.attempt)
        self.heartbeat_interval_s = config.heartbeat_interval_s or DEFAULT_HEARTBEAT_S
        self.draining = False
        self.connects = 0  # successful registrations (tests and logs)
        # HA: --broker may list several replicas ("a:1,b:2"); a dial that does not reach
        # a RegisterAck (down, or a standby answering UNAVAILABLE) moves to the next one.
        self._brokers = [a.strip() for a in config.broker_address.split(",") if a.strip()] or [
            config.broker_address]
        self._broker_i = 0
        self.workdirs = WorkdirCache(config.work_dir,
                                     lambda: self._brokers[self._broker_i % len(self._brokers)],
                                     broker_credentials(config))
        self._lock = threading.RLock()
        self._session: Session | None = None
        self._last_resend = 0.0
        self._pending_health: list[agent_pb2.NodeHealth] = []
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._last_heartbeat = 0.0
        # Self-fence: when a broker last answered us, and the broker's agent timeout.
        self.contact = BrokerContact(time.monotonic())
        self._register_sent = time.monotonic()
        self._agent_timeout_s = 0.0  # from RegisterAck; 0 = not told yet (broker default)
        self.self_fences = 0  # how often we killed our attempts for lack of a broker
        # The same deadline for ranks whose agent is frozen (SIGSTOP) and cannot kill
        # them: CB_AGENT_LEASE_FILE holds it, each rank's watchdog obeys it.
        self.lease_file = os.path.join(config.work_dir, "agent-lease")
        self._lease_written = 0.0
        if hasattr(executor, "extra_env"):
            executor.extra_env["CB_AGENT_LEASE_FILE"] = self.lease_file
        self._resume_contact()
        self._write_lease(force=True)
        # Migration: checkpoint copies in flight before an attempt starts, and agent-clock
        # timings per attempt (reported in JobUpdate.timings for the broker's breakdown).
        self._staging: dict[tuple[str, int], Staging] = {}
        # make-before-break: a standby's own checkpoint dir, then (source ckpt, that dir) once go'd
        self._standby_ckpt: dict[tuple[str, int], str] = {}
        self._durable_copies: dict[tuple[str, int], tuple[str, str]] = {}
        self._timings: dict[tuple[str, int], agent_pb2.AttemptTimings] = {}
        # Ranks started per attempt (JobUpdate.ranks): the trainer's real world size.
        self._ranks: dict[tuple[str, int], int] = {}
        self.logs = LogShipper()  # ranks' stdout/stderr -> LogChunk (region_agents/logship.py)
        # Attempts a previous agent process started ship on from where the broker's copy
        # ends (RegisterAck's offsets; nothing is sent before it).
        # An executor whose own threads write the rank files says when they grow, and the
        # shipper then reads only those (not a stat of every file of every attempt a second).
        self._logs_notified = executor.notify_log_writes(self.logs.notify)
        for r in executor.running():
            self.logs.track(r.job_id, r.attempt, executor.log_sources(r.job_id, r.attempt),
                            notified=self._logs_notified)

    # ---- public ----------------------------------------------------------------
    def start(self) -> None:
        if self._threads:
            return
        log.info("agent %s (%s, %d nodes) -> broker %s", self.agent_id, self.region,
                 len(self.inventory.nodes), self.config.broker_address)
        if self.inventory.checkpoint_bucket:  # migrations in: mover ready before the first one
            from region_agents import staging

            threading.Thread(target=staging.warm, name="agent-warm", daemon=True).start()
        loops = [("connector", self._connect_loop), ("ticker", self._tick_loop)]
        if self.inventory.checkpoint_bucket and self.config.store_probe_interval_s > 0:
            loops.append(("store-probe", self._store_probe_loop))
        for name, target in loops:
            t = threading.Thread(target=target, name=f"agent-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, kill_running: bool = True) -> None:
        """Stop the agent. ``kill_running=False`` leaves trainer processes running
        (only useful in tests that hand them over); by default they are stopped,
        checkpoint-first when ``shutdown_grace_s`` > 0."""
        self._stopping.set()
        with self._lock:
            if self._session is not None:
                self._session.close()
        for t in self._threads:
            t.join(timeout=10)
        self._threads = []
        if kill_running:
            self.executor.shutdown(self.config.shutdown_grace_s)

    def run_forever(self) -> None:
        """Run until SIGINT/SIGTERM (the daemon's main)."""
        stops = StopSignals().install()  # no lock in a handler: broker/stop_signals.py
        self.start()
        log.info("signal %d: shutting down", stops.wait())
        self.stop()

    def inject_spot_notice(self, node_id: str, seconds: float = 120.0) -> None:
        """Simulate an EC2 spot interruption warning for a node (-> Heartbeat.spot_notices)."""
        self.signals.inject_spot_notice(node_id, seconds)

    def set_node_health(self, node_id: str, healthy: bool, reason: str = "") -> None:
        """Flip a node's health (-> Heartbeat.node_health; attempts on it fail)."""
        self.signals.set_health(node_id, healthy, reason)

    @property
    def connected(self) -> bool:
        s = self._session
        return s is not None and s.registered.is_set() and not s.closed.is_set()

    # ---- messages ------------------------------------------------------------------
    def _nodes(self) -> list[common_pb2.Node]:
        health = self.signals.health_map()
        out = []
        for n in self.inventory.nodes:
            node = common_pb2.Node()
            node.CopyFrom(n)
            node.healthy = health.get(n.id, (n.healthy, ""))[0]
            out.append(node)
        return out

    def _running(self, include_recent: bool = False) -> list[agent_pb2.RunningAttempt]:
        running = [r.to_proto() for r in self.executor.running()]
        running += [agent_pb2.RunningAttempt(job_id=j, attempt=a, state=AS.ATTEMPT_STATE_STARTING)
                    for (j, a), st in list(self._staging.items()) if not st.cancelled.is_set()]
        if include_recent:
            now = time.time()
            live = {(r.job_id, r.attempt) for r in running}
            for key, (when, upd) in list(self._recent_terminal.items()):
                if now - when > RECENT_TERMINAL_S:
                    del self._recent_terminal[key]
                elif key not in live and upd.attempt >= self.ledger.highest.get(upd.job_id, 0):
                    # Only the job's newest attempt: stale_job_ids name jobs, not attempts,
                    # so an old attempt listed here could get the newer one killed.
                    ra = agent_pb2.RunningAttempt(job_id=upd.job_id, attempt=upd.attempt, state=upd.state)
                    ra.progress.CopyFrom(upd.progress)
                    running.append(ra)
        return running

    def _register_msg(self) -> agent_pb2.AgentMessage:
        discover = getattr(self.executor, "discover_nodes", None)
        if discover is not None:  # a cluster's nodes come and go (Kubernetes: Node watch)
            self.inventory.nodes = discover()
            self.signals.track({n.id: n.healthy for n in self.inventory.nodes})
        return agent_pb2.AgentMessage(
            register=agent_pb2.Register(
                agent_id=self.agent_id,
                region=self.region,
                nodes=self._nodes(),
                running=self._running(include_recent=True),
                executor=self.config.executor,
                checkpoint_bucket=self.inventory.checkpoint_bucket,
                checkpoint_store_error=clip(self.store_error, ACK_MESSAGE_MAX),
                checkpoint_store_error_since=self.store_error_since,
                checkpoint_store_outage=self.store_outage,
                checkpoint_roots=self.config.checkpoint_allowed_roots,
                version=AGENT_VERSION,
                pool_spares=self.inventory.pool_spares(),
            )
        )

    def _send(self, msg: agent_pb2.AgentMessage) -> bool:
        s = self._session
        return s is not None and s.send(msg)

    def _ack(self, command_id: str, accepted: bool, message: str = "") -> None:
        if not accepted:
            log.warning("refused command %s: %s", command_id, message)
        self._send(agent_pb2.AgentMessage(ack=agent_pb2.CommandAck(
            command_id=command_id, accepted=accepted, message=clip(message, ACK_MESSAGE_MAX))))

    # ---- connection ------------------------------------------------------------------
    def _connect_loop(self) -> None:
        while not self._stopping.is_set():
            retrying = Retrying(
                wait=wait_exponential(multiplier=0.2, min=0.2, max=self.config.max_backoff_s),
                retry=retry_if_exception_type(_Disconnected),
                stop=stop_when_event_set(self._stopping),
                sleep=self._stopping.wait,
                reraise=True,
            )
            try:
                for attempt in retrying:
                    with attempt:
                        self._run_session()
            except _Disconnected:
                pass  # stopping
            except Exception:  # pragma: no cover - never let the daemon thread die
                log.exception("agent connection loop error")
            # A session that registered ended: reconnect quickly, with a fresh backoff.
            self._stopping.wait(0.2)

    def _log_broker_error(self, address: str, e: grpc.RpcError, was_registered: bool) -> None:
        """One warning line per outage (not one per retry, never the RpcError's multi-line
        repr); the retries stay at debug level until the agent registers again."""
        text = rpc_error_text(e)
        if was_registered or not getattr(self, "_broker_down", False):
            self._broker_down = True
            state = "stream lost" if was_registered else "unreachable"
            log.warning("broker %s %s: %s; retrying in the background", address, state, text)
        else:
            log.debug("broker %s still unreachable: %s", address, text)

    def _run_session(self) -> None:
        """One stream: returns if it had registered (or we stop), else raises _Disconnected."""
        session = Session()
        address = self._brokers[self._broker_i % len(self._brokers)]
        channel = make_channel(address, broker_credentials(self.config), CHANNEL_OPTIONS)
        try:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            with self._lock:
                if self._stopping.is_set():
                    return
                self.contact.new_session()
                self._register_sent = time.monotonic()
                session.send(self._register_msg())
                self._session = session
            call = stub.Connect(session.requests())
            session.call = call
            # Commands are applied in order on a thread of their own; the reader below
            # takes heartbeat acks at once. Why: each command waits for the agent's lock
            # (held by the ticker's pass over every attempt and node), and at thousands
            # of attempts a burst of Launches queued the acks behind them: the broker
            # answered within a second, the agent read its answers 15 s later and
            # self-fenced (the Kubernetes scale benchmark, 2,000 nodes).
            inbox: queue.SimpleQueue[agent_pb2.BrokerMessage | None] = queue.SimpleQueue()
            worker = threading.Thread(target=self._apply_commands, args=(session, inbox),
                                      name="agent-commands", daemon=True)
            worker.start()
            error: grpc.RpcError | None = None
            try:
                for msg in call:
                    session.last_rx = time.monotonic()  # any message proves the leader is alive
                    if msg.WhichOneof("cmd") == "heartbeat_ack":
                        self.contact.heartbeat_acked()  # thread-safe (fencing.BrokerContact)
                    else:
                        inbox.put(msg)
            except grpc.RpcError as e:
                error = e
            finally:
                inbox.put(None)
                worker.join()  # what the stream carried is applied before the next one
            if error is not None and not self._stopping.is_set():
                self._log_broker_error(address, error, session.registered.is_set())
            if session.leader_silent and not self._stopping.is_set():
                self._broker_i += 1  # a hung leader: try the next replica
                if not session.registered.is_set():
                    raise _Disconnected(f"no answer from {address}")
                return
            if not session.registered.is_set() and not self._stopping.is_set():
                self._broker_i += 1
                raise _Disconnected(f"stream to {address} ended before RegisterAck")
        finally:
            with self._lock:
                session.close()
                if self._session is session:
                    self._session = None
            channel.close()

    def _apply_commands(self, session: Session, inbox: queue.SimpleQueue) -> None:
        """The stream's messages but heartbeat acks, in the order the broker sent them."""
        while (msg := inbox.get()) is not None:
            self._on_broker_message(session, msg)

    def _on_broker_message(self, session: Session, msg: agent_pb2.BrokerMessage) -> None:
        kind = msg.WhichOneof("cmd")
        try:
            if kind == "registered":
                self._on_registered(session, msg.registered)
            elif kind == "heartbeat_ack":
                self.contact.heartbeat_acked()
            elif kind == "update_ack":
                self._on_update_ack(msg.update_ack)
            elif kind == "launch":
                self._on_launch(msg.command_id, msg.launch)
            elif kind == "stop":
                self._on_stop(msg.command_id, msg.stop)
            elif kind == "checkpoint":
                self._on_checkpoint(msg.command_id, msg.checkpoint)
            elif kind == "go":
                self._on_go(msg.command_id, msg.go)
            elif kind == "drain":
                self.draining = True
                log.info("broker drains this agent: %s", msg.drain.reason)
                self._ack(msg.command_id, True, "draining")
            else:
                self._ack(msg.command_id, False, f"unknown command {kind!r}")
        except Exception as e:  # a bad command must not kill the stream
            log.exception("command %s (%s) failed", msg.command_id, kind)
            if kind != "registered":
                self._ack(msg.command_id, False, f"{type(e).__name__}: {e}")

    def _on_registered(self, session: Session, ack: agent_pb2.RegisterAck) -> None:
        with self._lock:
            if self.config.heartbeat_interval_s is None and ack.heartbeat_interval_s > 0:
                self.heartbeat_interval_s = ack.heartbeat_interval_s
            if ack.agent_id:
                self.agent_id = ack.agent_id
            if ack.agent_timeout_s > 0:
                self._agent_timeout_s = ack.agent_timeout_s
            self.contact.registered(self._register_sent)
            self._write_lease(force=True)  # before any Launch on this stream starts ranks
            self.logs.rewind(ack.log_offsets)  # resend from where the broker's copy ends
            # Finished attempts the broker has not acknowledged: report them again, each
            # after the rest of its output (as on the first stream).
            for upd in list(self._unacked.values()):
                for chunk in self.logs.flush(upd.job_id, upd.attempt):
                    session.send(agent_pb2.AgentMessage(log_chunk=chunk))
                session.send(agent_pb2.AgentMessage(job_update=upd))
            self._last_resend = time.monotonic()
            session.registered.set()
            self.connects += 1
            for job_id in ack.stale_job_ids:
                current = self.ledger.running.get(job_id)
                if current is not None:
                    log.info("broker no longer wants %s attempt %d: killing it", job_id, current)
                    if not self._cancel_staging(job_id, current):
                        self.executor.stop(job_id, current, checkpoint_first=False, grace_s=0.0)
            self._last_heartbeat = 0.0  # heartbeat right away (spot notices, health)
        self._broker_down = False
        log.info("registered as %s (heartbeat %.1fs, %d stale)", self.agent_id,
                 self.heartbeat_interval_s, len(ack.stale_job_ids))

    def _on_update_ack(self, ack: agent_pb2.JobUpdateAck) -> None:
        with self._lock:
            key = (ack.job_id, ack.attempt)
            upd = self._unacked.get(key)
            if upd is not None and upd.state == ack.state:
                # The record on disk first, then memory: whoever sees the update gone
                # from the re-send set also finds the record marked acknowledged.
                self.executor.acknowledged(ack.job_id, ack.attempt)
                del self._unacked[key]

    def _on_launch(self, command_id: str, launch: agent_pb2.Launch) -> None:
        with self._lock:
            decision = self.ledger.on_launch(launch.job_id, launch.attempt)
            if not decision.accepted or decision.duplicate:
                self._ack(command_id, decision.accepted, decision.message)
                return
            refusal = self._standby_refusal(launch, decision.kill_attempt)
            if refusal:
                self._ack(command_id, False, refusal)
                self._report(AttemptEvent(launch.job_id, launch.attempt, AS.ATTEMPT_STATE_FAILED,
                                          exit_code=-1, message=refusal))
                return
            if decision.kill_attempt:
                log.info("%s: attempt %d supersedes %d: killing the old one", launch.job_id,
                         launch.attempt, decision.kill_attempt)
                if not self._cancel_staging(launch.job_id, decision.kill_attempt):
                    self.executor.stop(launch.job_id, decision.kill_attempt, False, 0.0)
                self.ledger.finished(launch.job_id, decision.kill_attempt)
            self.ledger.seen(launch.job_id, launch.attempt)
            key = (launch.job_id, launch.attempt)
            self._timings[key] = agent_pb2.AttemptTimings(launch_received_time=time.time())
            problem = (self._check_placement(launch) or self._check_checkpoint_root(launch)
                       or resume_refusal(launch))
            staging = None
            if problem is None:
                try:
                    self.executor.prepare(AttemptSpec.from_launch(launch))  # before any copy
                    staging = plan_staging(launch, self.inventory.checkpoint_bucket)
                    fetch = self._workdir_fetch(launch)
                    if fetch is not None:  # users' code first, then any checkpoint step
                        staging = staging or Staging(launch, "", "", copies=False)
                        staging.workdir_fetch = fetch
                    if staging is None:
                        self._start_attempt(launch)
                except (ValueError, OSError) as e:
                    problem = f"launch failed: {e}"
            if problem is not None:
                self._ack(command_id, False, problem)
                self._report(AttemptEvent(launch.job_id, launch.attempt, AS.ATTEMPT_STATE_FAILED,
                                          exit_code=-1, message=problem))
                return
            self.ledger.launched(launch.job_id, launch.attempt)
            if launch.standby:
                self._standby_ckpt[key] = launch.checkpoint_uri
                if launch.precopy_from:  # a planned move: copy the last checkpoint over now
                    self._precopy(launch)
            self._ack(command_id, True)
            if staging is not None:
                # Copy the checkpoint into this region's store, or resolve a same-region
                # resume point, first; the ticker starts the ranks when that is done
                # (region_agents/staging.py).
                self._staging[key] = staging
                staging.start()
                if staging.copies:
                    log.info("%s attempt %d: copying checkpoint %s -> %s before start",
                             launch.job_id, launch.attempt, staging.src, staging.dst)

    def _standby_refusal(self, launch: agent_pb2.Launch, running: int) -> str:
        """Why a make-before-break standby cannot start here ("" = it can). Never beside
        an attempt of the same job on this agent: starting an attempt fences older ones
        here, and the source must keep its ranks until its final checkpoint."""
        if not launch.standby:
            return ""
        if not self.executor.supports_standby:
            return (f"standby launch refused: the {type(self.executor).__name__} does not"
                    " run make-before-break standby attempts")
        if running:
            return (f"standby launch refused: attempt {running} of {launch.job_id} still runs on"
                    " this agent (a standby must be on another agent)")
        return ""

    def _on_go(self, command_id: str, go: agent_pb2.Go) -> None:
        """Make-before-break: the source is fenced; release the standby (or abort it).
        Idempotent: a re-sent Go writes the same go file again."""
        with self._lock:
            if self.ledger.running.get(go.job_id) != go.attempt:
                self._ack(command_id, False, f"{go.job_id} attempt {go.attempt} is not running here")
                return
            action = GoAction.ABORT if go.abort else GoAction.GO
            try:
                self.executor.go(go.job_id, go.attempt, Go(action, go.resume_from, go.reason))
            except ValueError as e:  # a resume point it may not read: the standby aborts
                log.warning("%s attempt %d: go refused: %s", go.job_id, go.attempt, e)
                self._ack(command_id, False, f"go refused: {e}")
                return
            key = (go.job_id, go.attempt)
            if action is GoAction.GO and go.resume_from and key in self._standby_ckpt:
                self._durable_copies[key] = (go.resume_from, self._standby_ckpt.pop(key))
            log.info("%s attempt %d: go (%s) from %s", go.job_id, go.attempt, go.reason,
                     go.resume_from or "scratch")
            self._ack(command_id, True)

    def _durability_copy(self, job_id: str, attempt: int, src: str, dst_dir: str) -> None:
        """After a make-before-break resume read the checkpoint straight from the source
        region's store, copy it into the attempt's directory in this region's store in the
        background (the attempt already trains; this only makes the resume point survive
        the source region, like the copy-first path's ``<checkpoint_uri>/step-N``)."""
        bucket = self.inventory.checkpoint_bucket
        if not src or not dst_dir or (bucket and under(src, bucket)):
            return
        name = src.rstrip("/").rpartition("/")[2]
        dst = f"{dst_dir.rstrip('/')}/{name}"

        def run() -> None:
            try:
                from region_agents.transfer import copy_checkpoint

                r = copy_checkpoint(src, dst, s3_client=staging_s3_client(), **copy_tuning(src, dst))
                log.info("%s attempt %d: background durability copy %s -> %s: %.1f MB in %.2fs"
                         " (%s)", job_id, attempt, src, dst, r.bytes / 1e6, r.seconds, r.method)
            except Exception as e:  # noqa: BLE001 - best effort: the next checkpoint covers it
                log.warning("%s attempt %d: background durability copy failed: %s", job_id, attempt, e)
            try:  # the trainer may have committed (and pruned) past it meanwhile
                if drop_if_superseded(dst_dir, name):
                    log.info("%s attempt %d: durability copy %s removed: a newer checkpoint is"
                             " complete in %s", job_id, attempt, name, dst_dir)
            except Exception as e:  # noqa: BLE001 - a leftover old step: pruned later anyway
                log.warning("%s attempt %d: could not check the durability copy %s against newer"
                            " checkpoints: %s", job_id, attempt, name, e)

        threading.Thread(target=run, name=f"durable-{job_id}-{attempt}", daemon=True).start()

    def _precopy(self, launch: agent_pb2.Launch) -> None:
        """Make-before-break pre-copy (docs/contracts.md section 5a): copy the source's last
        periodic checkpoint into this standby's directory in this region's store while the
        source still trains (the broker holds its Stop until we report), then report it:
        JobUpdate{STARTING, transfer{done or error}}. Off the agent's lock, in a thread:
        the standby's ranks start meanwhile. The report waits until the standby is also
        parked (or gone), so its start-up (imports, model, optimizer state: CPU-heavy)
        never competes with the source's final save, the critical path."""
        src, ckpt = launch.precopy_from, launch.checkpoint_uri
        job_id, attempt = launch.job_id, launch.attempt
        name = src.rstrip("/").rpartition("/")[2]
        dst = f"{ckpt.rstrip('/')}/{name}"
        bucket = self.inventory.checkpoint_bucket

        def run() -> None:
            stats = common_pb2.TransferStats(src_uri=src, dst_uri=dst, start_time=time.time())
            if under(src, bucket) or not under(ckpt, bucket):
                stats.method, stats.done, stats.dst_uri = "same-store", True, src  # nothing to copy
            else:
                try:
                    from region_agents.transfer import copy_checkpoint

                    r = copy_checkpoint(src, dst, s3_client=staging_s3_client(), **copy_tuning(src, dst))
                    stats.bytes_total = stats.bytes_done = r.bytes
                    stats.seconds, stats.method, stats.done = r.seconds, r.method, True
                    stats.mb_per_s = r.bytes / 1e6 / r.seconds if r.seconds > 0 else 0.0
                    log.info("%s attempt %d: pre-copied %s -> %s: %.1f MB in %.2fs (%s)", job_id,
                             attempt, src, dst, r.bytes / 1e6, r.seconds, r.method)
                except Exception as e:  # noqa: BLE001 - reported; the move goes on without it
                    stats.error = clip(f"{type(e).__name__}: {e}", ACK_MESSAGE_MAX)
                    log.warning("%s attempt %d: pre-copy of %s failed: %s", job_id, attempt, src, e)
            stats.end_time = time.time()
            limit = time.monotonic() + PARK_WAIT_S
            while self.executor.parked(job_id, attempt) is False and time.monotonic() < limit:
                if self._stopping.wait(0.1):
                    return
            with self._lock:
                if self.ledger.running.get(job_id) == attempt:  # still this agent's attempt
                    self._report(AttemptEvent(job_id, attempt, AS.ATTEMPT_STATE_STARTING),
                                 transfer=stats)

        threading.Thread(target=run, name=f"precopy-{job_id}-{attempt}", daemon=True).start()

    def _check_checkpoint_root(self, launch: agent_pb2.Launch) -> str | None:
        """Why this region will not write ``launch.checkpoint_uri``, or None.

        The agent re-checks what the broker checked at submit (issue 12): it is the one
        writing there. With ``checkpoint_allowed_roots`` configured, the URI must lie under
        one of them or under the region's own store; without, only '.'/'..'-free absolute
        URIs pass (the broker's submit check still applies).
        """
        uri = launch.checkpoint_uri
        if not uri:
            return None
        roots = list(self.config.checkpoint_allowed_roots)
        store = self.inventory.checkpoint_bucket
        if roots and store:
            roots.append(store if "://" in store or store.startswith("/") else os.path.abspath(store))
        try:
            if roots:
                check_under(uri, roots, "Launch.checkpoint_uri")
            else:
                canonical(uri)
        except RootError as e:
            return f"checkpoint location refused: {e}"
        return None

    def _workdir_fetch(self, launch: agent_pb2.Launch) -> Callable[[], object] | None:
        """A fetch to run before the ranks start, or None (no workdir, or cached)."""
        if not launch.spec.HasField("workdir"):
            return None
        digest = launch.spec.workdir.digest
        if self.executor.ships_workdir:  # e.g. pods: the tarball goes to the job's store
            spec = AttemptSpec.from_launch(launch)

            def fetch_and_stage() -> None:
                self.executor.stage_workdir(spec, str(self.workdirs.get(digest)))
            return fetch_and_stage
        if self.workdirs.cached(digest):
            return None
        return lambda: self.workdirs.get(digest)

    def _start_attempt(self, launch: agent_pb2.Launch, resume_from: str | None = None) -> None:
        spec = AttemptSpec.from_launch(launch)
        if resume_from is not None:
            spec.resume_from = resume_from
        if launch.spec.HasField("workdir"):  # users' code: fetched (staging) and verified
            tar = self.workdirs.get(launch.spec.workdir.digest)
            spec.workdir_tar, spec.workdir_size = str(tar), tar.stat().st_size
        # Known before the ranks start: the poller may report the attempt's first event
        # before launch() returns, and that report must carry the ranks.
        key = (launch.job_id, launch.attempt)
        self._ranks[key] = self.executor.ranks(spec)
        try:
            self.executor.launch(spec)
        except BaseException:
            self._ranks.pop(key, None)
            raise
        self.logs.track(launch.job_id, launch.attempt,
                        self.executor.log_sources(launch.job_id, launch.attempt),
                        notified=self._logs_notified)
        t = self._timings.setdefault((launch.job_id, launch.attempt), agent_pb2.AttemptTimings())
        t.spawn_time = time.time()

    def _cancel_staging(self, job_id: str, attempt: int) -> bool:
        """Stop an attempt that is still copying its checkpoint: report it STOPPED."""
        st = self._staging.pop((job_id, attempt), None)
        if st is None:
            return False
        st.cancelled.set()
        what = ("fetching its workdir" if not st.src else
                "copying its checkpoint" if st.copies else "resolving its checkpoint")
        self._report(AttemptEvent(job_id, attempt, AS.ATTEMPT_STATE_STOPPED, exit_code=-1,
                                  message=f"stopped while {what}"),
                     transfer=st.transfer())
        return True

    def _poll_staging(self) -> None:
        """Report copy progress (~1/s); start the ranks, or fail the attempt, when done.

        A resume point that cannot be resolved (gone, and nothing newer and complete in
        its directory) fails the attempt with the trainer's code for exactly that,
        EXIT_RESUME_UNAVAILABLE: not a configuration error, so the broker relaunches."""
        now = time.time()
        for key, st in list(self._staging.items()):
            launch = st.launch
            if not st.finished.is_set():
                if st.copies and now - st.last_sent >= 1.0:
                    st.last_sent = now
                    self._report(AttemptEvent(launch.job_id, launch.attempt, AS.ATTEMPT_STATE_STARTING),
                                 transfer=st.snapshot())
                continue
            del self._staging[key]
            stats = st.transfer()
            if st.cancelled.is_set() or self.ledger.running.get(launch.job_id) != launch.attempt:
                continue
            failure = st.failure()
            if failure:
                code = (EXIT_STORE_UNAVAILABLE if st.store_outage
                        else -1 if st.copies or st.fetch_error else EXIT_RESUME_UNAVAILABLE)
                self._report(AttemptEvent(launch.job_id, launch.attempt, AS.ATTEMPT_STATE_FAILED,
                                          exit_code=code, message=failure), transfer=stats)
                continue
            if stats is not None:
                self._report(AttemptEvent(launch.job_id, launch.attempt,
                                          AS.ATTEMPT_STATE_STARTING), transfer=stats)
            try:
                self._start_attempt(launch, resume_from=st.dst if st.src else None)
            except (ValueError, OSError) as e:
                self._report(AttemptEvent(launch.job_id, launch.attempt, AS.ATTEMPT_STATE_FAILED,
                                          exit_code=-1, message=f"launch failed: {e}"))

    def _check_placement(self, launch: agent_pb2.Launch) -> str | None:
        known = {n.id for n in self.inventory.nodes}
        unknown = [n.node_id for n in launch.placement.nodes if n.node_id not in known]
        if unknown:
            return f"placement names nodes this agent does not have: {', '.join(unknown)}"
        if launch.attempt < 1:
            return f"attempt must be >= 1, got {launch.attempt}"
        return None

    def _on_stop(self, command_id: str, stop: agent_pb2.Stop) -> None:
        with self._lock:
            decision = self.ledger.on_stop(stop.job_id, stop.attempt)
            if decision.accepted and not self._cancel_staging(stop.job_id, stop.attempt):
                if stop.checkpoint_first:
                    t = self._timings.setdefault((stop.job_id, stop.attempt), agent_pb2.AttemptTimings())
                    t.stop_signal_time = t.stop_signal_time or time.time()
                self.executor.stop(stop.job_id, stop.attempt, stop.checkpoint_first,
                                   stop.grace_s if stop.grace_s > 0 else 120.0)
            self._ack(command_id, decision.accepted, decision.message)

    def _on_checkpoint(self, command_id: str, cmd: agent_pb2.CheckpointNow) -> None:
        with self._lock:
            decision = self.ledger.on_stop(cmd.job_id, cmd.attempt)
            if decision.accepted and (cmd.job_id, cmd.attempt) not in self._staging:
                self.executor.checkpoint(cmd.job_id, cmd.attempt)
            self._ack(command_id, decision.accepted, decision.message)

    # ---- ticker --------------------------------------------------------------------------
    def _tick_loop(self) -> None:
        while not self._stopping.wait(self.config.poll_interval_s):
            try:
                self._tick()
            except Exception:  # pragma: no cover - keep ticking
                log.exception("agent tick failed")

    def _report(self, ev: AttemptEvent, transfer: common_pb2.TransferStats | None = None) -> None:
        upd = ev.to_proto()
        upd.message = clip(upd.message, UPDATE_MESSAGE_MAX)
        key = (ev.job_id, ev.attempt)
        if key in self._durable_copies and (ev.terminal or ev.state == AS.ATTEMPT_STATE_RUNNING):
            src, dst_dir = self._durable_copies.pop(key)
            if not ev.terminal:  # it trains now: the copy no longer competes with its load
                self._durability_copy(ev.job_id, ev.attempt, src, dst_dir)
        if transfer is not None:
            upd.transfer.CopyFrom(transfer)
            upd.transfer.error = clip(upd.transfer.error, ACK_MESSAGE_MAX)
        timings = self._timings.get(key)
        if ev.terminal and timings is not None:
            timings.exit_time = ev.time
            self._timings.pop(key, None)
        if timings is not None:
            upd.timings.CopyFrom(timings)
        upd.ranks = self._ranks.pop(key, 0) if ev.terminal else self._ranks.get(key, 0)
        if ev.terminal:
            # Its last lines go first: a follower sees them before the job ends.
            # Sent to a dead stream they are resent after RegisterAck's rewind.
            for chunk in self.logs.flush(ev.job_id, ev.attempt):
                self._send(agent_pb2.AgentMessage(log_chunk=chunk))
            self.ledger.finished(ev.job_id, ev.attempt)
            self._recent_terminal[(ev.job_id, ev.attempt)] = (time.time(), upd)
            self._unacked[(ev.job_id, ev.attempt)] = upd
            self._last_resend = time.monotonic()  # give the broker time to ack it
        self._send(agent_pb2.AgentMessage(job_update=upd))

    def _tick(self) -> None:
        with self._lock:
            for ev in self.executor.poll():
                self._report(ev)
            self._poll_staging()
            if self.connected:  # else the files wait; RegisterAck rewinds to the broker's copy
                for chunk in self.logs.poll():
                    self._send(agent_pb2.AgentMessage(log_chunk=chunk))
            node_signals = getattr(self.executor, "node_signals", None)
            if node_signals is not None:  # the cluster's own word (Kubernetes: Node watch)
                self.signals.set_external(*node_signals())
            new_spot, health_changes = self.signals.poll()
            for ch in health_changes:
                log.info("node %s is now %s %s", ch.node_id,
                         "healthy" if ch.healthy else "UNHEALTHY", ch.reason)
                self._pending_health.append(
                    agent_pb2.NodeHealth(node_id=ch.node_id, healthy=ch.healthy, reason=ch.reason))
                if not ch.healthy:
                    self._fail_attempts_on(ch.node_id, ch.reason)
            now = time.time()
            urgent = bool(new_spot or health_changes or self._store_probe_changed)
            self._store_probe_changed = False
            if self.connected and (urgent or now - self._last_heartbeat >= self.heartbeat_interval_s):
                self._send_heartbeat(now)
            self._resend_unacked()
            self._check_leader_liveness()
            self._check_self_fence()
            self._write_lease()

    def _store_probe_loop(self) -> None:
        """Probe the region's checkpoint store while the agent runs, not only at start.

        Why: a store that goes down later (an S3 outage) must take the region out of new
        placements while it lasts, and bring it back when it answers; the result rides
        every heartbeat (Heartbeat.store_probe). A failing store is probed more often."""
        while not self._stopping.is_set():
            wait = (min(self.config.store_probe_retry_s, self.config.store_probe_interval_s) if self.store_error
                    else self.config.store_probe_interval_s)
            if self._stopping.wait(wait):
                return
            err, outage = probe_store(self.inventory.checkpoint_bucket)
            self._store_probed_at = time.time()
            if err and not self.store_error:
                self.store_error_since = self._store_probed_at
                log.error("checkpoint store %s is not usable: %s", self.inventory.checkpoint_bucket, err)
            elif self.store_error and not err:
                self.store_error_since = 0.0
                log.info("checkpoint store %s is usable again", self.inventory.checkpoint_bucket)
            changed = bool(err) != bool(self.store_error)
            self.store_error, self.store_outage = err, outage
            if changed:
                self._store_probe_changed = True  # the ticker beats at once (one sender)

    def _resend_unacked(self) -> None:
        """Terminal updates the broker did not acknowledge (e.g. its store was down when
        they arrived): send them again every two heartbeat intervals (at least 5 s)."""
        mono = time.monotonic()
        if not self._unacked or not self.connected:
            return
        if mono - self._last_resend < max(MIN_RESEND_S, 2 * self.heartbeat_interval_s):
            return
        self._last_resend = mono
        for upd in list(self._unacked.values()):
            self._send(agent_pb2.AgentMessage(job_update=upd))

    @property
    def leader_timeout_s(self) -> float:
        """How long a silent broker is trusted before rotating to the next one. By default
        at most half the self-fence deadline: the agent must have found the new leader
        well before it would kill its attempts for lack of one."""
        if self.config.leader_timeout_s:
            return self.config.leader_timeout_s
        return min(max(MIN_LEADER_TIMEOUT_S, LEADER_TIMEOUT_HEARTBEATS * self.heartbeat_interval_s),
                   self.self_fence_s / 2)

    def _check_leader_liveness(self) -> None:
        """No message from the broker for leader_timeout_s: it hangs (SIGSTOP, a wedged
        process, a half-open connection). Drop the stream; the connector rotates."""
        s = self._session
        if s is None or s.closed.is_set():
            return
        silent = time.monotonic() - s.last_rx
        if silent > self.leader_timeout_s:
            log.warning("broker silent for %.1fs (limit %.1fs): dropping the stream, trying"
                        " the next broker", silent, self.leader_timeout_s)
            s.leader_silent = True
            s.close()

    @property
    def self_fence_s(self) -> float:
        return self_fence_after(self._agent_timeout_s, self.config.self_fence_s)

    def _resume_contact(self) -> None:
        """A restarted agent's last broker contact is its predecessor's (from the lease
        file), not "now": else re-adopted ranks would get a fresh deadline that outlives
        the one the broker's agent timeout counts from."""
        try:
            with open(self.lease_file) as f:
                fields = f.read().split()
            contact_wall = float(fields[1])
        except (OSError, ValueError, IndexError):
            return  # no predecessor (or an old file format): start-up counts as contact
        age = max(0.0, time.time() - contact_wall)
        self.contact.last = min(self.contact.last, time.monotonic() - age)

    def _write_lease(self, force: bool = False) -> None:
        """Renew CB_AGENT_LEASE_FILE (about twice a second): the wall-clock time at which
        this agent would self-fence. Frozen, we stop renewing it, and the ranks' watchdog
        (trainer/agent_lease.py) stops them at that very deadline."""
        now = time.time()
        if not force and now - self._lease_written < 0.5:
            return
        silent = self.contact.silent_for(time.monotonic())
        # A little after our own deadline: a live agent kills (and says so) first; the
        # ranks' watchdog is the backstop for a frozen one (fencing.LEASE_MARGIN).
        deadline = now + self.self_fence_s + lease_margin(self._agent_timeout_s) - silent
        tmp = f"{self.lease_file}.tmp"
        try:
            with open(tmp, "w") as f:  # deadline (what ranks obey), then the last contact
                f.write(f"{deadline:.3f} {now - silent:.3f}\n")
            os.replace(tmp, self.lease_file)
            self._lease_written = now
        except OSError as e:  # a full disk must not stop the agent; ranks keep the old one
            log.warning("cannot renew the agent lease %s: %s", self.lease_file, e)

    def _check_self_fence(self) -> None:
        """No broker has answered us for ``self_fence_s``: a partition (or no leader at
        all). The broker may be about to declare us lost and relaunch our jobs on another
        agent, so kill our attempts now (SIGKILL: a checkpoint-first stop could outlive
        the deadline). They are reported STOPPED when a broker is back; if it still wants
        them it relaunches them from their last checkpoint (contracts §9)."""
        silent = self.contact.silent_for(time.monotonic())
        if silent <= self.self_fence_s:
            return
        victims = [(r.job_id, r.attempt) for r in self.executor.running()
                   if r.state not in TERMINAL_STATES]
        staging = [key for key, st in self._staging.items() if not st.cancelled.is_set()]
        if not victims and not staging:
            return
        self.self_fences += 1
        log.warning("self-fence: no broker answered for %.1fs (limit %.1fs, the broker declares"
                    " an agent lost after %.0fs): killing %d attempt(s) before they can be"
                    " relaunched elsewhere", silent, self.self_fence_s,
                    self._agent_timeout_s or self.self_fence_s / 0.75, len(victims) + len(staging))
        for job_id, attempt in staging:
            self._cancel_staging(job_id, attempt)
        for job_id, attempt in victims:
            with contextlib.suppress(KeyError):  # ended meanwhile
                self.executor.stop(job_id, attempt, False, 0.0)

    def _fail_attempts_on(self, node_id: str, reason: str) -> None:
        for r in self.executor.running():
            if node_id in r.node_ids and r.state not in TERMINAL_STATES:
                self.executor.fail(r.job_id, r.attempt,
                                   f"node {node_id} unhealthy: {reason or 'unhealthy'}", [node_id])

    def _send_heartbeat(self, now: float) -> None:
        session = self._session
        if session is None:
            return
        # Every active notice, every heartbeat: the broker acts on a node's first listing
        # and takes a notice no longer listed as withdrawn (the node is given back).
        notices = [agent_pb2.SpotNotice(node_id=n, deadline_time=d)
                   for n, d in sorted(self.signals.active_spot_notices().items())]
        hb = agent_pb2.Heartbeat(time=now, node_health=self._pending_health,
                                 spot_notices=notices, running=self._running())
        if self.inventory.checkpoint_bucket and self.config.store_probe_interval_s > 0:
            hb.store_probe.CopyFrom(agent_pb2.StoreProbe(
                error=clip(self.store_error, ACK_MESSAGE_MAX), since=self.store_error_since,
                time=self._store_probed_at, outage=self.store_outage))
        if session.send(agent_pb2.AgentMessage(heartbeat=hb)):
            self.contact.heartbeat_sent(time.monotonic())
            self._pending_health = []
            self._last_heartbeat = now


# ---- CLI ------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="brokerctl agent",
        description="Run a region agent: register this region's nodes with the broker and run "
        "the attempts it assigns.",
    )
    p.add_argument("--broker", required=True,
                   help="broker address host:port, or several replicas a:1,b:2 (tried in turn)")
    p.add_argument("--region", default="", help="region name (default: the inventory's region)")
    p.add_argument("--inventory", default="", help="inventory YAML/JSON file (local executor)")
    p.add_argument("--agent-id", default="", help="agent id (default: inventory agent_id or <region>-agent)")
    p.add_argument("--work-dir", default="var/agent", help="attempt dirs, logs, spot-notices/, node-health/")
    p.add_argument("--ranks-per-node", type=int, default=2, help="cap on local processes per node")
    p.add_argument("--executor", choices=("local", "kubernetes"), default="local")
    p.add_argument("--namespace", default="default", help="Kubernetes namespace (kubernetes executor)")
    p.add_argument("--image", default="", help="default trainer image (kubernetes executor)")
    p.add_argument("--service-account", default="",
                   help="trainer pods' service account, allowed to get and patch pods: their preStop hook "
                        "reads the Stop's deadline from its own pod, their supervisor publishes "
                        "progress on it (kubernetes executor)")
    p.add_argument("--pod-uid", type=int, default=65532,
                   help="non-root uid the trainer pods run as (kubernetes executor)")
    p.add_argument("--heartbeat-interval-s", type=float, default=None,
                   help="override the broker's heartbeat interval")
    p.add_argument("--store-probe-interval-s", type=float, default=30.0,
                   help="re-probe the checkpoint store this often (0 = only at start)")
    p.add_argument("--hang-timeout-s", type=float, default=600.0,
                   help="no trainer heartbeat for this long = hang -> FAILED")
    p.add_argument("--python", default=sys.executable,
                   help="python for `-m trainer` and a job's bare `python`/`python3` "
                   "(its directory goes first on the ranks' PATH)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for every rank (repeatable)")
    p.add_argument("--leader-timeout-s", type=float, default=None,
                   help="broker silent this long = hung: reconnect to the next --broker"
                        " (default: 4 heartbeat intervals, at least 6 s)")
    p.add_argument("--self-fence-s", type=float, default=None,
                   help="no broker answer this long = partitioned: kill this agent's attempts"
                        " (default and maximum: 3/4 of the broker's agent timeout)")
    p.add_argument("--run-as-user", default="", metavar="USER",
                   help="local executor: run every job's ranks as this unprivileged user")
    p.add_argument("--job-uid-range", default="", metavar="FIRST-LAST",
                   help="local executor: each job's ranks run as its own uid from this range"
                        " (e.g. 61000-61999; no passwd entries needed), not one shared user")
    p.add_argument("--job-identity", choices=("job", "team"), default="job",
                   help="with --job-uid-range: a uid per job (default) or one per team"
                        " (a team's jobs then share it)")
    p.add_argument("--allow-root-jobs", action="store_true",
                   help="a root agent without --run-as-user runs jobs as root (else it refuses)")
    p.add_argument("--checkpoint-root", action="append", default=[], metavar="DIR|s3://B/P",
                   help="where jobs may choose to write checkpoints here (repeatable)")
    p.add_argument("--cert", default="", help="this agent's certificate (PEM; names its region"
                   " and agent id; env CB_AGENT_CERT)")
    p.add_argument("--key", default="", help="its private key (PEM; env CB_AGENT_KEY)")
    p.add_argument("--ca", default="", help="the CA that signed the broker's certificate (env CB_CA)")
    p.add_argument("--insecure-dev", action="store_true",
                   help="DEV ONLY: plaintext, for a broker started with --insecure-dev")
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    """``brokerctl agent ...``: returns a process exit code (2 = bad arguments/inventory)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    env: dict[str, str] = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"error: --env expects KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
        env[key] = value
    try:
        config = AgentConfig(
            broker_address=args.broker,
            region=args.region,
            inventory_path=args.inventory,
            agent_id=args.agent_id,
            work_dir=args.work_dir,
            executor=args.executor,
            ranks_per_node=args.ranks_per_node,
            heartbeat_interval_s=args.heartbeat_interval_s,
            hang_timeout_s=args.hang_timeout_s,
            store_probe_interval_s=args.store_probe_interval_s,
            python=args.python,
            extra_env=env,
            namespace=args.namespace,
            image=args.image,
            service_account=args.service_account,
            pod_uid=args.pod_uid,
            leader_timeout_s=args.leader_timeout_s,
            self_fence_s=args.self_fence_s,
            run_as_user=args.run_as_user,
            job_uid_range=args.job_uid_range,
            job_identity=args.job_identity,
            allow_root_jobs=args.allow_root_jobs,
            checkpoint_allowed_roots=args.checkpoint_root,
            tls_cert=args.cert,
            tls_key=args.key,
            tls_ca=args.ca,
            insecure=args.insecure_dev,
        )
        agent = RegionAgent(config)
    except (InventoryError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    agent.run_forever()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
