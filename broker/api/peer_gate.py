"""The connection gate: a per-address cap on TCP connections, applied before a byte of TLS.

Why: gRPC's Python server takes every connection it is offered and runs its TLS
handshake; it has no per-address connection limit and no hook before the handshake
(``grpc.max_concurrent_streams`` bounds streams per connection, the stream budget in
broker/api/streams.py bounds streams once a call exists). One address could open
thousands of connections without a credential: each costs a file descriptor, a
handshake's CPU and memory in gRPC's core, and enough of them exhaust the process's
descriptors so members and agents cannot connect at all.

So with ``max_connections_per_address`` set, the broker serves gRPC on a loopback port
and this gate owns the public ``listen`` address: it accepts, counts connections per
source address, closes one over the cap at once (before reading anything: no TLS, no
thread, no gRPC state), and relays the others byte for byte to the loopback port (TLS
stays end to end between the client and gRPC). One thread and a selector serve every
connection; nothing is decoded.

The peer address: gRPC sees the gate's loopback connection, so the gate records which
client each of its upstream sockets carries (:func:`real_peer`). Everything that asks
who is calling (the per-address stream caps, the audit log) goes through
:func:`real_peer`, so caps and audit records still name the client's address.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import selectors
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

CHUNK = 256 * 1024  # bytes read per turn from one side (TLS records are at most 16 KiB)

# Upstream socket (gRPC's view: "ipv4:127.0.0.1:<gate's port>") -> the client's address,
# in gRPC's own spelling. Process-wide: every gate of this process registers here (its
# upstream ports are distinct while their sockets are open).
_PEERS: dict[str, str] = {}
_PEERS_LOCK = threading.Lock()


def grpc_peer(addr: tuple) -> str:
    """A socket address in the form gRPC's ``context.peer()`` uses."""
    host, port = addr[0], addr[1]
    return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"


def real_peer(peer: str) -> str:
    """The client behind ``peer`` (what gRPC reports) when it came through a gate, else
    ``peer`` itself."""
    with _PEERS_LOCK:
        return _PEERS.get(peer, peer)


@dataclass(eq=False)
class _Pair:
    """One relayed connection: the client's socket, gRPC's, and the bytes in flight."""

    client: socket.socket
    upstream: socket.socket
    address: str  # the client's host (what the cap counts)
    key: str  # gRPC's name for the upstream socket (the _PEERS key)
    to_up: bytearray = field(default_factory=bytearray)
    to_client: bytearray = field(default_factory=bytearray)
    client_eof: bool = False
    upstream_eof: bool = False


class PeerGate:
    """Accepts on ``listen``, caps connections per address, relays to ``upstream``."""

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int],
                 per_address: int) -> None:
        self.upstream = upstream
        self.per_address = per_address
        family = socket.AF_INET6 if ":" in listen[0] else socket.AF_INET
        self._sock = socket.create_server(listen, family=family, backlog=1024,
                                          dualstack_ipv6=family == socket.AF_INET6
                                          and socket.has_dualstack_ipv6())
        self._sock.setblocking(False)
        self.port: int = self._sock.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ, None)
        self._counts: Counter[str] = Counter()
        self._pairs: set[_Pair] = set()
        self.refused = 0  # connections closed over the cap since start (metrics, tests)
        self._lock = threading.Lock()  # guards _counts for open_from()
        self._stop = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._run, name="peer-gate", daemon=True)

    def start(self) -> int:
        self._thread.start()
        return self.port

    def open_from(self, address: str) -> int:
        """Connections the gate holds open for ``address`` (a host, no port)."""
        with self._lock:
            return self._counts[address]

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(timeout=5)

    # ---- the loop ---------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for key, mask in self._sel.select(timeout=1.0):
                    if key.fileobj is self._sock:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(64)
                    else:
                        self._serve(key.data, key.fileobj, mask)  # type: ignore[arg-type]
        finally:
            for pair in list(self._pairs):
                self._close(pair)
            self._sel.close()
            for s in (self._sock, self._wake_r, self._wake_w):
                s.close()

    def _accept(self) -> None:
        for _ in range(64):  # a burst: take what is queued, then serve the others
            try:
                client, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE and friends: log, keep serving the open ones
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("peer gate: cannot accept (%s)", e.strerror)
                return
            host = addr[0]
            with self._lock:
                over = self._counts[host] >= self.per_address
                if not over:
                    self._counts[host] += 1
            if over:
                self.refused += 1
                # RST, not FIN: the client learns at once, and no TIME_WAIT is kept here
                with contextlib.suppress(OSError):
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                client.close()
                if self.refused in (1, 10, 100, 1000) or self.refused % 10000 == 0:
                    log.warning("peer gate: %s holds %d connections (max_connections_per_address);"
                                " refused one (%d refused so far)", host, self.per_address,
                                self.refused)
                continue
            try:
                up = socket.create_connection(self.upstream, timeout=5)
            except OSError as e:
                log.warning("peer gate: the broker's own port is unreachable: %s", e)
                with self._lock:
                    self._counts[host] -= 1
                client.close()
                continue
            for s in (client, up):
                s.setblocking(False)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = _Pair(client, up, host, grpc_peer(up.getsockname()))
            with _PEERS_LOCK:
                _PEERS[pair.key] = grpc_peer(addr)
            self._pairs.add(pair)
            self._sel.register(client, selectors.EVENT_READ, pair)
            self._sel.register(up, selectors.EVENT_READ, pair)

    def _serve(self, pair: _Pair, sock: socket.socket, mask: int) -> None:
        if pair not in self._pairs:
            return
        src_is_client = sock is pair.client
        try:
            if mask & selectors.EVENT_READ:
                self._read(pair, src_is_client)
            if mask & selectors.EVENT_WRITE:
                self._flush(pair, to_client=src_is_client)
        except OSError:
            self._close(pair)
            return
        if pair.client_eof and pair.upstream_eof and not pair.to_up and not pair.to_client:
            self._close(pair)
            return
        self._interest(pair)

    def _read(self, pair: _Pair, from_client: bool) -> None:
        src = pair.client if from_client else pair.upstream
        buf = pair.to_up if from_client else pair.to_client
        if buf:  # the other side has not taken the last read yet: backpressure
            return
        try:
            data = src.recv(CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            if from_client:
                pair.client_eof = True
            else:
                pair.upstream_eof = True
            dst = pair.upstream if from_client else pair.client
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            return
        buf += data
        self._flush(pair, to_client=not from_client)

    @staticmethod
    def _flush(pair: _Pair, *, to_client: bool) -> None:
        buf = pair.to_client if to_client else pair.to_up
        dst = pair.client if to_client else pair.upstream
        while buf:
            try:
                n = dst.send(buf)
            except (BlockingIOError, InterruptedError):
                return
            del buf[:n]

    def _interest(self, pair: _Pair) -> None:
        """Read a side only while what it sent last has been passed on (backpressure) and
        it has not ended; write a side while bytes wait for it. A side with neither is
        left out of the selector until the other side moves."""
        for sock, inbound, outbound, eof in (
                (pair.client, pair.to_up, pair.to_client, pair.client_eof),
                (pair.upstream, pair.to_client, pair.to_up, pair.upstream_eof)):
            events = 0
            if not inbound and not eof:
                events |= selectors.EVENT_READ
            if outbound:
                events |= selectors.EVENT_WRITE
            try:
                registered = self._sel.get_key(sock).events
            except KeyError:
                registered = 0
            if events == registered:
                continue
            if not events:
                self._sel.unregister(sock)
            elif not registered:
                self._sel.register(sock, events, pair)
            else:
                self._sel.modify(sock, events, pair)

    def _close(self, pair: _Pair) -> None:
        if pair not in self._pairs:
            return
        self._pairs.discard(pair)
        for s in (pair.client, pair.upstream):
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(s)
            s.close()
        with _PEERS_LOCK:
            _PEERS.pop(pair.key, None)
        with self._lock:
            self._counts[pair.address] -= 1
            if self._counts[pair.address] <= 0:
                del self._counts[pair.address]
