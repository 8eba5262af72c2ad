"""Checkpoint mover (region_agents/transfer.py) against moto's real S3 HTTP server.

One bucket per "region". The checkpoint is fake-but-valid: DCP-like file names and
sizes (one file above the multipart threshold, one tiny, one empty) and a manifest
written by the trainer's own manifest writer (trainer.storage.LocalStore.write_manifest)
in the trainer's format (trainer/checkpoint.py `_commit`). Faults come from a real HTTP
reverse proxy (tests/fixtures/faulty_proxy.py) that answers 500/503 like a busy store.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import pytest
import xxhash

from region_agents.transfer import (
    IncompleteCheckpoint,
    RetryPolicy,
    TransferFailed,
    copy_checkpoint,
    latest_complete_checkpoint,
    make_s3_client,
    plan_move,
)
from tests.fixtures.faulty_proxy import FaultPlan, FaultyProxy

MiB = 1024 * 1024
# small parts so a 12 MiB file is a real 3-part multipart upload / UploadPartCopy
SMALL = {"part_size": 5 * MiB, "multipart_threshold": 5 * MiB, "max_concurrency": 4}
FAST_RETRY = RetryPolicy(attempts=4, wait_initial_s=0.05, wait_max_s=0.2, botocore_attempts=1)
FILES = {
    ".metadata": 3000,
    "__0_0.distcp": 12 * MiB + 123,
    "__1_0.distcp": 6 * MiB,
    "__2_0.distcp": 0,
}


def make_checkpoint(root: Path, step: int, *, checksums: str = "", seed: int = 0) -> Path:
    """A complete checkpoint dir <root>/step-N: data files, then the manifest (last).

    `checksums`: "" (version-1 manifest, sizes only), "xxh3_128" (what the trainer writes
    now) or "sha256" (version 2)."""
    from trainer.storage import LocalStore, step_name

    name = step_name(step)
    d = root / name
    d.mkdir(parents=True)
    for i, (fname, size) in enumerate(sorted(FILES.items())):
        (d / fname).write_bytes(os.urandom(size) if seed == 0 else bytes([(seed + i) % 251]) * size)
    store = LocalStore(str(root))
    files = [{"name": n, "size": s} for n, s in sorted(store.list_files(name).items())]
    for f in files if checksums else []:
        data = (d / f["name"]).read_bytes()
        f[checksums] = (
            xxhash.xxh3_128(data).hexdigest()
            if checksums == "xxh3_128"
            else hashlib.new(checksums, data).hexdigest()
        )
    manifest = {
        "manifest_version": 1,
        "job_id": "job-1",
        "attempt": 1,
        "model_preset": "tiny",
        "model": {"d_model": 16},
        "step": step,
        "samples_seen": step * 8,
        "world_size": 3,
        "created": time.time(),
        "files": files,
    }
    store.write_manifest(name, manifest)
    return d


def local_tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in d.rglob("*") if p.is_file()}


def s3_tree(client: Any, uri: str) -> dict[str, bytes]:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix + "/"
    ):
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix) + 1 :]] = client.get_object(Bucket=bucket, Key=o["Key"])[
                "Body"
            ].read()
    return out


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(self, done: int, total: int) -> None:
        self.calls.append((done, total))

    def check(self, total: int) -> None:
        assert self.calls, "progress was never reported"
        dones = [d for d, _ in self.calls]
        assert all(b >= a for a, b in zip(dones, dones[1:], strict=False)), (
            "progress went backwards"
        )
        assert {t for _, t in self.calls} == {total}
        assert self.calls[-1] == (total, total)


@pytest.fixture
def s3(s3_server, monkeypatch):
    """Env for the default client (AWS_ENDPOINT_URL etc.) + a direct client for assertions."""
    s3_server.apply_env(monkeypatch)
    return s3_server


def test_local_to_s3_to_s3_to_local_round_trip(s3, tmp_path):
    src = make_checkpoint(tmp_path / "src", 120)
    expect = local_tree(src)
    total = sum(len(v) for v in expect.values())
    east, west = s3.unique_bucket("cb-us-east-2"), s3.unique_bucket("cb-us-west-2")
    direct = s3.client()

    rec = Recorder()
    up = copy_checkpoint(str(src), f"s3://{east}/jobs/j1/step-000000120", progress=rec, **SMALL)
    assert (up.method, up.bytes, up.files) == ("upload", total, len(FILES) + 1)
    rec.check(total)
    assert s3_tree(direct, f"s3://{east}/jobs/j1/step-000000120") == expect

    rec = Recorder()
    ss = copy_checkpoint(
        f"s3://{east}/jobs/j1/step-000000120",
        f"s3://{west}/jobs/j1/step-000000120",
        progress=rec,
        **SMALL,
    )
    assert ss.method == "server-side-copy" and ss.bytes == total
    rec.check(total)
    assert s3_tree(direct, f"s3://{west}/jobs/j1/step-000000120") == expect
    assert (
        latest_complete_checkpoint(f"s3://{west}/jobs/j1") == f"s3://{west}/jobs/j1/step-000000120"
    )

    rec = Recorder()
    dst = tmp_path / "dst" / "step-000000120"
    down = copy_checkpoint(f"s3://{west}/jobs/j1/step-000000120", str(dst), progress=rec, **SMALL)
    assert down.method == "download" and down.mb_per_s > 0
    rec.check(total)
    assert local_tree(dst) == expect
    assert latest_complete_checkpoint(str(tmp_path / "dst")) == str(dst)


def test_stream_copy_and_checksums_verified(s3, tmp_path):
    """Forced streaming S3->S3 and local->local, against a version-2 manifest's sha256."""
    src = make_checkpoint(tmp_path / "src", 40, checksums="sha256")
    expect = local_tree(src)
    a, b = s3.unique_bucket("cb-a"), s3.unique_bucket("cb-b")
    copy_checkpoint(str(src), f"s3://{a}/step-000000040", **SMALL)
    r = copy_checkpoint(
        f"s3://{a}/step-000000040", f"s3://{b}/x/step-000000040", server_side=False, **SMALL
    )
    assert r.method == "stream"
    assert s3_tree(s3.client(), f"s3://{b}/x/step-000000040") == expect
    r = copy_checkpoint(f"s3://{a}/step-000000040", f"s3://{b}/y/step-000000040", **SMALL)
    assert r.method == "server-side-copy"  # with checksums: the copy was re-read and hashed
    rec = Recorder()
    r = copy_checkpoint(str(src), str(tmp_path / "l2" / "step-000000040"), progress=rec)
    assert r.method == "local-copy"
    rec.check(r.bytes)
    assert local_tree(tmp_path / "l2" / "step-000000040") == expect


def test_checksum_mismatch_fails_and_leaves_no_manifest(s3, tmp_path):
    src = make_checkpoint(tmp_path / "src", 7, checksums="xxh3_128")
    (src / "__1_0.distcp").write_bytes(b"\x00" * FILES["__1_0.distcp"])  # same size, other bytes
    bucket = s3.unique_bucket("cb-bad")
    with pytest.raises(TransferFailed, match=r"__1_0\.distcp.*xxh3_128"):
        copy_checkpoint(str(src), f"s3://{bucket}/j/step-000000007", retry=FAST_RETRY, **SMALL)
    assert s3.list_keys(bucket) == []
    dst = tmp_path / "d" / "step-000000007"
    with pytest.raises(TransferFailed, match="xxh3_128"):
        copy_checkpoint(str(src), str(dst), retry=FAST_RETRY)
    assert not (dst / "manifest.json").exists()
    assert latest_complete_checkpoint(str(tmp_path / "d")) is None


def test_incomplete_source_is_refused(s3, tmp_path):
    src = make_checkpoint(tmp_path / "src", 5)
    (src / "manifest.json").unlink()
    bucket = s3.unique_bucket("cb-inc")
    with pytest.raises(IncompleteCheckpoint, match="no manifest.json"):
        copy_checkpoint(str(src), f"s3://{bucket}/j/step-000000005")
    assert s3.list_keys(bucket) == []
    # the same on S3: upload the files without a manifest
    c = s3.client()
    for n in FILES:
        c.put_object(Bucket=bucket, Key=f"half/step-000000005/{n}", Body=(src / n).read_bytes())
    with pytest.raises(IncompleteCheckpoint):
        copy_checkpoint(
            f"s3://{bucket}/half/step-000000005", str(tmp_path / "out" / "step-000000005")
        )
    assert not (tmp_path / "out").exists()
    assert latest_complete_checkpoint(f"s3://{bucket}/half") is None
    with pytest.raises(ValueError, match="step-NNNNNNNNN"):
        copy_checkpoint(str(tmp_path / "src"), str(tmp_path / "x"))


def test_recopy_is_a_noop_and_overwrite_is_safe(s3, tmp_path):
    src = make_checkpoint(tmp_path / "src", 9)
    bucket = s3.unique_bucket("cb-re")
    dst = f"s3://{bucket}/j/step-000000009"
    first = copy_checkpoint(str(src), dst, **SMALL)
    rec = Recorder()
    again = copy_checkpoint(str(src), dst, progress=rec, **SMALL)
    assert again.method == "already-complete" and again.bytes == first.bytes
    rec.check(first.bytes)
    other = make_checkpoint(tmp_path / "other", 9, seed=7)  # same step, different bytes
    copy_checkpoint(str(other), dst, **SMALL)
    assert s3_tree(s3.client(), dst) == local_tree(other)


def test_transient_5xx_are_retried_to_identical_bytes(s3, tmp_path):
    """Layer 1 (tenacity, whole file): the first 3 object writes fail with 503 SlowDown.
    Layer 2 (botocore, one request): every 4th write fails with 500; sequential, so a
    request and its retry never both land on a multiple of 4 (deterministic)."""
    src = make_checkpoint(tmp_path / "src", 120)
    expect = local_tree(src)
    a, b = s3.unique_bucket("cb-r1"), s3.unique_bucket("cb-r2")
    with FaultyProxy(s3.endpoint_url, FaultPlan(fail_first=3, status=503)) as proxy:
        client = make_s3_client(proxy.endpoint_url, retry=FAST_RETRY)
        rec = Recorder()
        r = copy_checkpoint(
            str(src),
            f"s3://{a}/j/step-000000120",
            progress=rec,
            s3_client=client,
            retry=FAST_RETRY,
            **SMALL,
        )
        rec.check(r.bytes)
        assert proxy.plan.injected == 3 and r.retries >= 1

        proxy.plan = FaultPlan(fail_every=4, status=500)  # server-side copies (PUT/POST) too
        policy = RetryPolicy(attempts=2, wait_initial_s=0.05, wait_max_s=0.1, botocore_attempts=2)
        client2 = make_s3_client(proxy.endpoint_url, retry=policy)
        r2 = copy_checkpoint(
            f"s3://{a}/j/step-000000120",
            f"s3://{b}/j/step-000000120",
            s3_client=client2,
            retry=policy,
            workers=1,
            **{**SMALL, "max_concurrency": 1},
        )
        assert r2.method == "server-side-copy" and proxy.plan.injected >= 2
    direct = s3.client()
    assert s3_tree(direct, f"s3://{a}/j/step-000000120") == expect
    assert s3_tree(direct, f"s3://{b}/j/step-000000120") == expect
    assert direct.list_multipart_uploads(Bucket=a).get("Uploads", []) == []


def test_store_refusing_server_side_copy_falls_back_to_streaming(s3, tmp_path):
    src = make_checkpoint(tmp_path / "src", 3)
    a, b = s3.unique_bucket("cb-f1"), s3.unique_bucket("cb-f2")
    copy_checkpoint(str(src), f"s3://{a}/step-000000003", **SMALL)
    with FaultyProxy(s3.endpoint_url, FaultPlan(refuse_copy=True)) as proxy:
        client = make_s3_client(proxy.endpoint_url, retry=FAST_RETRY)
        r = copy_checkpoint(
            f"s3://{a}/step-000000003", f"s3://{b}/step-000000003", s3_client=client, **SMALL
        )
        assert proxy.plan.injected >= 1
    assert r.method == "stream (server-side copy refused)"
    assert s3_tree(s3.client(), f"s3://{b}/step-000000003") == local_tree(src)


@pytest.mark.parametrize("had_previous", [True, False])
def test_failure_halfway_leaves_no_manifest_and_previous_stays_latest(s3, tmp_path, had_previous):
    bucket = s3.unique_bucket("cb-half")
    base = f"s3://{bucket}/jobs/j9"
    if had_previous:
        copy_checkpoint(
            str(make_checkpoint(tmp_path / "old", 100)), f"{base}/step-000000100", **SMALL
        )
    src = make_checkpoint(tmp_path / "src", 120)
    # one file at a time, so the first files really land before the store goes bad
    with FaultyProxy(s3.endpoint_url, FaultPlan(fail_after=4, status=503)) as proxy:
        client = make_s3_client(proxy.endpoint_url, retry=FAST_RETRY)
        rec = Recorder()
        with pytest.raises(
            TransferFailed, match=r"failed on .* after 4 attempts: SlowDown 503"
        ) as err:
            copy_checkpoint(
                str(src),
                f"{base}/step-000000120",
                progress=rec,
                workers=1,
                s3_client=client,
                retry=FAST_RETRY,
                **SMALL,
            )
        puts_ok = [m for m, p, st in proxy.log if m in ("PUT", "POST") and st == 200]
        assert len(puts_ok) == 4 and proxy.plan.injected >= 4
    assert "step-000000120" in str(err.value)
    keys = s3.list_keys(bucket, "jobs/j9/step-000000120/")
    assert "jobs/j9/step-000000120/manifest.json" not in keys
    assert keys == []  # partial files cleaned up
    assert s3.client().list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    expected = f"{base}/step-000000100" if had_previous else None
    assert latest_complete_checkpoint(base) == expected
    dones = [d for d, _ in rec.calls]
    assert dones == sorted(dones) and (not dones or dones[-1] < sum(FILES.values()))


def test_plan_move(s3, tmp_path):
    src_root = tmp_path / "east"
    make_checkpoint(src_root, 100)
    make_checkpoint(src_root, 120)
    (src_root / "step-000000140").mkdir()  # incomplete: no manifest, must be skipped
    bucket = s3.unique_bucket("cb-us-west-2")
    dst_base = f"s3://{bucket}/jobs/j1"

    p = plan_move(str(src_root), dst_base)  # a job root: its latest complete checkpoint
    assert p.mode == "copy" and p.needs_copy
    assert p.src_uri == str(src_root / "step-000000120")
    assert p.dst_uri == p.resume_from == f"{dst_base}/step-000000120"
    res = p.execute(**SMALL)
    assert res is not None and res.method == "upload"
    assert latest_complete_checkpoint(dst_base) == p.resume_from

    d = plan_move(f"{dst_base}/step-000000120", str(tmp_path / "far"), "direct")
    assert (d.mode, d.resume_from, d.needs_copy, d.execute()) == (
        "direct",
        f"{dst_base}/step-000000120",
        False,
        None,
    )
    same = plan_move(f"{dst_base}/step-000000120", dst_base + "/")
    assert same.mode == "same-store" and same.resume_from == f"{dst_base}/step-000000120"
    with pytest.raises(ValueError, match="unknown move mode"):
        plan_move(str(src_root), dst_base, "teleport")
    with pytest.raises(IncompleteCheckpoint):
        plan_move(str(tmp_path / "nothing"), dst_base)
