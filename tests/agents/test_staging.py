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
