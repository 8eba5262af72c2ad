"""Checkpoint benchmark for the trainer's >=200M-parameter model ("200m" preset + AdamW).

Measures, in one run, on this machine (gloo on CPU, real processes, moto's S3 HTTP server):
* sync DCP save and load MB/s to a local directory and to S3, against a raw copy of the
  very same bytes (python copy + fsync locally; boto3 managed transfers to S3, same
  concurrency as the trainer). The raw S3 download runs in one process per rank, each
  fetching the files that rank's DCP load reads, all of them at once (the trainer's
  READ_THREADS per rank), into preallocated buffers with readinto: the same GETs, the
  same concurrency, minus decoding and sha256 verification;
* async save: time the training loop is blocked vs a sync save, reported separately for
  the first save (cold staging buffers), the steady state (median of saves 2..N) and a
  first save after the trainer's start-up warm-up of the staging buffers (its cost is
  reported too);
* checkpoint overhead on step time at a fixed interval (async vs none);
* resharding load (checkpoint written on 2 ranks, loaded on 1) vs a same-size load
  (written on 1, loaded on 1).
Prints the figures and ratios and writes benchmarks/results/checkpoint.json.

    .venv/bin/python benchmarks/bench_checkpoint.py [--ranks 2] [--steps 6] [--every 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RESULTS = REPO / "benchmarks" / "results" / "checkpoint.json"
BUCKET = "bench-ckpt"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ------------------------------------------------------------------ worker (one rank)
def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.optim.lr_scheduler import LambdaLR

    from trainer.checkpoint import CheckpointManager
    from trainer.config import RunEnv, parse_spec
    from trainer.data import GlobalOrder, SyntheticTokens, rank_slice
    from trainer.loop import lr_lambda
    from trainer.model import build_model, count_params
    from trainer.parallel import init_distributed, shard_model, shutdown_and_exit
    from trainer.storage import open_store, step_name

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // int(os.environ["WORLD_SIZE"])))
    spec = parse_spec(
        {
            "total_steps": 1000,
            "global_batch_size": int(os.environ["WORLD_SIZE"]),
            "model": "200m",
            "options": {"seq_len": "16", "micro_batch_size": "1", "storage_threads": "2"},
        }
    )
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    env = RunEnv(rank, ws, rank, "bench", 0, str(args.workdir), "", "", 60)
    d = init_distributed(env, spec.options)
    model = build_model(spec.model_shape(), 0)
    n_params = count_params(model)
    model = shard_model(model, d, spec.options)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sched = LambdaLR(optim, lr_lambda(0, 1000))
    # one step so AdamW has its two moment buffers (they are most of the checkpoint)
    data = SyntheticTokens(0, spec.model_shape().vocab_size, spec.model_shape().seq_len)
    order = GlobalOrder(0, 10_000, ws)

    def train_step(step: int) -> float:
        t0 = time.perf_counter()
        ids = rank_slice(order.step_ids(step), rank, ws)
        tok, tgt = data.batch(ids)
        optim.zero_grad()
        model(tok, tgt).sum().backward()
        optim.step()
        sched.step()
        dist.barrier()
        return time.perf_counter() - t0

    train_step(0)
    out: dict[str, Any] = {"params": n_params, "world_size": ws}

    def manager(root: str, use_async: bool = False) -> CheckpointManager:
        return CheckpointManager(
            open_store(root, 8),
            model=model,
            optim=optim,
            sched=sched,
            ckpt_group=d.ckpt_group,
            rank=rank,
            world_size=ws,
            manifest_base={"model": spec.model_shape().to_dict()},
            keep_last=10,
            threads=spec.options.storage_threads,
            use_async=use_async,
        )

    def timed(fn: Any) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        return time.perf_counter() - t0

    local = args.workdir / f"local-{args.phase}"
    if args.phase == "A":
        m = manager(str(local))
        out["local_save_s"] = timed(lambda: m.save(1, ws, blocking=True))
        out["local_load_s"] = timed(lambda: m.load(step_name(1)))
        s3 = manager(f"s3://{BUCKET}/ckpt")
        out["s3_save_s"] = timed(lambda: s3.save(1, ws, blocking=True))
        out["s3_load_s"] = timed(lambda: s3.load(step_name(1)))
        if rank == 0:  # free the moto server's memory (it holds objects in RAM)
            s3.store.delete(step_name(1))
        m._stager.close()
        s3._stager.close()
        # async: blocked time vs the sync save above, then until durable. Save 2 is cold
        # (staging buffers allocated and faulted in on the training thread); saves 3..
        # reuse them (steady state); then a cold stager warmed up as the trainer does
        # after its first step (warm_staging, outside any save), and one more save.
        a = manager(str(args.workdir / "async"), use_async=True)
        a.keep_last = 2
        blocked, totals = [], []
        for i in range(args.async_saves):
            dist.barrier()
            t0 = time.perf_counter()
            a.save(2 + i, 2 * ws)
            blocked.append(time.perf_counter() - t0)
            a.wait()
            dist.barrier()
            totals.append(time.perf_counter() - t0)
        out["async_blocked_s"] = blocked
        out["async_total_s"] = totals
        a._stager.close()
        dist.barrier()
        out["async_warmup_s"] = a.warm_staging()
        dist.barrier()
        t0 = time.perf_counter()
        a.save(2 + args.async_saves, 2 * ws)
        out["async_blocked_after_warmup_s"] = time.perf_counter() - t0
        a.wait()
        dist.barrier()
        # step-time overhead: async checkpoint every `every` steps vs none
        plain = [train_step(10 + i) for i in range(args.steps)]
        a2 = manager(str(args.workdir / "overhead"), use_async=True)
        a2._stager = a._stager  # one staging cache per rank, as in the trainer
        with_ckpt = []
        for i in range(args.steps):
            t = train_step(100 + i)
            if (i + 1) % args.every == 0:
                t0 = time.perf_counter()
                a2.save(100 + i, 0)
                t += time.perf_counter() - t0
            with_ckpt.append(t)
        t0 = time.perf_counter()
        a2.wait()
        dist.barrier()
        out["overhead_final_wait_s"] = time.perf_counter() - t0
        out["step_s_no_ckpt"] = plain
        out["step_s_async_ckpt"] = with_ckpt
    else:  # phase B, 1 rank: reshard 2->1 vs same-size 1->1
        src = manager(str(args.workdir / "local-A"))
        out["reshard_load_s"] = timed(lambda: src.load(step_name(1)))
        m = manager(str(local))
        out["local_save_s"] = timed(lambda: m.save(1, ws, blocking=True))
        out["same_size_load_s"] = timed(lambda: m.load(step_name(1)))
    if rank == 0:
        (args.workdir / f"phase-{args.phase}.json").write_text(json.dumps(out))
    shutdown_and_exit(0)


def run_ranks(args: argparse.Namespace, phase: str, ranks: int, env: dict[str, str]) -> dict:
    port = _free_port()
    procs = []
    for r in range(ranks):
        e = {**os.environ, **env, "RANK": str(r), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(r),
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PYTHONPATH": str(REPO)}
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--worker", "--phase", phase, "--workdir", str(args.workdir),
             "--steps", str(args.steps), "--every", str(args.every),
             "--async-saves", str(args.async_saves)], env=e))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"phase {phase} ranks failed: {codes}")
    return json.loads((args.workdir / f"phase-{phase}.json").read_text())


# ------------------------------------------------------------------ raw baselines
def raw_local_copy(src: Path, dst: Path) -> float:
    dst.mkdir(parents=True)
    t0 = time.perf_counter()
    for f in src.iterdir():
        with open(f, "rb") as a, open(dst / f.name, "wb") as b:
            shutil.copyfileobj(a, b, 16 * 1024 * 1024)
            b.flush()
            os.fsync(b.fileno())
    return time.perf_counter() - t0


def raw_s3_up(src: Path, client: Any, parallel: int) -> float:
    from boto3.s3.transfer import TransferConfig

    cfg = TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=16 << 20,
                         max_concurrency=8)
    files = [f for f in src.iterdir() if f.is_file()]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(parallel) as ex:
        list(ex.map(lambda f: client.upload_file(str(f), BUCKET, f"raw/{f.name}", Config=cfg),
                    files))
    return time.perf_counter() - t0


def raw_get_worker(args: argparse.Namespace) -> None:
    """One rank's raw download: its files all at once, one streamed GET each, readinto a
    preallocated buffer (exactly the trainer reader's GETs, without decode/verify)."""
    import boto3
    from botocore.config import Config

    from trainer.storage import READ_THREADS

    names = args.files.split(",")
    client = boto3.client("s3", config=Config(s3={"addressing_style": "path"},
                                              max_pool_connections=32))

    def get(name: str) -> int:
        resp = client.get_object(Bucket=BUCKET, Key=f"raw/{name}")
        buf = memoryview(bytearray(int(resp["ContentLength"])))
        pos = 0
        while pos < len(buf):
            n = resp["Body"].readinto(buf[pos : pos + (8 << 20)])
            if not n:
                raise SystemExit(f"short read of {name}")
            pos += n
        return pos

    time.sleep(max(0.0, args.start_at - time.time()))
    with ThreadPoolExecutor(min(READ_THREADS, len(names))) as ex:
        total = sum(ex.map(get, names))
    print(json.dumps({"end": time.time(), "bytes": total}), flush=True)


def raw_s3_down(src: Path, ranks: int, env: dict[str, str]) -> float:
    """Per rank r: __r_*.distcp (+ .metadata on rank 0), as a same-size DCP load reads."""
    names = sorted(f.name for f in src.iterdir() if f.is_file())
    start_at = time.time() + 3.0  # after every process has imported boto3
    procs = []
    for r in range(ranks):
        mine = [n for n in names if n.startswith(f"__{r}_")] + (
            [n for n in names if n == ".metadata"] if r == 0 else [])
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--raw-get", "--files", ",".join(mine),
             "--start-at", str(start_at)],
            env={**os.environ, **env, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE))
    ends = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode:
            raise SystemExit(f"raw GET worker failed: {p.returncode}")
        ends.append(json.loads(out.decode().strip().splitlines()[-1])["end"])
    return max(ends) - start_at


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--phase", default="A")
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)  # steps of ~10-30 s on 2 shared cores
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--async-saves", type=int, default=4)  # save 1 cold, 2..N steady state
    ap.add_argument("--raw-get", action="store_true")
    ap.add_argument("--files", default="")
    ap.add_argument("--start-at", type=float, default=0.0)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.raw_get:
        return raw_get_worker(args)

    import logging

    import boto3
    from botocore.config import Config
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    t_start = time.perf_counter()
    load_start = os.getloadavg()  # the box is shared: other work skews every figure
    args.workdir = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "bench",
           "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id="bench", aws_secret_access_key="bench",
                          config=Config(s3={"addressing_style": "path"}, max_pool_connections=32))
    client.create_bucket(Bucket=BUCKET)
    try:
        a = run_ranks(args, "A", args.ranks, env)
        ckpt_dir = args.workdir / "local-A" / "step-000000001"
        nbytes = _dir_bytes(ckpt_dir)
        raw_local = raw_local_copy(ckpt_dir, args.workdir / "rawcopy")
        shutil.rmtree(args.workdir / "rawcopy")
        raw_up = raw_s3_up(ckpt_dir, client, parallel=2 * args.ranks)
        raw_down = raw_s3_down(ckpt_dir, args.ranks, env)
        b = run_ranks(args, "B", 1, env)
    finally:
        server.stop()
        shutil.rmtree(args.workdir, ignore_errors=True)

    mb = nbytes / 1e6
    blocked = a["async_blocked_s"]
    steady = sorted(blocked[1:])[len(blocked[1:]) // 2] if len(blocked) > 1 else blocked[0]
    plain = sorted(a["step_s_no_ckpt"])[len(a["step_s_no_ckpt"]) // 2]
    mean_plain = sum(a["step_s_no_ckpt"]) / len(a["step_s_no_ckpt"])
    mean_ckpt = sum(a["step_s_async_ckpt"]) / len(a["step_s_async_ckpt"])
    res: dict[str, Any] = {
        "machine": f"{os.cpu_count()} CPU cores, gloo, torch CPU; S3 = moto server on loopback",
        "model": "200m preset + AdamW (params, grads not saved; 2 Adam moments saved)",
        "params": a["params"],
        "ranks": args.ranks,
        "checkpoint_bytes": nbytes,
        "local": {
            "dcp_save_MBps": mb / a["local_save_s"],
            "dcp_load_MBps": mb / a["local_load_s"],
            "raw_copy_fsync_MBps": mb / raw_local,
            "save_vs_raw": raw_local / a["local_save_s"],
        },
        "s3": {
            "dcp_save_MBps": mb / a["s3_save_s"],
            "dcp_load_MBps": mb / a["s3_load_s"],
            "raw_boto3_upload_MBps": mb / raw_up,
            "raw_boto3_download_MBps": mb / raw_down,
            "save_vs_raw": raw_up / a["s3_save_s"],
            "load_vs_raw": raw_down / a["s3_load_s"],
            "raw_download_method": (
                "one process per rank, each GETting the files its rank's DCP load reads "
                "(__r_*.distcp, + .metadata on rank 0) all at once (up to READ_THREADS per "
                "rank, like the trainer), one streamed GET per file readinto a preallocated "
                "buffer; the DCP load additionally decodes and sha256-verifies"),
        },
        "async": {
            "sync_save_s": a["local_save_s"],
            "first_save_blocked_s": blocked[0],
            "steady_blocked_s_median": steady,
            "blocked_ratio": steady / a["local_save_s"],
            "first_save_blocked_ratio": blocked[0] / a["local_save_s"],
            "startup_warmup_s": a["async_warmup_s"],
            "first_save_after_warmup_blocked_s": a["async_blocked_after_warmup_s"],
            "async_until_durable_s_median": sorted(a["async_total_s"])[len(a["async_total_s"]) // 2],
            "blocked_s_each_save": blocked,
            "method": ("blocked = wall time of save() on the training thread (get_state_dict + "
                       "memcpy into staging); save 1 allocates staging buffers, saves 2..N "
                       "reuse them (steady = median of 2..N); the trainer warms the buffers "
                       "after its first step (startup_warmup_s, outside any save)"),
        },
        "step_overhead": {
            "checkpoint_every_steps": args.every,
            "steps": args.steps,
            "median_step_s_no_ckpt": plain,
            "mean_step_s_no_ckpt": mean_plain,
            "mean_step_s_async_ckpt": mean_ckpt,
            "overhead_pct": 100 * (mean_ckpt - mean_plain) / mean_plain,
            "final_wait_s": a["overhead_final_wait_s"],
            "raw_steps_no_ckpt": a["step_s_no_ckpt"],
            "raw_steps_async_ckpt": a["step_s_async_ckpt"],
        },
        "resharding": {
            "load_2_to_1_s": b["reshard_load_s"],
            "load_1_to_1_s": b["same_size_load_s"],
            "reshard_vs_same_size": b["reshard_load_s"] / b["same_size_load_s"],
        },
        "raw_seconds": {"phase_A": a, "phase_B": b, "raw_local_copy_s": raw_local,
                        "raw_s3_up_s": raw_up, "raw_s3_down_s": raw_down},
        "runtime_s": time.perf_counter() - t_start,
        "loadavg_1_5_15_start": load_start,
        "loadavg_1_5_15_end": os.getloadavg(),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(res, indent=2))
    print(f"checkpoint: {nbytes / 1e9:.2f} GB ({a['params'] / 1e6:.0f}M params + AdamW), "
          f"{args.ranks} ranks")
    for k in ("local", "s3", "async", "step_overhead", "resharding"):
        shown = {n: (round(v, 3) if isinstance(v, float) else v) for n, v in res[k].items()
                 if not n.startswith("raw_steps")}
        print(f"{k:14s} {shown}")
    print(f"wrote {RESULTS} in {res['runtime_s']:.0f}s")


if __name__ == "__main__":
    main()
