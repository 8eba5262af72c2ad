"""One connection of the agent's bidirectional stream (a send queue + a closed flag).

Why a queue: gRPC's Python streaming API takes an *iterator* of requests. The
agent's threads (command handling, heartbeats, executor polling) all put
messages here; gRPC pulls them in order on its own thread. Closing the session
ends the iterator, which half-closes the stream.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

from computebroker.v1 import agent_pb2


class Session:
    """Outgoing side of one ``AgentService.Connect`` stream."""

    def __init__(self) -> None:
        self._queue: queue.Queue[agent_pb2.AgentMessage | None] = queue.Queue()
        self.closed = threading.Event()
        self.registered = threading.Event()
        self.call = None  # the grpc call object, to cancel it
        # Leader liveness: when the broker last sent anything (monotonic), and whether
        # the agent dropped this stream because the broker went silent.
        self.last_rx = time.monotonic()
        self.leader_silent = False

    def send(self, msg: agent_pb2.AgentMessage) -> bool:
        """Queue a message; False if the session is already closed."""
        if self.closed.is_set():
            return False
        self._queue.put(msg)
        return True

    def requests(self) -> Iterator[agent_pb2.AgentMessage]:
        while not self.closed.is_set():
            try:
                msg = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            if msg is None:
                return
            yield msg

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        self._queue.put(None)
        if self.call is not None:
            self.call.cancel()
