"""A rank's request to a memory keeper may take as long as its payload needs.

Why: Python's `sendall` counts a socket timeout over the whole send, and a 200m model's
snapshot is 1-3 GB per rank; with a fixed 60 s a loaded host's slow keeper made the
send fail (the snapshot dropped, the connection remade) although nothing was wrong.
Here a real TCP peer that starts reading only after a pause stands in for a slow
keeper, with the timeouts scaled down so the test takes seconds."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from trainer import memtier
from trainer.memkeeper import recv_msg, send_msg


def test_the_timeout_grows_with_the_payload() -> None:
    assert memtier.io_timeout(0) == memtier.IO_TIMEOUT_S
    three_gb = 3 << 30
    assert memtier.io_timeout(three_gb) >= memtier.IO_TIMEOUT_S + 300  # at most 8 MB/s assumed


def _slow_keeper(pause_s: float) -> tuple[socket.socket, threading.Thread]:
    """A peer that accepts one connection, waits ``pause_s``, then reads one message
    and answers ok (as a keeper busy elsewhere would)."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            time.sleep(pause_s)
            try:
                header, payload = recv_msg(conn)
                send_msg(conn, {"ok": True, "bytes": len(payload)})
            except OSError:
                pass  # the client gave up

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv, t


PAYLOAD = 32 << 20  # well over the loopback socket buffers: sendall waits for the reader


def test_a_large_put_waits_for_a_slow_keeper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memtier, "IO_TIMEOUT_S", 0.5)
    monkeypatch.setattr(memtier, "IO_MIN_BYTES_PER_S", 8 << 20)  # 32 MB: 4 s more
    srv, t = _slow_keeper(1.5)
    with srv:
        client = memtier.KeeperClient(f"127.0.0.1:{srv.getsockname()[1]}", "tok")
        reply, _ = client.request({"op": "put"}, [bytearray(PAYLOAD)])
        assert reply == {"ok": True, "bytes": PAYLOAD, "size": 0}
        t.join(10)


def test_without_the_payload_allowance_the_same_put_times_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memtier, "IO_TIMEOUT_S", 0.5)
    monkeypatch.setattr(memtier, "IO_MIN_BYTES_PER_S", 1 << 60)  # the old fixed timeout
    srv, t = _slow_keeper(1.5)
    with srv:
        client = memtier.KeeperClient(f"127.0.0.1:{srv.getsockname()[1]}", "tok")
        with pytest.raises(OSError):
            client.request({"op": "put"}, [bytearray(PAYLOAD)])
        t.join(10)
