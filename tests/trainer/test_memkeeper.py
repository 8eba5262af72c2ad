"""The in-memory tier's keeper over real TCP: bounded memory, the token, bad input."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer.memkeeper import KEEP, TOKEN_ENV, Store, recv_msg, send_msg, serve
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


def test_a_put_of_an_older_step_drops_the_newer_ones_of_that_rank(keeper: str) -> None:
    """A job that went back (both copies of a shard lost, resumed from the store) must not
    have its new steps pushed out by the abandoned ones it has not reached again."""
    c = KeeperClient(keeper, "tok")
    for step in (7, 8):
        c.request({"op": "put", "job": "j", "rank": 0, "step": step}, b"old")
    c.request({"op": "put", "job": "j", "rank": 1, "step": 8}, b"other rank")
    c.request({"op": "put", "job": "j", "rank": 0, "step": 3}, [b"ne", memoryview(b"w")])
    assert c.request({"op": "steps", "job": "j", "rank": 0})[0]["steps"] == [3]
    assert c.request({"op": "get", "job": "j", "rank": 0, "step": 3})[1] == b"new"  # segments joined
    assert c.request({"op": "steps", "job": "j", "rank": 1})[0]["steps"] == [8]


def test_keep_one_holds_only_the_newest_step() -> None:
    server = serve("127.0.0.1", 0, "tok", keep=1)
    try:
        c = KeeperClient(f"127.0.0.1:{server.server_address[1]}", "tok")
        for step in (1, 2, 3):
            c.request({"op": "put", "job": "j", "rank": 0, "step": step}, b"x" * step)
        assert c.request({"op": "steps", "job": "j", "rank": 0})[0]["steps"] == [3]
        assert c.request({"op": "stats"})[0]["bytes"] == 3
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(ValueError, match="at least 1"):
        Store(0)


def test_index_and_ranged_gets_serve_a_reshard(keeper: str) -> None:
    """A restore onto another world size asks which steps of which ranks (and taken on
    which world size) a keeper holds, then reads only byte ranges of a snapshot."""
    c = KeeperClient(keeper, "tok")
    c.request({"op": "put", "job": "j", "rank": 0, "step": 4, "world": 3}, b"0123456789")
    c.request({"op": "put", "job": "j", "rank": 2, "step": 4, "world": 3}, b"abc")
    c.request({"op": "put", "job": "other", "rank": 0, "step": 9, "world": 1}, b"x")
    assert c.request({"op": "index", "job": "j"})[0]["ranks"] == {"0": {"4": 3}, "2": {"4": 3}}
    reply, data = c.request({"op": "get", "job": "j", "rank": 0, "step": 4,
                             "ranges": [[0, 2], [7, 3], [5, 0]]})
    assert reply["ok"] and data == b"01789"
    for bad in ([[8, 3]], [[-1, 2]], [["0", 1]], [[0, 1, 2]], "0-4", [[True, 1]]):
        reply, data = c.request({"op": "get", "job": "j", "rank": 0, "step": 4, "ranges": bad})
        assert not reply["ok"] and "bad request" in reply["error"] and data == b"", bad


def test_a_shrunk_world_drops_the_larger_worlds_ranks_once_they_cannot_be_restored() -> None:
    """Bounded memory across a shrink 3 -> 2: old rank 2's steps stay while rank 0 still
    holds a 3-rank step (a restore may need them), and go once every step rank 0 holds
    is of the 2-rank world."""
    store = Store(keep=2)
    for rank in (0, 2):
        store.put("j", rank, 10, bytearray(b"old"), world=3)
    store.put("j", 0, 11, bytearray(b"new"), world=2)  # rank 0 holds steps 10 (3) and 11 (2)
    assert store.index("j") == {"0": {"10": 3, "11": 2}, "2": {"10": 3}}
    store.put("j", 0, 12, bytearray(b"new"), world=2)
    assert store.index("j") == {"0": {"11": 2, "12": 2}}
    assert store.stats() == {"bytes": 6, "snapshots": 2}


def test_newest_complete_step_needs_every_old_rank_of_one_world() -> None:
    """The step a restore picks: newest, >= the durable one, every old rank of its world
    size held, as every restoring rank sees it."""
    from trainer.memtier import newest_complete

    three = {(q, 12, 3) for q in range(3)} | {(q, 13, 3) for q in (0, 2)}  # 13: rank 1 lost
    assert newest_complete([three, three], 1) == (12, 3)
    assert newest_complete([three, three], 13) is None  # older than the durable checkpoint
    assert newest_complete([three, three - {(1, 12, 3)}], 1) is None  # one rank cannot see it
    mixed = three | {(0, 14, 2), (1, 14, 2), (2, 14, 3)}
    assert newest_complete([mixed], 1) == (14, 2)
    assert newest_complete([], 1) is None


def _kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} missing")


def test_a_keeper_process_stays_within_its_bound_while_a_put_arrives(tmp_path: Path) -> None:
    """A real keeper process serving two ranks (its node's and its ward's), KEEP = 2:
    it makes room for a put before receiving it, so its resident memory never exceeds
    KEEP snapshots per rank, the arriving one included (it used to hold KEEP + 1 while
    receiving); a snapshot read by a connection that then stays open is not kept alive
    by it; and a put half-sent when its sender dies leaves the newest complete step."""
    size = 40 << 20  # above glibc's largest mmap threshold: freed memory goes back at once
    port_file = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, "-m", "trainer.memkeeper", "--port-file",
                             str(port_file)], env={**os.environ, TOKEN_ENV: "tok"})
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "keeper did not start"
            time.sleep(0.02)
        addr = f"127.0.0.1:{port_file.read_text()}"
        ranks = {r: KeeperClient(addr, "tok") for r in (0, 1)}
        assert ranks[0].request({"op": "stats"})[0]["ok"]
        base = _kb(proc.pid, "VmRSS")
        payload = b"\x01" * size
        reader = KeeperClient(addr, "tok")  # a restore's connection, left open
        for step in (1, 2, 3, 4):
            for r, c in ranks.items():
                assert c.request({"op": "put", "job": "j", "rank": r, "step": step}, payload)[0]["ok"]
            if step == 2:
                assert len(reader.request({"op": "get", "job": "j", "rank": 0, "step": 2})[1]) == size
        # rank 0's step 5 arrives half, then its node dies
        host, _, port = addr.rpartition(":")
        with socket.create_connection((host, int(port))) as raw:
            head = json.dumps({"op": "put", "job": "j", "rank": 0, "step": 5, "token": "tok",
                               "size": size}).encode()
            raw.sendall(struct.pack(">I", len(head)) + head + payload[:size // 2])
            deadline = time.monotonic() + 10
            while ranks[1].request({"op": "steps", "job": "j", "rank": 0})[0]["steps"] != [4]:
                assert time.monotonic() < deadline, "the oldest step was not dropped first"
                time.sleep(0.01)
        deadline = time.monotonic() + 10
        while ranks[1].request({"op": "index", "job": "j"})[0]["ranks"] != {
                "0": {"4": 0}, "1": {"3": 0, "4": 0}}:
            assert time.monotonic() < deadline, "the half-sent put changed what is held"
            time.sleep(0.01)
        assert ranks[1].request({"op": "stats"})[0]["bytes"] == 3 * size
        bound_kb = 2 * KEEP * size // 1024  # two ranks served, KEEP each
        peak = _kb(proc.pid, "VmHWM") - base
        assert peak <= bound_kb * 1.05, f"peak {peak} kB over the bound {bound_kb} kB"
        # the half-sent buffer goes once the keeper has seen the connection close
        deadline = time.monotonic() + 10
        while _kb(proc.pid, "VmRSS") - base > 3 * size // 1024 * 1.05:  # what it holds now
            assert time.monotonic() < deadline, "the half-sent put's buffer was kept"
            time.sleep(0.02)
    finally:
        proc.kill()
        proc.wait()
