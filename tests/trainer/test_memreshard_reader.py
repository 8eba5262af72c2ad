"""The memory tier's DCP reader over a real keeper (TCP on loopback), in one process.

A restore reads every old rank's snapshot at once, on a connection each, and the bytes of
a box that is one contiguous run in both the snapshot and the target (rows of a shard)
land straight in the target tensor; any other box (a column slice) comes whole into a
scratch chunk and is narrowed. Either way the loaded state equals the saved one, only the
rows a target needs travel, and a keeper's refusal fails the load with a clear error.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from trainer import memreshard
from trainer.memkeeper import serve
from trainer.memtier import PREFIX, KeeperClient, encode, head_length, load_head

TOKEN = "tok"


@pytest.fixture
def keeper():
    server = serve("127.0.0.1", 0, TOKEN)
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def save_split(address: str, full: dict[str, torch.Tensor], dim: int, parts: int,
               step: int = 3) -> list[memreshard.Head]:
    """Each tensor of ``full`` cut into ``parts`` chunks along ``dim``, old rank q keeping
    the q-th, put into the keeper as a snapshot of the real format; the heads as a
    restore reads them (over the keeper, by ranged gets)."""
    c = KeeperClient(address, TOKEN)
    heads = []
    for q in range(parts):
        tensors, chunks = [], {}
        for key, t in full.items():
            piece = t.chunk(parts, dim)[q].contiguous()
            offsets = [0] * t.dim()
            offsets[dim] = sum(p.shape[dim] for p in t.chunk(parts, dim)[:q])
            tensors.append((key, piece))
            chunks[key] = (offsets, list(t.shape))
        segments = encode(step, parts, {"trainer.step": step}, tensors, chunks)
        assert c.request({"op": "put", "job": "j", "rank": q, "step": step, "world": parts},
                         segments)[0]["ok"]
        prefix = bytearray(PREFIX)
        c.request_into({"op": "get", "job": "j", "rank": q, "step": step,
                        "ranges": [[0, PREFIX]]}, [memoryview(prefix)])
        raw = bytearray(head_length(prefix))
        c.request_into({"op": "get", "job": "j", "rank": q, "step": step,
                        "ranges": [[PREFIX, len(raw)]]}, [memoryview(raw)])
        head = load_head(raw)
        heads.append(memreshard.Head(q, head["tensors"], head["small"], head["chunks"],
                                     PREFIX + len(raw)))
    return heads


def fetcher(address: str, step: int = 3) -> tuple[Any, list[tuple[int, int, int]], set[str]]:
    """A reader's fetch over the keeper (a connection per call, as a restore does), with
    what it asked for: (old rank, bytes, ranges) per call, and the threads it ran on."""
    asked: list[tuple[int, int, int]] = []
    threads: set[str] = set()

    def fetch(q: int, ranges: list[tuple[int, int]], into: list[memoryview]) -> None:
        threads.add(threading.current_thread().name)
        asked.append((q, sum(n for _, n in ranges), len(ranges)))
        conn = KeeperClient(address, TOKEN)
        try:
            conn.request_into({"op": "get", "job": "j", "rank": q, "step": step,
                               "ranges": [list(r) for r in ranges]}, into)
        finally:
            conn.close()

    return fetch, asked, threads


def full_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(12, 5, generator=g), "b": torch.randn(12, generator=g),
            "e": torch.randn(6, 4, generator=g).to(torch.bfloat16)}


def test_row_chunks_land_straight_in_the_targets_and_only_needed_rows_travel(keeper: str) -> None:
    full = full_state()
    heads = save_split(keeper, full, dim=0, parts=3)
    # the new rank holds rows 2..8 of each tensor (a 2-rank reshard's middle, say): plain
    # tensors whose storage the load must fill in place
    target = {k: torch.zeros_like(v) for k, v in full.items()}
    live = {k: v.data_ptr() for k, v in target.items()}
    fetch, asked, threads = fetcher(keeper)
    reader = memreshard.SnapshotReader(memreshard.global_metadata(heads), heads, fetch)
    dcp.load(target, storage_reader=reader, no_dist=True)
    for k, v in full.items():
        assert torch.equal(target[k], v), k
        assert target[k].data_ptr() == live[k], f"{k} was replaced, not filled"
    total = sum(v.nbytes for v in full.values())
    assert reader.bytes_read == reader.direct_bytes == total  # all in place, each byte once
    assert sorted(q for q, _, _ in asked) == [0, 1, 2]  # one request per old rank
    assert reader.read_from == {0, 1, 2}
    assert all(name.startswith("cb-memread") for name in threads)


def test_a_column_slice_is_narrowed_out_of_a_scratch_chunk(keeper: str) -> None:
    full = {"w": torch.randn(4, 6), "v": torch.arange(8.0).reshape(2, 4)}
    heads = save_split(keeper, full, dim=1, parts=2)
    target = {k: torch.zeros_like(v) for k, v in full.items()}
    fetch, asked, _ = fetcher(keeper)
    reader = memreshard.SnapshotReader(memreshard.global_metadata(heads), heads, fetch)
    dcp.load(target, storage_reader=reader, no_dist=True)
    for k, v in full.items():
        assert torch.equal(target[k], v), k
    assert reader.direct_bytes == 0 and reader.bytes_read == sum(v.nbytes for v in full.values())


def test_box_span_says_which_boxes_are_one_run() -> None:
    assert memreshard.box_span([6, 4], [2, 0], [3, 4]) == (8, 12)  # rows
    assert memreshard.box_span([6, 4], [2, 1], [1, 2]) == (9, 2)  # part of one row
    assert memreshard.box_span([6, 4], [0, 1], [6, 2]) is None  # columns
    assert memreshard.box_span([2, 3, 4], [1, 0, 0], [1, 3, 4]) == (12, 12)
    assert memreshard.box_span([2, 3, 4], [0, 1, 0], [2, 1, 4]) is None
    assert memreshard.box_span([], [], []) == (0, 1)  # a scalar


def test_a_missing_snapshot_fails_the_load_with_the_keepers_error(keeper: str) -> None:
    heads = save_split(keeper, {"w": torch.randn(4, 2)}, dim=0, parts=2)
    fetch, _, _ = fetcher(keeper, step=99)  # the keeper holds step 3 only
    reader = memreshard.SnapshotReader(memreshard.global_metadata(heads), heads, fetch)
    with pytest.raises(CheckpointException) as failed:
        dcp.load({"w": torch.zeros(4, 2)}, storage_reader=reader, no_dist=True)
    assert "RuntimeError: missing" in str(failed.value)
    # the connection that got the refusal is still usable: the stream stayed whole
    c = KeeperClient(keeper, TOKEN)
    with pytest.raises(RuntimeError, match="missing"):
        c.request_into({"op": "get", "job": "j", "rank": 0, "step": 99, "ranges": [[0, 4]]},
                       [memoryview(bytearray(4))])
    assert c.request({"op": "index", "job": "j"})[0]["ranks"] == {"0": {"3": 2}, "1": {"3": 2}}
