"""Checkpoint benchmark for the trainer's >=200M-parameter model ("200m" preset + AdamW).

Measures, in one run, on this machine (gloo on CPU, real processes, moto's S3 HTTP server):
* sync DCP save and load MB/s to a local directory and to S3, against a raw copy of the
  very same bytes, run by the same rank processes, interleaved with ours (ours then raw
  in even reps, raw then ours in odd ones; best of --reps each, every sample kept in the
  JSON): saves against
  each rank copying the files it wrote (`cp`-like copy + fsync; S3: boto3's managed
  upload_file, same part size and concurrency as the trainer); loads against each rank
  reading the files its load reads (its shards, every rank's small-items file and
  `.metadata`; plain reads locally, one streamed boto3 GET per file from S3), all at once
  like the trainer, readinto buffers allocated and touched before the clock starts: the
  same bytes, the same concurrency, minus placing them and verifying digests;
* async save: time the training loop is blocked vs a sync save, reported separately for
  the first save (cold staging buffers), the steady state (median of saves 2..N) and a
  first save after the trainer's start-up warm-up of the staging buffers (its cost is
  reported too);
* checkpoint overhead on step time at a fixed interval (async vs none);
* resharding load (checkpoint written on 2 ranks, loaded on 1) vs a same-size load
  (written on 1, loaded on 1), interleaved, best of --reps, both checkpoints read once
  beforehand so both come from the page cache.
Prints the figures and ratios and writes benchmarks/results/checkpoint.json.

    .venv/bin/python benchmarks/bench_checkpoint.py [--ranks 2] [--reps 4] [--steps 4] [--every 2]
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

    def timed(fn: Any, *fn_args: Any, **fn_kwargs: Any) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        fn(*fn_args, **fn_kwargs)
        dist.barrier()
        return time.perf_counter() - t0

    local = args.workdir / f"local-{args.phase}"
    if args.phase == "A":
        import boto3
        from botocore.config import Config

        client = boto3.client("s3", config=Config(s3={"addressing_style": "path"},
                                                  max_pool_connections=32))
        m = manager(str(local))
        s3 = manager(f"s3://{BUCKET}/ckpt")
        ckpt = local / step_name(1)
        samples: dict[str, list[float]] = {k: [] for k in (
            "local_save_s", "raw_local_copy_s", "local_load_s", "raw_local_read_s",
            "s3_save_s", "raw_s3_up_s", "s3_load_s", "raw_s3_down_s")}
        def fresh(store: Any, prefix: str = "") -> None:
            """Untimed: remove what the next save or upload writes, so each writes afresh."""
            dist.barrier()
            if rank == 0:
                if prefix:
                    for o in s3_keys(client, prefix):
                        client.delete_object(Bucket=BUCKET, Key=o)
                else:
                    store.delete(step_name(1))
            dist.barrier()

        def ours_save(mgr: CheckpointManager) -> float:
            fresh(mgr.store)
            mgr.last_saved_step = -1  # save step 1 again (a load also sets it)
            return timed(lambda: mgr.save(1, ws, blocking=True))

        def raw_local_save() -> float:
            t = timed(raw_copy, ckpt, args.workdir / f"rawcopy-{rank}", files_written_by(ckpt, rank))
            shutil.rmtree(args.workdir / f"rawcopy-{rank}", ignore_errors=True)
            return t

        def raw_s3_save() -> float:
            fresh(None, "raw/")
            return timed(raw_upload, client, ckpt, files_written_by(ckpt, rank))

        def raw_load(**where: Any) -> float:
            reads = files_read_by(ckpt, rank)
            with touched_buffers(ckpt, reads) as bufs:
                return timed(raw_read, reads, bufs, **where)

        pairs = [
            ("local_save_s", lambda: ours_save(m), "raw_local_copy_s", raw_local_save),
            ("local_load_s", lambda: timed(lambda: m.load(step_name(1))),
             "raw_local_read_s", lambda: raw_load(local=str(ckpt))),
            ("s3_save_s", lambda: ours_save(s3), "raw_s3_up_s", raw_s3_save),
            ("s3_load_s", lambda: timed(lambda: s3.load(step_name(1))),
             "raw_s3_down_s", lambda: raw_load(client=client)),
        ]
        for rep in range(args.reps):
            for ours_key, ours_fn, raw_key, raw_fn in pairs:
                # ours first in even reps, raw first in odd ones: whatever the previous
                # step left behind (moto freeing memory, dirty pages) hits both alike
                both = [(ours_key, ours_fn), (raw_key, raw_fn)]
                for key, fn in both if rep % 2 == 0 else both[::-1]:
                    samples[key].append(fn())
        fresh(None, "raw/")
        if rank == 0:
            s3.store.delete(step_name(1))
        out["samples"] = samples
        out.update({k: min(v) for k, v in samples.items()})
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
    else:  # phase B, 1 rank: reshard 2->1 vs same-size 1->1, interleaved, both cache-warm
        src = manager(str(args.workdir / "local-A"))
        m = manager(str(local))
        out["local_save_s"] = timed(lambda: m.save(1, ws, blocking=True))
        for d in (args.workdir / "local-A", local):  # page cache: both read from memory
            for f in (d / step_name(1)).iterdir():
                with open(f, "rb") as fh:
                    while fh.read(16 << 20):
                        pass
        reshard, same = [], []
        for _ in range(args.reps):
            reshard.append(timed(lambda: src.load(step_name(1))))
            same.append(timed(lambda: m.load(step_name(1))))
        out["reshard_load_samples_s"], out["same_size_load_samples_s"] = reshard, same
        out["reshard_load_s"], out["same_size_load_s"] = min(reshard), min(same)
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
             "--async-saves", str(args.async_saves), "--reps", str(args.reps)], env=e))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"phase {phase} ranks failed: {codes}")
    return json.loads((args.workdir / f"phase-{phase}.json").read_text())


# ------------------------------------------------------------------ raw baselines
def files_written_by(ckpt: Path, rank: int) -> list[str]:
    """The files a rank's save wrote: its shards (+ .metadata, by the coordinator)."""
    return sorted(f.name for f in ckpt.iterdir()
                  if f.name.startswith(f"__{rank}_") or (rank == 0 and f.name == ".metadata"))


def files_read_by(ckpt: Path, rank: int) -> list[str]:
    """What a same-size DCP load on `rank` reads: its shards, every rank's small-items
    file (__k_0: deduplicated scalars may sit on any rank) and .metadata."""
    names = sorted(f.name for f in ckpt.iterdir() if f.name != "manifest.json")
    return [n for n in names
            if n.startswith(f"__{rank}_") or n.endswith("_0.distcp") or n == ".metadata"]


def raw_copy(src: Path, dst: Path, names: list[str]) -> None:
    """cp + fsync of this rank's files, one after another."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in names:
        with open(src / name, "rb") as a, open(dst / name, "wb") as b:
            shutil.copyfileobj(a, b, 16 * 1024 * 1024)
            b.flush()
            os.fsync(b.fileno())


def raw_upload(client: Any, src: Path, names: list[str]) -> None:
    """boto3's managed upload of this rank's files, all at once, 8 parts in flight each."""
    from boto3.s3.transfer import TransferConfig

    cfg = TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=16 << 20,
                         max_concurrency=8)
    with ThreadPoolExecutor(len(names)) as ex:
        list(ex.map(lambda n: client.upload_file(str(src / n), BUCKET, f"raw/{n}", Config=cfg),
                    names))


class touched_buffers:  # noqa: N801 - a context manager used like a function
    """One buffer per file, allocated and written once before the clock starts (fresh
    pages cost more than the copy on these VMs; the trainer reads into live tensors)."""

    def __init__(self, ckpt: Path, names: list[str]) -> None:
        import numpy as np

        self.bufs = {n: np.ones((ckpt / n).stat().st_size, np.uint8) for n in names}

    def __enter__(self) -> dict[str, memoryview]:
        return {n: memoryview(b).cast("B") for n, b in self.bufs.items()}

    def __exit__(self, *exc: object) -> None:
        self.bufs.clear()


def raw_read(names: list[str], bufs: dict[str, memoryview], *, local: str = "",
             client: Any = None) -> None:
    """Read this rank's files all at once (up to the trainer's READ_THREADS), each
    readinto its buffer: plain reads from `local`, or one streamed GET each from S3."""
    from trainer.shardio import READ_THREADS

    def fill(name: str) -> None:
        buf = bufs[name]
        if local:
            with open(os.path.join(local, name), "rb", buffering=0) as f:
                return _fill(f.readinto, buf, name)
        body = client.get_object(Bucket=BUCKET, Key=f"raw/{name}")["Body"]
        return _fill(body.readinto, buf, name)

    with ThreadPoolExecutor(min(READ_THREADS, len(names))) as ex:
        list(ex.map(fill, names))


def _fill(readinto: Any, buf: memoryview, name: str) -> None:
    pos = 0
    while pos < len(buf):
        n = readinto(buf[pos : pos + (8 << 20)])
        if not n:
            raise SystemExit(f"short read of {name}")
        pos += n


def s3_keys(client: Any, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for p in pages for o in p.get("Contents", [])]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--phase", default="A")
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)  # steps of ~10-30 s on 2 shared cores
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--async-saves", type=int, default=4)  # save 1 cold, 2..N steady state
    ap.add_argument("--reps", type=int, default=4)  # sync save/load vs raw, interleaved
    args = ap.parse_args()
    if args.worker:
        return worker(args)

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
        nbytes = _dir_bytes(ckpt_dir) - (ckpt_dir / "manifest.json").stat().st_size
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
            "raw_copy_fsync_MBps": mb / a["raw_local_copy_s"],
            "raw_read_MBps": mb / a["raw_local_read_s"],
            "save_vs_raw": a["raw_local_copy_s"] / a["local_save_s"],
            "load_vs_raw": a["raw_local_read_s"] / a["local_load_s"],
        },
        "s3": {
            "dcp_save_MBps": mb / a["s3_save_s"],
            "dcp_load_MBps": mb / a["s3_load_s"],
            "raw_boto3_upload_MBps": mb / a["raw_s3_up_s"],
            "raw_boto3_download_MBps": mb / a["raw_s3_down_s"],
            "save_vs_raw": a["raw_s3_up_s"] / a["s3_save_s"],
            "load_vs_raw": a["raw_s3_down_s"] / a["s3_load_s"],
        },
        "method": (
            f"best of {args.reps} interleaved runs each (ours then raw, then raw then ours, ...), "
            "all run by the "
            "same rank processes between barriers. Raw save: each rank copies the files it "
            "wrote (cp-like + fsync; S3: boto3 upload_file, 16 MiB parts, 8 in flight, its "
            "files at once). Raw load: each rank reads the files its load reads (its shards, "
            "every rank's small-items file, .metadata), all at once, into buffers touched "
            "before the clock starts (S3: one streamed GET per file). Ours also plans, "
            "places the bytes into the model and optimizer, and computes or verifies xxh3-128 "
            "digests; the S3 save also writes .metadata and the manifest and prunes."),
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
        "raw_seconds": {"phase_A": a, "phase_B": b},
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
