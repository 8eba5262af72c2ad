"""A scripted fake broker for agent tests: AgentService over a REAL gRPC server on 127.0.0.1.

Why a fake (and not the real broker): the broker is written in parallel; the agent's
stream behaviour (register, heartbeats, acks, fencing, reconnect) is tested here
against the protocol alone. The lead's e2e tests run the real broker with real agents.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent import futures

import grpc

from computebroker.v1 import agent_pb2, agent_pb2_grpc


def wait_for(pred: Callable[[], object], timeout: float = 60.0, interval: float = 0.05,
             what: str = "condition") -> object:
    """Poll until pred() is truthy (generous timeouts; no wall-clock assertions)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


class FakeBroker(agent_pb2_grpc.AgentServiceServicer):
    """Records every AgentMessage, answers Register, and lets a test send commands."""

    def __init__(self, heartbeat_interval_s: float = 0.3) -> None:
        self.heartbeat_interval_s = heartbeat_interval_s
        self.stale_job_ids: list[str] = []
        self.mute = False  # True: a hung leader (answers nothing, not even heartbeats)
        self.ack_updates = True  # False: a broker whose store is down (never acks updates)
        self.messages: list[tuple[int, agent_pb2.AgentMessage]] = []  # (connection no, msg)
        self.connections = 0
        self._out: queue.Queue | None = None
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None
        self.port = 0
        self._cmd = 0

    # ---- server lifecycle -------------------------------------------------------
    def start(self, port: int = 0) -> int:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        agent_pb2_grpc.add_AgentServiceServicer_to_server(self, server)
        from broker.auth.tls import server_credentials
        from broker.config import BrokerConfig
        from tests.fixtures.pki import session_pki

        # Mutual TLS like the real broker's agent port (same dev CA), identities unchecked.
        creds = server_credentials(BrokerConfig(**session_pki().broker_settings()), mutual=True)
        self.port = server.add_secure_port(f"127.0.0.1:{port}", creds)
        server.start()
        self._server = server
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0).wait()
            self._server = None
        with self._lock:
            if self._out is not None:
                self._out.put(None)
                self._out = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    # ---- AgentService -------------------------------------------------------------
    def Connect(self, request_iterator, context):  # noqa: N802 - gRPC method name
        out: queue.Queue = queue.Queue()
        with self._lock:
            self.connections += 1
            conn = self.connections
            self._out = out

        def reader() -> None:
            try:
                for msg in request_iterator:
                    with self._lock:
                        self.messages.append((conn, msg))
                    if self.mute:
                        continue
                    if msg.HasField("heartbeat"):
                        out.put(agent_pb2.BrokerMessage(heartbeat_ack=agent_pb2.HeartbeatAck(
                            time=msg.heartbeat.time)))
                    if msg.HasField("job_update") and self.ack_updates:
                        u = msg.job_update
                        out.put(agent_pb2.BrokerMessage(update_ack=agent_pb2.JobUpdateAck(
                            job_id=u.job_id, attempt=u.attempt, state=u.state)))
                    if msg.HasField("register"):
                        out.put(agent_pb2.BrokerMessage(
                            command_id=f"reg-{conn}",
                            registered=agent_pb2.RegisterAck(
                                agent_id=msg.register.agent_id,
                                heartbeat_interval_s=self.heartbeat_interval_s,
                                stale_job_ids=list(self.stale_job_ids))))
            except Exception:  # noqa: BLE001 - stream torn down
                pass
            finally:
                out.put(None)

        threading.Thread(target=reader, daemon=True).start()
        while context.is_active():
            try:
                item = out.get(timeout=0.2)
            except queue.Empty:
                continue
            if item is None:
                return
            yield item

    # ---- test helpers ------------------------------------------------------------------
    def send(self, **cmd) -> str:
        """Send a command on the current stream; returns its command_id."""
        with self._lock:
            self._cmd += 1
            cid = f"cmd-{self._cmd}"
            assert self._out is not None, "no agent connected"
            self._out.put(agent_pb2.BrokerMessage(command_id=cid, **cmd))
        return cid

    def of(self, kind: str, conn: int | None = None) -> list:
        with self._lock:
            return [getattr(m, kind) for c, m in self.messages
                    if m.WhichOneof("msg") == kind and (conn is None or c == conn)]

    def ack(self, command_id: str) -> agent_pb2.CommandAck | None:
        return next((a for a in self.of("ack") if a.command_id == command_id), None)

    def wait_ack(self, command_id: str, timeout: float = 60.0) -> agent_pb2.CommandAck:
        return wait_for(lambda: self.ack(command_id), timeout, what=f"ack of {command_id}")

    def updates(self, job_id: str, attempt: int | None = None) -> list[agent_pb2.JobUpdate]:
        return [u for u in self.of("job_update")
                if u.job_id == job_id and (attempt is None or u.attempt == attempt)]

    def states(self, job_id: str, attempt: int | None = None) -> list[int]:
        out: list[int] = []
        for u in self.updates(job_id, attempt):
            if not out or out[-1] != u.state:
                out.append(u.state)
        return out

    def terminal(self, job_id: str, attempt: int) -> agent_pb2.JobUpdate | None:
        terminal = {4, 5, 6, 7}
        return next((u for u in self.updates(job_id, attempt) if u.state in terminal), None)

    def wait_terminal(self, job_id: str, attempt: int, timeout: float = 90.0) -> agent_pb2.JobUpdate:
        return wait_for(lambda: self.terminal(job_id, attempt), timeout,
                        what=f"terminal update of {job_id}/{attempt}")
