"""The checkpoint data path in one process: shard layout, planning, legacy checkpoints, S3.

No process group (DCP's single-process mode) and small models, so each test takes about
a second; the multi-rank, resharding and SIGTERM paths run in test_trainer_processes.py.
S3 is moto's real HTTP server; faults come from a real HTTP proxy in front of it
(tests/fixtures/faulty_proxy.py), so botocore's and tenacity's retries are exercised
through the real client stack.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.fixtures.faulty_proxy import FaultPlan, FaultyProxy
from tests.trainer.managers import assert_same_state, make_manager
from trainer import storage
from trainer.checkpoint import CheckpointManager
from trainer.errors import StoreUnavailable, TrainerError
from trainer.shardfile import RAW_DESCRIPTOR
from trainer.shardio import SMALL_ITEM_BYTES, contiguous_range
from trainer.storage import LocalStore, S3Store, step_name

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# 1536 x 1536 fp32 = 9.4 MB per weight and per Adam moment: shard files over the 8 MiB
# multipart threshold, one of them over two 16 MiB parts
WIDE = 1536


# ------------------------------------------------------------------- shard file layout
def test_shard_files_are_safetensors_of_the_raw_tensors(tmp_path: Path) -> None:
    from safetensors import safe_open

    m = make_manager(str(tmp_path), width=1024)
    m.save(3, 24, blocking=True)
    ckpt = tmp_path / step_name(3)
    shards = sorted(ckpt.glob("*.distcp"))
    assert [p.name for p in shards] == ["__0_0.distcp", "__0_1.distcp", "__0_2.distcp"]
    found: dict[str, torch.Tensor] = {}
    for path in shards:
        with safe_open(str(path), framework="pt") as f:  # the stock safetensors reader
            meta = f.metadata()
            assert meta["cb_shard_format"] == "1" and meta["DCP_VERSION"] == "1.0"
            sharding = json.loads(meta["DCP_SHARDING_INFO"])
            byte_items = set(json.loads(meta.get("cb_byte_items", "[]")))
            for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                t = f.get_tensor(key)
                if key in byte_items:  # pickled objects (e.g. the LR scheduler's state)
                    assert path.name == "__0_0.distcp"
                    continue
                assert sharding[key]["saved_offsets"] == [0] * t.dim()  # one rank: whole
                nbytes = t.numel() * t.element_size()
                if path.name == "__0_0.distcp":
                    assert nbytes < SMALL_ITEM_BYTES
                else:
                    assert nbytes >= SMALL_ITEM_BYTES
                found[key] = t
    model, state = m.model.state_dict(), m.optim.state_dict()["state"]
    assert torch.equal(found["model.0.weight"], model["0.weight"])
    assert torch.equal(found["model.1.bias"], model["1.bias"])
    assert torch.equal(found["optim.state.0.weight.exp_avg_sq"], state[0]["exp_avg_sq"])
    assert torch.equal(found["trainer.rng"], torch.get_rng_state())
    # the three 4 MiB tensors (weight, two moments) are balanced over the two big files
    big = [k for k, t in found.items() if t.numel() * t.element_size() >= SMALL_ITEM_BYTES]
    assert len(big) == 3


def test_stock_dcp_reader_refuses_raw_shards_clearly(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    m = make_manager(str(tmp_path))
    m.save(1, 8, blocking=True)
    state = {"model": {k: torch.empty_like(v) for k, v in m.model.state_dict().items()}}
    name = RAW_DESCRIPTOR.split("/")[0]  # DCP names the extension without its version
    with pytest.raises(BaseException, match=f"Unknown extension name='{name}'"):
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(tmp_path / step_name(1))))


def test_contiguous_range_matches_brute_force() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        dims = rng.randint(1, 4)
        sizes = [rng.randint(1, 5) for _ in range(dims)]
        offsets = [rng.randint(0, s - 1) for s in sizes]
        lengths = [rng.randint(1, s - o) for s, o in zip(sizes, offsets, strict=True)]
        flat = np.arange(int(np.prod(sizes))).reshape(sizes)
        idx = flat[tuple(slice(o, o + n) for o, n in zip(offsets, lengths, strict=True))].ravel()
        contiguous = bool(np.all(np.diff(idx) == 1))
        got = contiguous_range(sizes, offsets, lengths)
        if contiguous:
            assert got == (int(idx[0]), len(idx)), (sizes, offsets, lengths)
        else:
            assert got is None, (sizes, offsets, lengths)


# --------------------------------------------------------------------- loading paths
def test_load_lands_every_tensor_and_digest_flip_is_caught(tmp_path: Path) -> None:
    src = make_manager(str(tmp_path), width=1024, seed=0)
    src.save(5, 40, blocking=True)
    dst = make_manager(str(tmp_path), width=1024, seed=1)  # different weights and moments
    manifest = dst.load(step_name(5))
    assert manifest["step"] == 5 and manifest["samples_seen"] == 40
    assert_same_state(src, dst)
    # a flipped byte inside a tensor of a big file: same size, only the digest can tell
    shard = tmp_path / step_name(5) / "__0_2.distcp"
    data = bytearray(shard.read_bytes())
    data[-7] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(TrainerError, match=r"__0_2.distcp has xxh3_128 .* the manifest says"):
        make_manager(str(tmp_path), width=1024, seed=2).load(step_name(5))


def _write_legacy_checkpoint(m: CheckpointManager, root: Path, step: int) -> Path:
    """What manifest_version 2 wrote: DCP's stock FileSystemWriter (a torch.save record
    per tensor) and sha256 digests in the manifest."""
    import torch.distributed.checkpoint as dcp

    d = root / step_name(step)
    dcp.save(m._state(step, 8 * step), storage_writer=dcp.FileSystemWriter(str(d)))
    files = [
        {
            "name": p.name,
            "size": p.stat().st_size,
            "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
        }
        for p in sorted(d.iterdir())
    ]
    manifest = {
        **m.manifest_base,
        "manifest_version": 2,
        "step": step,
        "samples_seen": 8 * step,
        "world_size": 1,
        "files": files,
    }
    LocalStore(str(root)).write_manifest(step_name(step), manifest)
    return d


def test_version_2_checkpoint_still_loads_and_its_sha256_is_checked(tmp_path: Path) -> None:
    src = make_manager(str(tmp_path), width=1024, seed=0)
    d = _write_legacy_checkpoint(src, tmp_path, 4)
    assert b"cb_shard_format" not in (d / "__0_0.distcp").read_bytes()[:4096]
    dst = make_manager(str(tmp_path), width=1024, seed=1)
    assert dst.load(step_name(4))["step"] == 4
    assert_same_state(src, dst)
    shard = d / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(TrainerError, match=r"__0_0.distcp has sha256 .* the manifest says"):
        make_manager(str(tmp_path), width=1024, seed=2).load(step_name(4))


# ------------------------------------------------------------------------------- S3
@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> storage.RetryPolicy:
    """The default policy waits up to a minute before giving up; the same counts, short waits."""
    policy = storage.RetryPolicy(
        attempts=3, wait_initial_s=0.01, wait_max_s=0.05, botocore_attempts=2
    )
    monkeypatch.setattr(storage, "RETRY", policy)
    return policy


def _s3_manager(
    s3_server: Any,
    monkeypatch: pytest.MonkeyPatch,
    endpoint: str,
    root: str,
    seed: int,
    use_async: bool = False,
) -> CheckpointManager:
    s3_server.apply_env(monkeypatch)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    return make_manager(root, width=WIDE, seed=seed, use_async=use_async)


def test_s3_multipart_save_and_load_survive_injected_errors(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch, fast_retries: storage.RetryPolicy
) -> None:
    bucket = s3_server.unique_bucket("shards")
    root = f"s3://{bucket}/run"
    with FaultyProxy(s3_server.endpoint_url) as proxy:
        proxy.plan = FaultPlan(fail_every=3, status=503)  # every 3rd PUT/POST: SlowDown
        src = _s3_manager(s3_server, monkeypatch, proxy.endpoint_url, root, seed=0)
        src.save(7, 56, blocking=True)
        parts = [p for m, p, st in proxy.log if m == "PUT" and "partNumber=" in p and st == 200]
        assert proxy.plan.injected >= 3 and len(parts) >= 3  # multipart, and faults were hit
        proxy.plan = FaultPlan(fail_every=2, status=500, methods=frozenset({"GET"}))
        dst = _s3_manager(s3_server, monkeypatch, proxy.endpoint_url, root, seed=1)
        assert dst.load(step_name(7))["step"] == 7
        assert proxy.plan.injected >= 3
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)  # the proxy is gone
    assert_same_state(src, dst)
    keys = s3_server.list_keys(bucket, "run/step-000000007/")
    assert "run/step-000000007/manifest.json" in keys
    assert s3_server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_s3_store_failing_for_good_fails_the_save_and_leaves_nothing_behind(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch, fast_retries: storage.RetryPolicy
) -> None:
    bucket = s3_server.unique_bucket("shards-bad")
    root = f"s3://{bucket}/run"
    with FaultyProxy(s3_server.endpoint_url) as proxy:
        m = _s3_manager(s3_server, monkeypatch, proxy.endpoint_url, root, seed=0)
        m.save(1, 8, blocking=True)
        proxy.plan = FaultPlan(fail_after=3, status=503)  # then the store stops accepting writes
        # A store answering 5xx after bounded retries is an outage (checkpoint_layout/faults.py):
        # StoreUnavailable (exit 81, the broker waits), not a crash or a configuration error.
        with pytest.raises(StoreUnavailable) as err:
            m.save(2, 16, blocking=True)
        # one line naming the store and its answer, not per-rank tracebacks
        msg = str(err.value)
        assert "\n" not in msg and f"checkpoint store {root} is unreachable" in msg
        assert "503" in msg or "SlowDown" in msg
        # an async save fails the same way, on the training thread's next save or wait
        a = _s3_manager(s3_server, monkeypatch, proxy.endpoint_url, root, seed=0, use_async=True)
        a.save(3, 24)
        with pytest.raises(StoreUnavailable, match=r"is unreachable"):
            a.wait()
        # bounded: attempts x botocore attempts per request, not forever
        assert proxy.plan.injected >= fast_retries.attempts * fast_retries.botocore_attempts
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)  # the proxy is gone
    store = S3Store(root)
    assert {s for s, ok in store.list_steps().items() if ok} == {1}  # 2 and 3 never committed
    assert s3_server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    # the previous checkpoint is intact and loads
    assert make_manager(root, width=WIDE, seed=3).load(step_name(1))["step"] == 1
