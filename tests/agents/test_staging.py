"""The agent's checkpoint staging (region_agents/staging.py) against moto's S3 HTTP server."""

from __future__ import annotations

import io
import json
from typing import Any

from boto3.s3.transfer import TransferConfig

from computebroker.v1 import agent_pb2
from region_agents.staging import Staging, plan_transfer, under


def test_plan_transfer_only_for_checkpoints_outside_this_region() -> None:
    launch = agent_pb2.Launch(job_id="j", attempt=2, checkpoint_uri="s3://cb-b/jobs/j/attempt-2",
                              resume_from="s3://cb-a/jobs/j/attempt-1/step-000000010")
    assert plan_transfer(launch, "s3://cb-b") == (launch.resume_from,
                                                  "s3://cb-b/jobs/j/attempt-2/step-000000010")
    assert plan_transfer(launch, "s3://cb-a") is None  # the attempt writes elsewhere
    launch.resume_from = "s3://cb-b/jobs/j/attempt-1/step-000000010"
    assert plan_transfer(launch, "s3://cb-b") is None  # already in this region's store
    launch.resume_from, launch.transfer_mode = "s3://cb-a/jobs/j/attempt-1/step-000000010", "direct"
    assert plan_transfer(launch, "s3://cb-b") is None
    assert under("/x/y/z", "/x/y") and not under("/x/yz", "/x/y") and not under("s3://b/x", "/b")


def test_copy_of_multipart_checkpoint_reads_back_with_checksum_validation(s3_server: Any,
                                                                          monkeypatch: Any) -> None:
    s3_server.apply_env(monkeypatch)
    src_b, dst_b = s3_server.unique_bucket("cb-a"), s3_server.unique_bucket("cb-b")
    c = s3_server.client()
    data = bytes(range(256)) * (40 * 4096)  # 40 MiB, uploaded in 8 MiB parts like the trainer's
    cfg = TransferConfig(multipart_threshold=8 * 2**20, multipart_chunksize=8 * 2**20)
    c.upload_fileobj(io.BytesIO(data), src_b, "jobs/j/attempt-1/step-000000010/__0_0.distcp", Config=cfg)
    manifest = {"step": 10, "files": [{"name": "__0_0.distcp", "size": len(data)}]}
    c.put_object(Bucket=src_b, Key="jobs/j/attempt-1/step-000000010/manifest.json",
                 Body=json.dumps(manifest).encode())
    launch = agent_pb2.Launch(job_id="j", attempt=2, checkpoint_uri=f"s3://{dst_b}/jobs/j/attempt-2",
                              resume_from=f"s3://{src_b}/jobs/j/attempt-1/step-000000010")
    st = Staging(launch, *plan_transfer(launch, f"s3://{dst_b}"))  # type: ignore[misc]
    st.start()
    assert st.finished.wait(60)
    stats = st.snapshot()
    assert stats.done and not stats.error and stats.bytes_total >= len(data)
    assert stats.method == "server-side-copy"
    got = c.get_object(Bucket=dst_b, Key="jobs/j/attempt-2/step-000000010/__0_0.distcp",
                       ChecksumMode="ENABLED")["Body"].read()
    assert got == data


def _step(put: Any, name: str, complete: bool) -> None:
    put(f"{name}/__0_0.distcp", b"x" * 64)
    if complete:
        put(f"{name}/manifest.json", b"{}")


def test_a_durability_copy_overtaken_by_a_newer_checkpoint_is_removed(tmp_path: Any) -> None:
    """The trainer prunes its directory after each commit, and a step still being copied
    looks abandoned to it: files can vanish mid-copy. Once a newer checkpoint is complete
    the copy has no purpose left, so the agent removes it (region_agents/agent.py)."""
    from pathlib import Path

    from region_agents.staging import drop_if_superseded

    root = Path(tmp_path)

    def put(key: str, data: bytes) -> None:
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(data)

    _step(put, "step-000000010", complete=True)  # the copy, finished
    _step(put, "step-000000020", complete=False)  # the trainer's next save, still writing
    assert not drop_if_superseded(str(root), "step-000000010")  # nothing newer is complete
    assert (root / "step-000000010" / "manifest.json").exists()
    _step(put, "step-000000020", complete=True)
    assert drop_if_superseded(str(root), "step-000000010")
    assert not (root / "step-000000010").exists()
    assert (root / "step-000000020" / "manifest.json").exists()  # the newer one stays
    assert not drop_if_superseded(str(root), "not-a-step")


def test_a_superseded_durability_copy_is_removed_from_s3(s3_server: Any,
                                                          monkeypatch: Any) -> None:
    from region_agents.staging import drop_if_superseded

    s3_server.apply_env(monkeypatch)
    bucket = s3_server.unique_bucket("cb-dur")
    c = s3_server.client()

    def put(key: str, data: bytes) -> None:
        c.put_object(Bucket=bucket, Key=f"jobs/j1/attempt-2/{key}", Body=data)

    _step(put, "step-000000010", complete=True)
    _step(put, "step-000000030", complete=True)
    assert drop_if_superseded(f"s3://{bucket}/jobs/j1/attempt-2", "step-000000010", c)
    keys = s3_server.list_keys(bucket)
    assert keys and all("step-000000030" in k for k in keys)
