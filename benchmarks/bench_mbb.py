"""Make-before-break migration downtime vs the physical floor (issue 16 part 1).

Cluster mode (the default, the product path): a real broker (`make_before_break=true`),
three region agents (local executor), real trainer ranks (`python -m trainer`, gloo) and
moto's S3 HTTP server with one bucket per region. One job is moved twice:

1. a PLANNED move: us-east-2 is drained once the job's periodic checkpoint is durable.
   The broker holds the source's Stop (broker/jobs/precopy.py) while the destination's
   agent pre-copies that checkpoint into its region and its standby starts and parks;
   then the source gets its Stop, saves its final checkpoint and exits (the fence), the
   standby gets its Go and loads straight from us-east-2's bucket;
2. an EMERGENCY move: a 2-minute spot notice on the destination's nodes, once its own
   periodic checkpoint is durable. No hold: the next standby starts while the source
   saves. Reported: is the final checkpoint durable before the notice's deadline, by how
   much (the trainer takes its grace from the Stop: CB_STOP_DEADLINE_FILE).

DOWNTIME = end of the source's last step -> start of the destination's first step (the
per-step records), split into consecutive phases that add up to it (last step -> final
checkpoint durable -> source exit -> Go -> training resumed). FLOOR = raw write + raw
read of the very same bytes (the planned move's final checkpoint files) in the same run,
to the same store, with the same concurrency (one stream per file, all files at once;
S3 parts of 16 MiB, 8 in flight per file, like the trainer's writer), bytes read and
dropped (no placement): the least any save + load of them can take. It is measured after
the moves, with the broker, agents and trainers stopped and moto still up, so nothing
competes with it. The background durability copies are waited for (bounded, never fatal).

    .venv/bin/python benchmarks/bench_mbb.py --model 200m      (writes benchmarks/results/mbb.json)
    .venv/bin/python benchmarks/bench_mbb.py --model tiny --every 10 --step-sleep-s 0.5 --out /tmp/x.json

Direct mode (`--mode direct`): the handoff driven from this script, no broker.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from broker.jobs.handoff import GoAction, SourceEnd, decide  # noqa: E402
from tests.trainer.launch import free_port, launch, read_log  # noqa: E402
from trainer.standby import Go, write_go  # noqa: E402
from trainer.standby import GoAction as TrainerGo  # noqa: E402

MiB = 1024 * 1024
SPOT_NOTICE_S = 120.0


def moto() -> tuple[Any, dict[str, str]]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "bench",
           "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_REGION": "us-east-1"}
    return server, env


def client(env: dict[str, str]) -> Any:
    from region_agents.transfer import make_s3_client

    return make_s3_client(env["AWS_ENDPOINT_URL"], max_pool=64)


def wait(pred: Any, what: str, timeout: float, out: Any) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    raise SystemExit(f"timed out waiting for {what}\n{out()}")


def floor(s3: Any, bucket: str, files: dict[str, int]) -> dict[str, float]:
    """Raw write + raw read of `files` (name -> size) under raw/, one stream per file.

    Its own client with a long read timeout: moto assembles a 1.5 GB multipart object for
    minutes on a loaded machine, and a timed-out CompleteMultipartUpload that boto3 retries
    finds its upload gone (the trainer's uploader recovers from that; boto3 does not)."""
    import boto3
    from boto3.s3.transfer import TransferConfig
    from botocore.config import Config

    s3 = boto3.client("s3", endpoint_url=s3.meta.endpoint_url, region_name="us-east-1",
                      config=Config(s3={"addressing_style": "path"}, read_timeout=900,
                                    max_pool_connections=64, retries={"max_attempts": 1}))

    cfg = TransferConfig(multipart_threshold=16 * MiB, multipart_chunksize=16 * MiB,
                         max_concurrency=8, use_threads=True)
    biggest = max(files.values())
    src = memoryview(bytearray(os.urandom(MiB)) * (biggest // MiB + 1))

    class Reader:  # file-like over the shared random buffer, no copy per file
        def __init__(self, n: int) -> None:
            self.n, self.pos = n, 0

        def read(self, k: int = -1) -> bytes:
            k = self.n - self.pos if k < 0 else min(k, self.n - self.pos)
            b = bytes(src[self.pos:self.pos + k])
            self.pos += k
            return b

        def seek(self, off: int, whence: int = 0) -> int:
            self.pos = off if whence == 0 else (self.pos + off if whence == 1 else self.n + off)
            return self.pos

        def tell(self) -> int:
            return self.pos

        def close(self) -> None:
            pass

    def put(item: tuple[str, int]) -> None:
        s3.upload_fileobj(Reader(item[1]), bucket, f"raw/{item[0]}", Config=cfg)

    def get(item: tuple[str, int]) -> None:
        body = s3.get_object(Bucket=bucket, Key=f"raw/{item[0]}")["Body"]
        for _ in body.iter_chunks(8 * MiB):  # streamed, bytes dropped (no placement)
            pass

    with ThreadPoolExecutor(len(files)) as ex:
        t0 = time.perf_counter()
        list(ex.map(put, files.items()))
        t1 = time.perf_counter()
        list(ex.map(get, files.items()))
        t2 = time.perf_counter()
    keys = [{"Key": f"raw/{n}"} for n in files]
    s3.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
    return {"raw_write_s": t1 - t0, "raw_read_s": t2 - t1, "floor_s": t2 - t0}


def direct(args: argparse.Namespace) -> dict[str, Any]:
    """The handoff driven from here (no broker): the protocol's bare timings."""

    server, env = moto()
    os.environ.update(env)  # this process's clients (mover, raw floor) use the same store
    s3 = client(env)
    a_bucket, b_bucket = "cb-us-east-2", "cb-eu-west-1"
    for b in (a_bucket, b_bucket):
        s3.create_bucket(Bucket=b)
    work = Path(tempfile.mkdtemp(prefix="cb-bench-mbb-"))
    log, go = work / "steps.jsonl", work / "go.json"
    spec = {"total_steps": 100_000, "checkpoint_every": 0, "global_batch_size": 2, "seed": 1,
            "model": args.model,
            "options": {"seq_len": "16", "micro_batch_size": "1", "log_every": "1",
                        "dist_timeout_s": "1800", "sample_log": str(log), "heartbeat_s": "0.5",
                        "storage_threads": str(args.storage_threads)}}
    src_root, dst_root = f"s3://{a_bucket}/jobs/j-bench/attempt-1", f"s3://{b_bucket}/jobs/j-bench/attempt-2"
    src = dst = None
    result: dict[str, Any] = {}
    try:
        t_start = time.time()
        src = launch(work / "src", args.src_ranks, spec, src_root, env=env, attempt=1,
                     job_id="j-bench", grace_s=SPOT_NOTICE_S)
        outs = lambda: (src.output() if src else "") + (dst.output() if dst else "")  # noqa: E731
        wait(lambda: log.exists() and read_log(log), "the source's first step", 3600, outs)
        print(f"source stepping after {time.time() - t_start:.0f}s; move decided")
        # 1. the move: stop the source (final checkpoint) and start the standby at once
        t_decide = time.time()
        src.signal(signal.SIGTERM)
        dst = launch(work / "dst", args.dst_ranks, spec, dst_root,
                     env={**env, "CB_STANDBY_GO_FILE": str(go)}, attempt=2, job_id="j-bench",
                     grace_s=SPOT_NOTICE_S)
        ready: dict[str, float] = {}

        def watch_standby() -> None:
            while "t" not in ready and dst is not None:
                p = dst.progress() or {}
                if p.get("state") == "standby":
                    ready["t"] = time.time()
                    return
                time.sleep(0.02)

        threading.Thread(target=watch_standby, daemon=True).start()
        # 2. the fence: every source rank exited (75 = final checkpoint durable)
        codes = src.wait(3600)
        t_exit = time.time()
        final = src.progress() or {}
        end = SourceEnd.CHECKPOINTED if set(codes) == {75} else SourceEnd.FAILED
        # 3. the go (never before the fence)
        h = decide(end, final_uri=final.get("last_checkpoint_uri", "") if end is SourceEnd.CHECKPOINTED
                   else "", durable_uri=final.get("last_checkpoint_uri") or "")
        assert h.action is GoAction.GO, h
        write_go(go, Go(TrainerGo.GO, h.resume_from, h.reason))
        t_go = time.time()
        print(f"source exited {codes} {t_exit - t_decide:.1f}s after the stop; go: {h.resume_from}")
        # 4. the destination's first step
        recs = wait(lambda: [r for r in read_log(log) if r["attempt"] == 2], "the destination's first step",
                    3600, outs)
        t_first_end = recs[0]["time"]
        # background durability copy into region B (off the critical path)
        from region_agents.transfer import copy_checkpoint

        t_copy = time.time()
        copied = copy_checkpoint(h.resume_from, f"s3://{b_bucket}/jobs/j-bench/resume/", s3_client=s3)
        copy_s = time.time() - t_copy
        dst.kill()
        src_recs = [r for r in read_log(log) if r["attempt"] == 1]
        last_src, first_dst = src_recs[-1], recs[0]
        assert last_src["step"] == final.get("last_checkpoint_step"), (last_src, final)
        assert first_dst["step"] == last_src["step"] + 1
        load = re.search(r"resumed from \S+ \(.*\) in ([0-9.]+)s", dst.output(0))
        durable = re.search(r"checkpoint durable in ([0-9.]+)s \(([0-9.]+)s after SIGTERM", src.output(0))
        params = re.search(r"\(([0-9,]+) params\)", src.output(0))
        # the same bytes, raw, same store, same run
        parent, _, name = h.resume_from.rstrip("/").rpartition("/")
        prefix = parent.removeprefix(f"s3://{a_bucket}/") + f"/{name}/"
        objs = s3.list_objects_v2(Bucket=a_bucket, Prefix=prefix).get("Contents", [])
        files = {o["Key"].removeprefix(prefix): o["Size"] for o in objs}
        nbytes = sum(files.values())
        fl = floor(s3, a_bucket, {k: v for k, v in files.items() if k != "manifest.json"})
        downtime = first_dst["start"] - last_src["time"]
        save_s = float(durable.group(1)) if durable else None
        phases = {
            "last_step_to_exit_s": t_exit - last_src["time"],
            "final_save_s": save_s,
            "exit_to_go_s": t_go - t_exit,
            "go_to_first_step_start_s": first_dst["start"] - t_go,
            "load_s": float(load.group(1)) if load else None,
        }
        result = {
            "benchmark": "make-before-break migration downtime vs the raw floor (moto S3 on loopback)",
            "machine": f"{os.cpu_count()} CPU cores, {platform.python_implementation()} "
                       f"{platform.python_version()}, torch CPU/gloo, load {os.getloadavg()[0]:.1f}",
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "model": args.model, "params": int(params.group(1).replace(",", "")) if params else None,
            "ranks": f"{args.src_ranks} -> {args.dst_ranks}",
            "checkpoint_bytes": nbytes, "checkpoint_files": len(files),
            "downtime_s": round(downtime, 3),
            "floor": {k: round(v, 3) for k, v in fl.items()},
            "downtime_vs_floor": round(downtime / fl["floor_s"], 3),
            "goal": "downtime <= 1.3 x floor",
            "goal_met": downtime <= 1.3 * fl["floor_s"],
            "phases_s": {k: (round(v, 3) if v is not None else None) for k, v in phases.items()},
            "standby_ready_after_decision_s": round(ready["t"] - t_decide, 3) if "t" in ready else None,
            "standby_ready_before_go": "t" in ready and ready["t"] <= t_go,
            "first_step_compute_s": round(first_dst["time"] - first_dst["start"], 3),
            "source_step_s": round(last_src["time"] - last_src["start"], 3),
            "downtime_to_first_step_end_s": round(t_first_end - last_src["time"], 3),
            "background_copy": {"seconds": round(copy_s, 3), "method": copied.method,
                                "bytes": copied.bytes},
            "spot_notice": {
                "stop_request_to_durable_s": float(durable.group(2)) if durable else None,
                "stop_request_to_exit_s": round(t_exit - t_decide, 3),
                "deadline_s": SPOT_NOTICE_S,
                "met": (t_exit - t_decide) < SPOT_NOTICE_S,
            },
            "baseline_break_before_make_s": "117.2 (benchmarks/results/migration.json: stop request "
                                            "-> first step, copy-then-load, same model)",
        }
    finally:
        for r in (src, dst):
            if r is not None:
                r.kill()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return result


def checkpoint_files(s3: Any, uri: str) -> tuple[str, str, dict[str, int]]:
    """(bucket, prefix, name -> size) of the checkpoint at ``uri`` (s3://bucket/.../step-N)."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    prefix = key.rstrip("/") + "/"
    objs = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return bucket, prefix, {o["Key"].removeprefix(prefix): o["Size"] for o in objs}


def cluster(args: argparse.Namespace) -> dict[str, Any]:
    """The product path: broker (make_before_break=true) + one agent per region, two moves
    of one job: a planned one (region drain: its Stop is held for the pre-copy and until
    the standby is parked) and an emergency one (a 2-minute spot notice: no wait, the
    standby starts while the source saves). The floor is measured last, in the same run,
    on the same store, with every trainer and agent stopped (nothing else competes)."""
    from computebroker.v1 import common_pb2 as pb
    from tests.fixtures.cluster import Cluster, wait_until
    from tests.fixtures.pki import install

    install()  # a dev CA and an operator token for this process's clients (as the tests do)
    t_run = time.time()
    load_start = os.getloadavg()
    server, env = moto()
    os.environ.update(env)
    s3 = client(env)
    regions = {  # the job starts in us-east-2 (the only region at first); both others are
        # spot: the first move lands in one of them, the spot notice moves it to the other
        "us-east-2": dict(price=1.0, capacity_type="spot", nodes=args.src_ranks),
        "eu-west-1": dict(price=2.0, capacity_type="spot", nodes=args.dst_ranks),
        "ap-northeast-1": dict(price=3.0, capacity_type="spot", nodes=args.src_ranks),
    }
    buckets = {r: f"cb-{r}" for r in regions}
    for b in buckets.values():
        s3.create_bucket(Bucket=b)
    root = Path(tempfile.mkdtemp(prefix="cb-bench-mbb-"))
    log = root / "steps.jsonl"
    c = Cluster(root=root, extra_env=env)
    c.broker_args = ["--heartbeat-interval", "1", "--set", "make_before_break=true",
                     "--set", "progress_write_interval_s=0.5", "--set", "preempt_grace_s=600",
                     "--set", "precopy_wait_s=300"]
    result: dict[str, Any] = {}
    floor_files: tuple[str, dict[str, int]] | None = None

    def say(msg: str) -> None:
        print(f"[{time.time() - t_run:6.0f}s] {msg}", flush=True)

    try:
        c.start_broker()

        def agent(region: str) -> None:
            r = regions[region]
            c.start_agent(region, "--hang-timeout-s", "1800", nodes=r["nodes"], gpus=1, price=r["price"],
                          capacity_type=r["capacity_type"], checkpoint_bucket=f"s3://{buckets[region]}")

        agent("us-east-2")
        with c.client() as bc:
            bc.set_team_quota(team="ml", guaranteed_gpus=64)
            wait_until(lambda: sum(1 for r in bc.regions() if r.connected) >= 1, timeout=120,
                       what="us-east-2")
            spec = pb.JobSpec(
                name="bench-mbb", team="ml", priority_class="training",
                resources=pb.Resources(nodes=args.src_ranks, gpus_per_node=1),
                trainer=pb.TrainerSpec(total_steps=100_000, checkpoint_every=args.every, global_batch_size=1,
                                       seed=1, model=args.model, step_sleep_s=args.step_sleep_s,
                                       options={"seq_len": "16", "micro_batch_size": "1",
                                                "log_every": "1", "dist_timeout_s": "1800",
                                                "sample_log": str(log), "keep_last": "2",
                                                "storage_threads": str(args.storage_threads)}))
            spec.elasticity.min_nodes, spec.elasticity.max_nodes = 1, max(args.src_ranks, args.dst_ranks)
            spec.capacity_types.extend([pb.CAPACITY_TYPE_SPOT, pb.CAPACITY_TYPE_ON_DEMAND])
            h = bc.submit(spec)
            wait_until(lambda: h.status().phase == pb.JOB_PHASE_RUNNING, timeout=3600, interval=0.5,
                       what=f"running in us-east-2\n{c.logs()}")
            for region in ("eu-west-1", "ap-northeast-1"):  # the destinations come up now
                agent(region)
            wait_until(lambda: sum(1 for r in bc.regions() if r.connected) >= 3, timeout=120,
                       what="3 regions")
            say(f"job {h.id} runs in us-east-2; waiting for its first periodic checkpoint (step {args.every})")
            wait_until(lambda: (j := h.status()).phase == pb.JOB_PHASE_RUNNING
                       and j.progress.last_checkpoint_step >= args.every and j, timeout=3600, interval=0.5,
                       what=f"a periodic checkpoint in us-east-2\n{c.logs()}")
            # 1. a planned move: drain the source region (pre-copy, standby parked, then Stop)
            say("periodic checkpoint durable: draining us-east-2 (planned move)")
            bc.drain("us-east-2", reason="benchmark")
            m1 = wait_move(bc, h.id, 1, wait_until, c, say)
            bg1 = background_copy(root, m1, args.bg_wait_s, say)
            # 2. an emergency move: a 2-minute spot notice on the destination's nodes, once
            # its own periodic checkpoint is durable (no save in flight when the notice comes)
            nxt = (m1.checkpoint_step // args.every + 1) * args.every
            say(f"waiting for the destination's periodic checkpoint of step {nxt}")
            job = wait_until(lambda: (j := h.status()).progress.last_checkpoint_step >= nxt and j,
                             timeout=3600, interval=0.5, what=f"step {nxt} durable\n{c.logs()}")
            notices = root / "agents" / m1.to_region / "spot-notices"
            notices.mkdir(parents=True, exist_ok=True)
            t_notice = time.time()
            for a in job.placement.nodes:
                (notices / a.node_id).write_text(str(int(SPOT_NOTICE_S)))
            say(f"spot notice (120 s) on {m1.to_region}")
            m2 = wait_move(bc, h.id, 2, wait_until, c, say)
            bg2 = background_copy(root, m2, args.bg_wait_s, say)
            h.cancel("benchmark done")
            with contextlib.suppress(Exception):
                h.wait(timeout=300)
        recs = read_log(log)
        planned = move_figures(root, recs, m1, bg1)
        spot = move_figures(root, recs, m2, bg2)
        spot["spot_notice"] = spot_figures(root, m2, t_notice)
        bucket, _, files = checkpoint_files(s3, m1.resume_from)
        floor_files = (bucket, {k: v for k, v in files.items() if k != "manifest.json"})
        src_out = attempt_out(root, m1.from_region, m1.job_id, m1.from_attempt)
        params = re.search(r"\(([0-9,]+) params\)", src_out)
        result = {
            "benchmark": "make-before-break migration downtime vs the raw floor: broker + agents "
                         "(make_before_break=true), a planned move (drain, with pre-copy) and a spot "
                         "notice, moto S3 on loopback",
            "mode": "cluster",
            "model": args.model, "params": int(params.group(1).replace(",", "")) if params else None,
            "ranks": f"{m1.from_world_size} -> {m1.to_world_size} -> {m2.to_world_size}",
            "checkpoint_bytes": sum(files.values()), "checkpoint_files": len(files),
            "goal": "downtime <= 1.3 x floor",
            "moves": {"planned": planned, "spot": spot},
        }
    finally:
        c.stop()
        try:
            if floor_files is not None:  # nothing else runs now: trainers and agents are gone
                say("measuring the floor (raw write + raw read of the same files, same store)")
                result["floor"] = {k: round(v, 3) for k, v in floor(s3, *floor_files).items()}
        finally:
            server.stop()
            if os.environ.get("CB_BENCH_KEEP"):
                print(f"kept {root}")
            else:
                shutil.rmtree(root, ignore_errors=True)
    fl = result["floor"]["floor_s"]
    for mv in result["moves"].values():
        mv["downtime_vs_floor"] = round(mv["downtime_s"] / fl, 3)
        mv["goal_met"] = mv["downtime_s"] <= 1.3 * fl
    result["downtime_s"] = result["moves"]["planned"]["downtime_s"]
    result["downtime_vs_floor"] = result["moves"]["planned"]["downtime_vs_floor"]
    load_end = os.getloadavg()
    result["machine"] = (f"{os.cpu_count()} CPU cores, {platform.python_implementation()} "
                         f"{platform.python_version()}, torch CPU/gloo, OMP_NUM_THREADS=1 per rank")
    result["load_average"] = {"start_1_5_15": [round(x, 2) for x in load_start],
                              "end_1_5_15": [round(x, 2) for x in load_end]}
    result["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result["run_s"] = round(time.time() - t_run, 1)
    return result


def wait_move(bc: Any, job_id: str, n: int, wait_until: Any, c: Any, say: Any) -> Any:
    """The job's n-th Migration record once it is done (the destination stepped)."""
    m = wait_until(lambda: (ms := [x for x in bc.migrations(job_id=job_id)]) and len(ms) >= n
                   and (x := sorted(ms, key=lambda x: x.seq)[n - 1]).state == "done" and x,
                   timeout=3600, interval=0.5, what=f"move {n} done\n{c.logs()}")
    if not m.resume_from:
        raise SystemExit(f"move {n}: the source's final checkpoint was not durable (the standby "
                         f"started from scratch)\n{c.logs()}")
    say(f"move {n} done: {m.from_region} -> {m.to_region}, downtime {m.downtime_s:.1f}s")
    return m


def attempt_out(root: Path, region: str, job_id: str, attempt: int) -> str:
    return (root / "agents" / region / "jobs" / job_id / f"attempt-{attempt}" / "rank-0.stdout").read_text()


def background_copy(root: Path, m: Any, wait_s: float, say: Any) -> dict[str, Any] | None:
    """The destination agent's durability copy of the final checkpoint (off the critical
    path): waited for at most ``wait_s`` (None when not finished by then; never fatal)."""
    pat = re.compile(rf"attempt {m.to_attempt}: background durability copy \S+ -> \S+: "
                     r"([0-9.]+) MB in ([0-9.]+)s \((.+?)\)")
    path = root / "logs" / f"agent-{m.to_region}.log"
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        hit = pat.search(path.read_text()) if path.exists() else None
        if hit:
            say(f"background durability copy done: {hit.group(1)} MB in {hit.group(2)}s")
            return {"mb": float(hit.group(1)), "seconds": float(hit.group(2)), "method": hit.group(3)}
        time.sleep(0.5)
    say(f"background durability copy not finished after {wait_s:.0f}s (not waited for longer)")
    return None


def move_figures(root: Path, recs: list[dict[str, Any]], m: Any, bg: dict[str, Any] | None) -> dict[str, Any]:
    """Downtime and its consecutive phases (they add up to it; trainer and agent clocks of one
    machine) from the per-step log, the Migration record and the ranks' own lines."""
    src_out = attempt_out(root, m.from_region, m.job_id, m.from_attempt)
    dst_out = attempt_out(root, m.to_region, m.job_id, m.to_attempt)
    last_src = [r for r in recs if r["attempt"] == m.from_attempt][-1]
    first_dst = next(r for r in recs if r["attempt"] == m.to_attempt)
    durable = re.search(r"checkpoint durable in ([0-9.]+)s \(([0-9.]+)s after SIGTERM, grace ([0-9.]+)s"
                        r" from ([^)]+)\)", src_out)
    load = re.search(r"resumed from \S+ \(.*\) in ([0-9.]+)s", dst_out)
    located = re.search(r"resume: located in ([0-9.]+)s, loaded and agreed in ([0-9.]+)s", dst_out)
    ready = re.search(r"standby: ready in ([0-9.]+)s", dst_out)
    parked = re.search(r"standby: go after ([0-9.]+)s", dst_out)
    t_durable = m.stop_signal_time + float(durable.group(2)) if durable else None
    downtime = first_dst["start"] - last_src["time"]
    phases = {
        "last_step_to_checkpoint_durable_s": (t_durable - last_src["time"]) if t_durable else None,
        "durable_to_source_exit_s": (m.exit_time - t_durable) if t_durable else None,
        "source_exit_to_go_s": m.go_time - m.exit_time,
        "go_to_training_resumed_s": first_dst["start"] - m.go_time,
    }
    pc = m.precopy
    return {
        "route": f"{m.from_region} -> {m.to_region} (cause {m.cause})",
        "downtime_s": round(downtime, 3),
        "downtime_s_broker_record": round(m.downtime_s, 3),
        "phases_s": {k: (round(v, 3) if v is not None else None) for k, v in phases.items()},
        "inside_phases_s": {
            "final_save_s (trainer: save call -> durable)": float(durable.group(1)) if durable else None,
            "load_s (trainer: straight from the source bucket)": float(load.group(1)) if load else None,
            "resume_locate_s (trainer: list the source's checkpoints)":
                float(located.group(1)) if located else None,
            "resume_after_go_s (trainer: locate + load + agree)":
                round(float(located.group(1)) + float(located.group(2)), 3) if located else None,
        },
        "standby": {
            "launched_after_move_decided_s": round(m.standby_launched_time - m.started_time, 3),
            "prepare_load_s (optimizer state, load plan)": float(ready.group(1)) if ready else None,
            "parked_waiting_for_go_s": float(parked.group(1)) if parked else None,
        },
        "precopy": ({"from": m.precopy_from, "to": m.precopy_uri, "mb": round(pc.bytes_done / 1e6, 1),
                     "seconds": round(pc.seconds, 3), "method": pc.method, "error": pc.error,
                     "stop_held_s (move decided -> Stop sent)": round(m.stop_sent_time - m.started_time, 3)}
                    if m.precopy_from else None),
        "sigterm_to_durable_s": float(durable.group(2)) if durable else None,
        "trainer_grace": f"{durable.group(3)} s from {durable.group(4)}" if durable else None,
        "first_step_compute_s": round(first_dst["time"] - first_dst["start"], 3),
        "source_step_s": round(last_src["time"] - last_src["start"], 3),
        "background_durability_copy": bg,
    }


def spot_figures(root: Path, m: Any, t_notice: float) -> dict[str, Any]:
    """Was the final checkpoint durable before the notice's deadline, and by how much."""
    src_out = attempt_out(root, m.from_region, m.job_id, m.from_attempt)
    durable = re.search(r"checkpoint durable in ([0-9.]+)s \(([0-9.]+)s after SIGTERM", src_out)
    t_durable = m.stop_signal_time + float(durable.group(2)) if durable else None
    deadline = t_notice + SPOT_NOTICE_S
    return {
        "notice_s": SPOT_NOTICE_S,
        "notice_to_sigterm_s": round(m.stop_signal_time - t_notice, 3),
        "notice_to_durable_s": round(t_durable - t_notice, 3) if t_durable else None,
        "notice_to_source_exit_s": round(m.exit_time - t_notice, 3),
        "margin_s (deadline - durable)": round(deadline - t_durable, 3) if t_durable else None,
        "met": bool(t_durable and t_durable < deadline),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("cluster", "direct"), default="cluster",
                    help="cluster: broker + agents (default); direct: the handoff driven from here")
    ap.add_argument("--model", default="200m")
    ap.add_argument("--src-ranks", type=int, default=1)
    ap.add_argument("--dst-ranks", type=int, default=1)
    ap.add_argument("--storage-threads", type=int, default=2)
    ap.add_argument("--every", type=int, default=16,
                    help="cluster mode: periodic checkpoint every N steps (the pre-copy's source)")
    ap.add_argument("--step-sleep-s", type=float, default=0.0,
                    help="dev runs with a small model: make its steps this much longer")
    ap.add_argument("--bg-wait-s", type=float, default=300,
                    help="cluster mode: how long to wait for a background durability copy")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "mbb.json"))
    args = ap.parse_args(argv)
    result = cluster(args) if args.mode == "cluster" else direct(args)
    print(json.dumps(result, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    fl = result["floor"]["floor_s"]
    for name, mv in result.get("moves", {"direct": result}).items():
        print(f"{name}: downtime {mv['downtime_s']:.1f}s vs floor {fl:.1f}s = "
              f"{mv['downtime_s'] / fl:.2f}x (goal <= 1.3x)")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
