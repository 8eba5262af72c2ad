"""The in-memory tier's keeper: one process per node holding ranks' snapshots in RAM.

Why a process of its own (docs/recovery.md): a rank's memory dies with the rank, and a
recovery restarts every rank, survivors included; the node's keeper outlives them, so
survivors restore from their own node and a replacement node's ranks from the buddy
node's keeper. Why not pickle: the keeper listens on a port and must never execute what
it receives. It stores opaque payloads (what the ranks serialized) under
`(job, rank, step)`, holds at most `KEEP` snapshots per `(job, rank)` *counting the one
arriving* (bounded memory: see `Store.begin_put`), and answers only requests carrying the
job's token.

Why the one arriving counts: a put's payload is received into a buffer of its full size
before it is stored, so a keeper that dropped its oldest step only once the new one was
complete held `KEEP + 1` snapshots per rank while receiving (measured: a 58M-parameter
job's keepers peaked at 1.5x their bound). With the default `KEEP = 2` the
keeper holds the newest complete step and the one arriving: a double buffer, enough
because ranks start a snapshot only once every rank's previous one is complete (the
ranks agree on it, trainer/memtier.py), so the newest complete step of every rank is
one and the same step whatever is in flight when a node dies.

Wire format, both ways: a 4-byte big-endian header length, a JSON header, then
`header["size"]` payload bytes (0 when none). Requests: `put` (job, rank, step, world,
size + payload), `get` (job, rank, step; optional `ranges` [[offset, length], ...]: only
those bytes, back to back: a rank resharding to another world size reads only the shard
parts it needs), `steps` (job, rank), `index` (job: every rank's held steps with the
world size each was taken on), `stats`. Replies: `{"ok": true, ...}` or `{"ok": false,
"error": "..."}`.

    python -m trainer.memkeeper --port-file F [--host 127.0.0.1] [--port 0] [--keep 2]
    (token from CB_MEMORY_TOKEN)
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import socket
import socketserver
import struct
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

KEEP = 2  # snapshots held per (job, rank), the arriving one included: the newest complete
# one survives a half-sent next
TOKEN_ENV = "CB_MEMORY_TOKEN"
MAX_HEADER = 64 * 1024
MAX_RANGES = 4096  # per ranged get (the header's size bounds it too)


Payload = bytes | bytearray | memoryview


def send_msg(sock: socket.socket, header: dict[str, Any],
             payload: Payload | Sequence[Payload] = b"") -> None:
    """`payload` may be a list of segments sent back to back as one payload: a rank sends
    its snapshot straight from its tensors' memory, never joined into one buffer."""
    segments = [payload] if isinstance(payload, bytes | bytearray | memoryview) else list(payload)
    size = sum(memoryview(s).nbytes for s in segments)
    head = json.dumps({**header, "size": size}).encode()
    sock.sendall(struct.pack(">I", len(head)) + head)
    for seg in segments:
        if memoryview(seg).nbytes:
            sock.sendall(seg)


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    """Exactly `n` bytes, received in place into one buffer (kept as is: a snapshot of
    gigabytes is not copied again after the socket's copy)."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("connection closed mid-message")
        got += k
    return buf


def recv_header(sock: socket.socket) -> dict[str, Any]:
    """A message's header; its `size` payload bytes follow on the socket."""
    (n,) = struct.unpack(">I", _recv_exact(sock, 4))
    if n > MAX_HEADER:
        raise ValueError(f"header of {n} bytes is too large")
    return json.loads(_recv_exact(sock, n))


def recv_payload(sock: socket.socket, header: dict[str, Any]) -> bytearray:
    size = int(header.get("size", 0))
    return _recv_exact(sock, size) if size else bytearray()


def recv_msg(sock: socket.socket) -> tuple[dict[str, Any], bytearray]:
    header = recv_header(sock)
    return header, recv_payload(sock, header)


def recv_payload_into(sock: socket.socket, header: dict[str, Any],
                      dests: Sequence[memoryview]) -> None:
    """A message's payload received straight into `dests`, back to back (writable views
    whose sizes add up to the payload's): a restore lands a ranged get's bytes in the
    tensors they belong to, with no buffer of its own in between and no copy after."""
    size = int(header.get("size", 0))
    want = sum(d.nbytes for d in dests)
    if size != want:
        raise ValueError(f"payload is {size} bytes, {want} expected")
    for dest in dests:
        view, got, n = dest.cast("B"), 0, dest.nbytes
        while got < n:
            k = sock.recv_into(view[got:], n - got)
            if k == 0:
                raise ConnectionError("connection closed mid-message")
            got += k


class Store:
    """The snapshots held, at most `keep` per (job, rank) with the one arriving
    (`begin_put`); thread-safe."""

    def __init__(self, keep: int = KEEP) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.keep = keep
        self._lock = threading.Lock()
        self._data: dict[tuple[str, int], dict[int, bytearray]] = {}
        self._world: dict[tuple[str, int, int], int] = {}  # (job, rank, step) -> world size

    def begin_put(self, job: str, rank: int, step: int) -> None:
        """A put of `step` is about to be received: make room for it first, so the keeper
        never holds more than `keep` snapshots of a rank, the arriving one included.
        Drops the rank's steps at or after `step` (`put` says why) and its oldest until
        `keep - 1` are left. With `keep` 2 the newest complete step stays while the next
        arrives; with 1 nothing does (a node lost mid-send: the store is used)."""
        with self._lock:
            held = self._data.get((job, rank), {})
            for s in [s for s in held if s >= step]:
                self._drop(job, rank, s)
            held = self._data.get((job, rank), {})
            for old in sorted(held)[:max(0, len(held) - (self.keep - 1))]:
                self._drop(job, rank, old)

    def put(self, job: str, rank: int, step: int, payload: bytearray, world: int = 0) -> None:
        """Hold `step`; drop what is older than the newest `KEEP`, and anything newer than
        `step`: a job that went back (resumed from an older durable checkpoint after both
        copies of a shard were lost) abandoned those, and they would otherwise push its
        new steps out until it passed them again. `world` (0 = not said): the world size
        the snapshot was taken on. Once this rank's held steps are all of a world of `W`
        ranks, the steps of ranks >= `W` (a larger world the job shrank from) older than
        them can never be restored again (no rank < `W` still holds their step): dropped,
        so memory stays bounded across a shrink."""
        with self._lock:
            for newer in [s for s in self._data.get((job, rank), {}) if s > step]:
                self._drop(job, rank, newer)
            steps = self._data.setdefault((job, rank), {})
            steps[step] = payload
            self._world[(job, rank, step)] = world
            for old in sorted(steps)[:-self.keep]:
                self._drop(job, rank, old)
            worlds = {self._world.get((job, rank, s), 0) for s in steps}
            if world > 0 and worlds == {world} and len(steps) >= self.keep:
                oldest = min(steps)
                for (j, r), held in list(self._data.items()):
                    if j == job and r >= world:
                        for s in [s for s in held if s < oldest or s > step]:
                            self._drop(j, r, s)

    def _drop(self, job: str, rank: int, step: int) -> None:
        held = self._data.get((job, rank), {})
        held.pop(step, None)
        self._world.pop((job, rank, step), None)
        if not held:
            self._data.pop((job, rank), None)

    def get(self, job: str, rank: int, step: int) -> bytearray | None:
        with self._lock:
            return self._data.get((job, rank), {}).get(step)

    def steps(self, job: str, rank: int) -> list[int]:
        with self._lock:
            return sorted(self._data.get((job, rank), {}))

    def index(self, job: str) -> dict[str, dict[str, int]]:
        """Every rank of `job` held: {rank: {step: world size}} (JSON keys are strings)."""
        with self._lock:
            return {str(r): {str(s): self._world.get((j, r, s), 0) for s in sorted(held)}
                    for (j, r), held in sorted(self._data.items()) if j == job}

    def stats(self) -> dict[str, int]:
        with self._lock:
            held = [p for steps in self._data.values() for p in steps.values()]
            return {"bytes": sum(len(p) for p in held), "snapshots": len(held)}


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        while True:
            try:
                header = recv_header(sock)
                self.server.before_payload(header)
                payload = recv_payload(sock, header)
            except (ConnectionError, OSError, ValueError):
                return
            try:
                reply, out = self.server.answer(header, payload)
            except (KeyError, TypeError, ValueError) as exc:
                reply, out = {"ok": False, "error": f"bad request: {exc}"}, b""
            send_msg(sock, reply, out)
            # Why: this thread then blocks on the connection's next message, maybe for
            # the rank's lifetime; a payload or a reply's snapshot still referenced here
            # would stay in memory after the store dropped it, outside the bound.
            del payload, out


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], token: str, keep: int = KEEP) -> None:
        super().__init__(addr, _Handler)
        self.token = token
        self.store = Store(keep)

    def before_payload(self, h: dict[str, Any]) -> None:
        """A put with the job's token: room for its payload before it is received
        (`Store.begin_put`). Anything malformed is left to `answer`, which refuses it."""
        if h.get("op") != "put" or not hmac.compare_digest(str(h.get("token", "")), self.token):
            return
        try:
            job, rank, step = str(h["job"]), int(h["rank"]), int(h["step"])
        except (KeyError, TypeError, ValueError):
            return
        self.store.begin_put(job, rank, step)

    def answer(self, h: dict[str, Any], payload: bytearray) -> tuple[dict[str, Any], Payload]:
        if not hmac.compare_digest(str(h.get("token", "")), self.token):
            return {"ok": False, "error": "wrong token"}, b""
        op = h["op"]
        if op == "put":
            self.store.put(str(h["job"]), int(h["rank"]), int(h["step"]), payload,
                           int(h.get("world", 0)))
            return {"ok": True, **self.store.stats()}, b""
        if op == "get":
            data = self.store.get(str(h["job"]), int(h["rank"]), int(h["step"]))
            if data is None:
                return {"ok": False, "error": "missing"}, b""
            if "ranges" not in h:
                return {"ok": True}, data
            return {"ok": True}, _ranges(data, h["ranges"])
        if op == "steps":
            return {"ok": True, "steps": self.store.steps(str(h["job"]), int(h["rank"]))}, b""
        if op == "index":
            return {"ok": True, "ranks": self.store.index(str(h["job"]))}, b""
        if op == "stats":
            return {"ok": True, **self.store.stats()}, b""
        raise ValueError(f"unknown op {op!r}")


def _ranges(data: bytearray, ranges: Any) -> list[memoryview]:
    """The requested byte ranges of a payload as views (sent back to back, no copy);
    ValueError for anything but a list of in-bounds [offset, length] pairs."""
    if not isinstance(ranges, list) or len(ranges) > MAX_RANGES:
        raise ValueError(f"ranges must be a list of at most {MAX_RANGES} [offset, length]")
    view, out = memoryview(data), []
    for pair in ranges:
        if not (isinstance(pair, list) and len(pair) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in pair)):
            raise ValueError(f"range {pair!r} is not [offset, length]")
        off, n = pair
        if off < 0 or n < 0 or off + n > len(data):
            raise ValueError(f"range [{off}, {n}] is outside the {len(data)}-byte snapshot")
        out.append(view[off:off + n])
    return out


def serve(host: str, port: int, token: str, keep: int = KEEP) -> _Server:
    """A keeper serving on a background thread (tests and the executor use the CLI)."""
    server = _Server((host, port), token, keep)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m trainer.memkeeper")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file", required=True, help="the bound port is written here")
    p.add_argument("--keep", type=int, default=KEEP,
                   help=f"snapshots held per (job, rank), the one arriving included, default "
                        f"{KEEP} (the newest complete one while the next arrives); 1 halves "
                        "the memory but a node lost while a snapshot is being sent leaves no "
                        "step every rank holds (the store is used then)")
    args = p.parse_args(argv)
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        sys.exit(f"memkeeper: {TOKEN_ENV} must be set (the job's token)")
    if args.keep < 1:
        sys.exit(f"memkeeper: --keep must be at least 1, got {args.keep}")
    server = _Server((args.host, args.port), token, args.keep)
    tmp = Path(args.port_file + ".tmp")
    tmp.write_text(str(server.server_address[1]))
    tmp.replace(args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
