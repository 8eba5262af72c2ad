"""The in-memory tier's keeper over real TCP: bounded memory, the token, bad input."""

from __future__ import annotations

import socket
import struct

import pytest

from trainer.memkeeper import KEEP, recv_msg, send_msg, serve
from trainer.memtier import KeeperClient


@pytest.fixture
def keeper():
    server = serve("127.0.0.1", 0, "tok")
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_keeps_the_newest_steps_per_rank_and_reports_bytes(keeper: str) -> None:
    c = KeeperClient(keeper, "tok")
    for step in range(1, 6):
        reply, _ = c.request({"op": "put", "job": "j", "rank": 0, "step": step}, b"x" * step)
        assert reply["ok"]
    c.request({"op": "put", "job": "j", "rank": 1, "step": 5}, b"yy")
    assert c.request({"op": "steps", "job": "j", "rank": 0})[0]["steps"] == list(range(6 - KEEP, 6))
    assert c.request({"op": "stats"})[0] == {"ok": True, "bytes": 4 + 5 + 2, "snapshots": 3, "size": 0}
    reply, payload = c.request({"op": "get", "job": "j", "rank": 0, "step": 5})
    assert reply["ok"] and payload == b"xxxxx"
    assert c.request({"op": "get", "job": "j", "rank": 0, "step": 1})[0] == {
        "ok": False, "error": "missing", "size": 0}
    assert c.request({"op": "steps", "job": "other", "rank": 0})[0]["steps"] == []


def test_wrong_token_and_bad_requests_are_refused_and_change_nothing(keeper: str) -> None:
    bad = KeeperClient(keeper, "nope")
    reply, _ = bad.request({"op": "put", "job": "j", "rank": 0, "step": 1}, b"evil")
    assert reply == {"ok": False, "error": "wrong token", "size": 0}
    good = KeeperClient(keeper, "tok")
    assert good.request({"op": "stats"})[0]["snapshots"] == 0
    reply, _ = good.request({"op": "explode"})
    assert not reply["ok"] and "unknown op" in reply["error"]
    reply, _ = good.request({"op": "put", "job": "j", "rank": "zero", "step": 1})
    assert not reply["ok"] and "bad request" in reply["error"]
    # A header larger than allowed closes the connection without reading it; the keeper lives on.
    host, port = keeper.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as s:
        s.sendall(struct.pack(">I", 10**9))
        assert s.recv(1) == b""
    with socket.create_connection((host, int(port))) as s:
        send_msg(s, {"op": "stats", "token": "tok"})
        assert recv_msg(s)[0]["ok"]
