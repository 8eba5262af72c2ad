"""Migration benchmark, end to end: a >=200M-parameter job moved between two regions.

Real processes, as in tests/e2e/test_migration.py: the broker (`brokerctl serve`), one
agent per region (local executor, 1 rank), the trainer ("200m" preset + AdamW, so the
checkpoint holds parameters and both Adam moments), and moto's S3 HTTP server with one
bucket per region. The job starts in region A (cheaper), A is drained, the trainer
saves its checkpoint on SIGTERM and exits, the broker places the job in region B, B's
agent copies the checkpoint from A's bucket into B's (region_agents/transfer.py) and
starts the trainer, which loads it and makes its first step.

Breakdown (from the job's Migration record, ``brokerctl migrations``):
  checkpoint   SIGTERM -> the old trainer exited (its emergency save, bytes written)
  transfer     the checkpoint copy between the two region buckets (bytes moved)
  relaunch     new ranks spawned -> first step done (interpreter, torch, model build,
               checkpoint load (shown separately, from the trainer's log), one step)
  orchestration  everything else: stop signalling, exit detection, scheduling, Launch
               round trip, staging start, spawn  (goal: under 1 s)
Also, in the same run, a raw S3 server-side copy of the very same files with boto3's
managed copy (same part size and concurrency as the mover): transfer MB/s vs raw
(goal: >= 80%).

    .venv/bin/python benchmarks/bench_migration_e2e.py      (writes benchmarks/results/migration.json)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from computebroker.v1 import common_pb2 as pb  # noqa: E402
from tests.fixtures.cluster import Cluster, free_port, wait_until  # noqa: E402

MiB = 1024 * 1024


def moto_server() -> tuple[object, dict[str, str]]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    env = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}
    return server, env


def s3_client(env: dict[str, str]):  # noqa: ANN201
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing",
                        config=Config(s3={"addressing_style": "path"}, max_pool_connections=32))


def raw_server_side_copy(client, bucket: str, prefix: str, dst_bucket: str) -> tuple[int, float]:  # noqa: ANN001
    """boto3 managed copy (CopyObject / UploadPartCopy) of every file under prefix, 4 files
    at once, with the part settings the mover uses for server-side copies."""
    from boto3.s3.transfer import TransferConfig

    from region_agents.staging import SERVER_COPY_PART  # the mover's server-side settings

    cfg = TransferConfig(multipart_threshold=SERVER_COPY_PART, multipart_chunksize=SERVER_COPY_PART,
                         max_concurrency=10)
    objs = [o for p in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for o in p.get("Contents", [])]
    total = sum(o["Size"] for o in objs)
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.perf_counter()
    with ThreadPoolExecutor(4) as ex:
        list(ex.map(lambda o: client.copy({"Bucket": bucket, "Key": o["Key"]}, dst_bucket,
                                          "raw/" + o["Key"], Config=cfg), objs))
    return total, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="200m")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "migration.json"))
    args = ap.parse_args(argv)

    server, env = moto_server()
    client = s3_client(env)
    buckets = {"us-east-2": "cb-us-east-2", "eu-west-1": "cb-eu-west-1"}
    for b in [*buckets.values(), "cb-raw"]:
        client.create_bucket(Bucket=b)
    root = Path(tempfile.mkdtemp(prefix="cb-bench-mig-"))
    cluster = Cluster(root=root, extra_env=env)
    cluster.broker_args = ["--heartbeat-interval", "1", "--set", "preempt_grace_s=600",
                           "--set", "progress_write_interval_s=0.5"]
    result: dict[str, object] = {}
    try:
        cluster.start_broker()
        cluster.start_agent("us-east-2", "--hang-timeout-s", "1800", nodes=1, gpus=1, price=1.0,
                            checkpoint_bucket="s3://cb-us-east-2")
        cluster.start_agent("eu-west-1", "--hang-timeout-s", "1800", nodes=1, gpus=1, price=3.0,
                            checkpoint_bucket="s3://cb-eu-west-1")
        with cluster.client() as bc:
            bc.set_team_quota(team="ml", guaranteed_gpus=8)
            wait_until(lambda: sum(1 for r in bc.regions() if r.connected) >= 2, timeout=60,
                       what="2 regions")
            spec = pb.JobSpec(
                name="bench-200m", team="ml", priority_class="training",
                resources=pb.Resources(nodes=1, gpus_per_node=1),
                trainer=pb.TrainerSpec(total_steps=100_000, checkpoint_every=0, global_batch_size=1,
                                       seed=1, model=args.model,
                                       options={"seq_len": "16", "micro_batch_size": "1",
                                                "log_every": "1", "dist_timeout_s": "1800"}))
            h = bc.submit(spec)
            t0 = time.time()
            wait_until(lambda: (j := h.status()).phase == pb.JOB_PHASE_RUNNING and j.progress.step >= 1,
                       timeout=600, interval=0.5, what=f"first step in us-east-2\n{cluster.logs()}")
            print(f"job {h.id} stepping in us-east-2 after {time.time() - t0:.0f}s; draining us-east-2")
            bc.drain("us-east-2", reason="benchmark")
            m = wait_until(lambda: next((x for x in bc.migrations(job_id=h.id) if x.state == "done"), None),
                           timeout=1200, interval=0.5, what=f"migration done\n{cluster.logs()}")
            job = h.status()
            h.cancel("benchmark done")
            h.wait(timeout=120)
        rank0 = root / "agents" / "eu-west-1" / "jobs" / job.id / f"attempt-{m.to_attempt}" / "rank-0.stdout"
        text = rank0.read_text() if rank0.exists() else ""
        load = re.search(r"resumed from \S+ \(.*\) in ([0-9.]+)s", text)
        params = re.findall(r"\(([0-9,]+) params\)", (root / "agents" / "us-east-2" / "jobs" / job.id
                                                      / f"attempt-{m.from_attempt}" / "rank-0.stdout").read_text())
        src_prefix = m.checkpoint_uri.removeprefix("s3://cb-us-east-2/").rstrip("/") + "/"
        raw_bytes, raw_s = raw_server_side_copy(client, "cb-us-east-2", src_prefix, "cb-raw")
        raw_mbps = raw_bytes / raw_s / 1e6
        save_s = m.exit_time - m.stop_signal_time
        relaunch_s = m.first_step_time - m.spawn_time
        result = {
            "machine": f"{os.cpu_count()} CPU cores, {platform.python_implementation()} "
                       f"{platform.python_version()}, torch CPU/gloo; S3 = moto server on loopback",
            "model": args.model, "params": int(params[0].replace(",", "")) if params else None,
            "checkpoint_bytes": m.transfer.bytes_total,
            "route": f"{m.from_region} -> {m.to_region} (cause {m.cause})",
            "checkpoint_s": round(save_s, 3),
            "transfer_s": round(m.transfer.seconds, 3),
            "transfer_MBps": round(m.transfer.mb_per_s, 1),
            "transfer_method": m.transfer.method,
            "raw_s3_server_copy_s": round(raw_s, 3),
            "raw_s3_server_copy_MBps": round(raw_mbps, 1),
            "transfer_vs_raw": round(m.transfer.mb_per_s / raw_mbps, 3),
            "relaunch_s": round(relaunch_s, 3),
            "relaunch_checkpoint_load_s": float(load.group(1)) if load else None,
            "orchestration_s": round(m.orchestration_s, 3),
            "total_s": round(m.total_s, 3),
            "broker_record": {k: round(getattr(m, k), 3) for k in (
                "checkpoint_s", "queue_s", "transfer_s", "launch_s", "first_step_s", "total_s",
                "orchestration_s")},
            "orchestration_parts_s": {
                "stop_request_to_sigterm": round(m.stop_signal_time - m.started_time, 3),
                "exit_to_broker_saw_it": round(m.checkpointed_time - m.exit_time, 3),
                "broker_queue_and_place": round(m.queue_s, 3),
                "launch_sent_to_transfer_start": round(m.transfer.start_time - m.launched_time, 3),
                "transfer_setup": round(m.transfer.end_time - m.transfer.start_time - m.transfer.seconds, 3),
                "transfer_end_to_spawn": round(m.spawn_time - m.transfer.end_time, 3),
            },
            "goals": {"orchestration_under_1s": m.orchestration_s < 1.0,
                      "transfer_at_least_80pct_of_raw": m.transfer.mb_per_s >= 0.8 * raw_mbps},
        }
    finally:
        cluster.stop()
        server.stop()  # type: ignore[attr-defined]
    print(json.dumps(result, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
