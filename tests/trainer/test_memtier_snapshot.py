"""What a memory-tier snapshot holds, with real gloo ranks and real keepers.

The shard copy runs on the tier's thread while the next step's forward and backward run
(an optimizer step pre-hook fences it), the state's layout is cached between snapshots,
and snapshots travel as raw tensor segments. So: every tensor and every small item of the
snapshot a keeper holds equals the live state at the step it was taken, also after the
optimizer's state tensors were replaced mid-run (the cache must notice); and the format
round-trips every dtype and shape (unit test, no processes).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.trainer.launch import REPO, launch
from tests.trainer.test_library_example import wait_codes
from tests.trainer.test_memory_tier import TOKEN, Keeper
from trainer.memkeeper import TOKEN_ENV
from trainer.memtier import decode, encode


def test_format_round_trips_every_dtype_and_shape() -> None:
    tensors = [("a", torch.randn(3, 4)), ("b", torch.arange(7, dtype=torch.int64)),
               ("c", torch.tensor(5.0)), ("d", torch.empty(0, 3)),
               ("e", torch.randn(2, 2).to(torch.bfloat16)), ("f", torch.tensor([True, False]))]
    small = {"trainer.step": 9, "trainer.rng": torch.get_rng_state(), "optim.lr": 0.5}
    payload = bytearray(b"".join(bytes(s) for s in encode(9, 2, small, tensors)))
    snap = decode(payload)
    assert snap["step"] == 9 and snap["world_size"] == 2
    state = snap["state"]
    for key, t in tensors:
        assert state[key].dtype == t.dtype and torch.equal(state[key], t), key
    assert state["optim.lr"] == 0.5 and torch.equal(state["trainer.rng"], small["trainer.rng"])
    with pytest.raises(RuntimeError, match="format"):
        decode(bytearray(b"not a snapshot" * 4))
    with pytest.raises(RuntimeError, match="bytes"):
        decode(payload + b"x")


@pytest.mark.slow
def test_each_snapshot_equals_the_live_state_of_its_step(tmp_path: Path) -> None:
    keepers = [Keeper(tmp_path, f"n{i}") for i in range(2)]
    try:
        out = tmp_path / "report.json"
        env = {"CB_MEMORY_EVERY": "1", "CB_MEMORY_KEEPERS": ",".join(k.address for k in keepers),
               TOKEN_ENV: TOKEN}
        run = launch(tmp_path / "run", 2, "{}", str(tmp_path / "ckpt"), job_id="j-probe",
                     argv=[str(REPO / "tests" / "trainer" / "memtier_probe.py"), str(out)], env=env,
                     rank_env={r: {"NODE_RANK": str(r)} for r in range(2)})
        wait_codes(run, 0)
        report = json.loads(out.read_text())
    finally:
        for k in keepers:
            k.kill()
    assert report["overlap"] is True  # the copy ran on the tier's thread, fenced
    assert report["compared"] > 100 and report["mismatches"] == [], report
    assert report["layouts"] == 2  # walked once, and once more after the replacement
    stats = report["stats"]
    assert stats["taken"] == 8 and stats["failed"] == 0 and stats["side_copy_s_per_snapshot"] > 0


def test_replicas_split_a_chunk_by_rows_and_together_keep_it_once() -> None:
    """HSDP: the ranks holding the same chunk each keep a part of it in their snapshots."""
    from trainer.memreshard import replica_piece

    chunk = torch.arange(21.0).reshape(7, 3)
    parts = [replica_piece(chunk, i, 3) for i in range(3)]
    assert [p[1] for p in parts] == [0, 2, 4]  # first rows: 7 rows as 2, 2, 3
    assert torch.equal(torch.cat([p[0] for p in parts]), chunk)
    assert all(p[0].data_ptr() >= chunk.data_ptr() for p in parts)  # views, not copies
    small = torch.ones(2, 4)  # fewer rows than replicas: replica 0 keeps it whole
    assert replica_piece(small, 0, 3)[0] is small and replica_piece(small, 2, 3) is None
    scalar = torch.tensor(5.0)
    assert replica_piece(scalar, 0, 2) == (scalar, 0) and replica_piece(scalar, 1, 2) is None
    assert replica_piece(chunk, 0, 1) == (chunk, 0)  # not replicated: all of it
