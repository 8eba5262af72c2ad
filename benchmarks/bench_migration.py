"""Migration benchmark, transfer part: moving a >=800 MB checkpoint between region stores.

The checkpoint is a real DCP save (torch.distributed.checkpoint, no process group) of the
trainer's "200m" preset model state (>=200M fp32 parameters, ~850 MB; model only, no
optimizer state) plus a manifest in the trainer's format. moto's S3 HTTP server on
loopback holds two "region" buckets. In one run, for each way a checkpoint moves, it
measures the raw S3 throughput of the very same bytes with boto3's managed transfers
(same part size and concurrency) and `region_agents.transfer.copy_checkpoint`:

    local -> S3   raw: upload of every file            vs  copy_checkpoint (upload)
    S3 -> S3      raw: server-side copy of every file  vs  copy_checkpoint (server-side-copy)
    S3 -> S3      raw: download + upload of every file vs  copy_checkpoint (stream)
    S3 -> local   raw: download of every file          vs  copy_checkpoint (download)

Each pair is measured `--repeat` times (default 1: ~3 min), raw and ours interleaved, best kept (the machine
is shared: best-of is the least noisy estimate of what the code can do). Prints MB/s and
ratios (goal: copy_checkpoint >= 80% of raw) and writes benchmarks/results/transfer.json.

    .venv/bin/python benchmarks/bench_migration.py [--repeat 1] [--synthetic]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RESULTS = REPO / "benchmarks" / "results" / "transfer.json"
MiB = 1024 * 1024
# moto re-reads a whole object for every ranged GET and every UploadPartCopy, so its cost
# grows with parts x object size; 32 MiB parts keep the test server from dominating both
# the raw and the copy_checkpoint figures (real S3 has no such cost).
PART = 32 * MiB
CONCURRENCY = 10
WORKERS = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_checkpoint(root: Path, synthetic: bool) -> tuple[Path, str]:
    """<root>/step-000000120 with DCP files + manifest.json (written last)."""
    from trainer.storage import LocalStore, step_name

    name = step_name(120)
    d = root / name
    if synthetic:
        d.mkdir(parents=True)
        sizes = {"__0_0.distcp": 420 * MiB, "__1_0.distcp": 420 * MiB, ".metadata": 180_000}
        for n, size in sizes.items():
            with open(d / n, "wb") as f:
                for _ in range(size // MiB):
                    f.write(os.urandom(MiB))
                f.write(os.urandom(size % MiB))
        what = "synthetic: 2 x 420 MiB shard files + metadata"
        model: dict[str, Any] = {}
    else:
        import torch
        import torch.distributed.checkpoint as dcp

        from trainer.config import MODEL_PRESETS
        from trainer.model import build_model, count_params

        cfg = MODEL_PRESETS["200m"]
        torch.manual_seed(0)
        m = build_model(cfg, 0)
        n = count_params(m)
        # 8 writer threads -> 8 shard files, as the trainer's multi-threaded writer makes
        writer = dcp.FileSystemWriter(str(d), thread_count=8)
        dcp.save({"model": m.state_dict()}, storage_writer=writer, no_dist=True)
        del m
        what = f"DCP save of the trainer's '200m' model state ({n / 1e6:.0f}M fp32 params, no optimizer)"
        model = cfg.to_dict()
    store = LocalStore(str(root))
    files = [{"name": k, "size": v} for k, v in sorted(store.list_files(name).items())]
    store.write_manifest(
        name,
        {
            "manifest_version": 1,
            "job_id": "bench",
            "attempt": 1,
            "model_preset": "200m",
            "model": model,
            "step": 120,
            "samples_seen": 960,
            "world_size": 1,
            "created": time.time(),
            "files": files,
        },
    )
    return d, what


def _best(fn: Callable[[], float], repeat: int) -> float:
    return min(fn() for _ in range(repeat))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--synthetic", action="store_true", help="random files instead of a DCP save")
    args = ap.parse_args(argv)

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    from moto.server import ThreadedMotoServer
    from s3transfer.manager import TransferConfig, TransferManager

    from region_agents.transfer import copy_checkpoint, make_s3_client

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    work = Path(tempfile.mkdtemp(prefix="bench-migration-"))
    try:
        t0 = time.perf_counter()
        src, what = build_checkpoint(work / "src", args.synthetic)
        build_s = time.perf_counter() - t0
        files = {p.name: p.stat().st_size for p in src.iterdir() if p.name != "manifest.json"}
        total = sum(files.values()) + (src / "manifest.json").stat().st_size
        print(
            f"checkpoint: {what}: {len(files)} files, {total / 1e6:.0f} MB (built in {build_s:.1f}s)"
        )

        client = make_s3_client(url, max_pool=64)
        east, west = "cb-us-east-2", "cb-us-west-2"
        for b in (east, west):
            client.create_bucket(Bucket=b)
        cfg = TransferConfig(
            multipart_threshold=PART, multipart_chunksize=PART, max_request_concurrency=CONCURRENCY
        )

        def raw(op: Callable[[TransferManager, str], Any]) -> float:
            """One boto3 TransferManager, every file submitted at once: the raw figure."""
            mgr = TransferManager(client, cfg)
            t = time.perf_counter()
            futs = [op(mgr, n) for n in files]
            for f in futs:
                f.result()
            mgr.shutdown()
            return time.perf_counter() - t

        counter = iter(range(10**6))

        def fresh(prefix: str) -> str:
            return f"{prefix}/{next(counter)}"

        def drop(bucket: str, prefix: str) -> None:
            """Free moto's memory/disk between measurements."""
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            keys = [{"Key": o["Key"]} for pg in pages for o in pg.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})

        dl_dir = work / "raw-dl"
        dl_dir.mkdir()
        # seed: the checkpoint in the east bucket (raw layout) for raw downloads/copies
        seed = "seed/step-000000120"
        raw(lambda m, n: m.upload(str(src / n), east, f"{seed}/{n}"))

        def raw_upload() -> float:
            p = fresh("raw-up")
            secs = raw(lambda m, n: m.upload(str(src / n), east, f"{p}/{n}"))
            drop(east, p)
            return secs

        def raw_copy() -> float:
            p = fresh("raw-copy")
            secs = raw(
                lambda m, n: m.copy({"Bucket": east, "Key": f"{seed}/{n}"}, west, f"{p}/{n}")
            )
            drop(west, p)
            return secs

        def raw_download() -> float:
            return raw(lambda m, n: m.download(east, f"{seed}/{n}", str(dl_dir / n)))

        def raw_down_up() -> float:
            p = fresh("raw-stream")
            tmp = work / f"spool-{p.replace('/', '-')}"
            tmp.mkdir()
            secs = raw(lambda m, n: m.download(east, f"{seed}/{n}", str(tmp / n)))
            secs += raw(lambda m, n: m.upload(str(tmp / n), west, f"{p}/{n}"))
            shutil.rmtree(tmp)
            drop(west, p)
            return secs

        kw = {
            "workers": WORKERS,
            "max_concurrency": CONCURRENCY,
            "part_size": PART,
            "multipart_threshold": PART,
            "s3_client": client,
        }
        ck_src = f"s3://{east}/jobs/bench/step-000000120"
        copy_checkpoint(str(src), ck_src, **kw)  # the S3 source for the S3->* cases
        methods: dict[str, str] = {}

        def ours(name: str, s: str, d: Callable[[], str], **extra: Any) -> Callable[[], float]:
            def run() -> float:
                dst = d()
                r = copy_checkpoint(s, dst, **kw, **extra)
                methods[name] = r.method
                if dst.startswith("s3://"):
                    drop(west, dst.removeprefix(f"s3://{west}/"))
                else:
                    shutil.rmtree(Path(dst).parent, ignore_errors=True)
                return r.seconds

            return run

        def local_dst() -> str:
            out = work / fresh("ours-dl").replace("/", "-") / "step-000000120"
            return str(out)

        cases = [
            (
                "local_to_s3",
                raw_upload,
                ours("local_to_s3", str(src), lambda: f"s3://{west}/{fresh('up')}/step-000000120"),
            ),
            (
                "s3_to_s3_server_side",
                raw_copy,
                ours(
                    "s3_to_s3_server_side",
                    ck_src,
                    lambda: f"s3://{west}/{fresh('ss')}/step-000000120",
                ),
            ),
            (
                "s3_to_s3_stream",
                raw_down_up,
                ours(
                    "s3_to_s3_stream",
                    ck_src,
                    lambda: f"s3://{west}/{fresh('st')}/step-000000120",
                    server_side=False,
                ),
            ),
            ("s3_to_local", raw_download, ours("s3_to_local", ck_src, local_dst)),
        ]
        out: dict[str, Any] = {}
        print(f"{'case':24} {'raw MB/s':>9} {'ours MB/s':>10} {'ratio':>6}  method")
        for name, raw_fn, ours_fn in cases:
            raw_s = ours_s = float("inf")
            for _ in range(args.repeat):  # interleaved, best of
                raw_s = min(raw_s, raw_fn())
                ours_s = min(ours_s, ours_fn())
            raw_mb = total / raw_s / 1e6
            ours_mb = total / ours_s / 1e6
            out[name] = {
                "raw_s": round(raw_s, 3),
                "raw_mb_per_s": round(raw_mb, 1),
                "copy_checkpoint_s": round(ours_s, 3),
                "copy_checkpoint_mb_per_s": round(ours_mb, 1),
                "ratio": round(ours_mb / raw_mb, 3),
                "method": methods[name],
            }
            print(
                f"{name:24} {raw_mb:9.1f} {ours_mb:10.1f} {ours_mb / raw_mb:6.2f}  {methods[name]}"
            )
            for p in work.glob("ours-dl-*"):
                shutil.rmtree(p, ignore_errors=True)

        result = {
            "benchmark": "checkpoint transfer between region stores (moto S3 server on loopback)",
            "checkpoint": what,
            "checkpoint_bytes": total,
            "files": len(files) + 1,
            "part_size_bytes": PART,
            "max_concurrency": CONCURRENCY,
            "workers": WORKERS,
            "repeat_best_of": args.repeat,
            "goal": "copy_checkpoint >= 0.8 x raw boto3 throughput of the same bytes",
            "cases": out,
            "min_ratio": min(c["ratio"] for c in out.values()),
            "machine": f"{platform.machine()} {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}",
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "runtime_s": round(time.perf_counter() - t0, 1),
        }
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
        print(
            f"min ratio {result['min_ratio']:.2f} (goal >= 0.80); wrote {RESULTS.relative_to(REPO)}"
        )
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)
        server.stop()


if __name__ == "__main__":
    main()
