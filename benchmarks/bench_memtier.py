"""The in-memory recovery tier (trainer/memtier.py): its cost per step and its recovery.

Real gloo ranks running the trainer library's loop on the built-in LM (FSDP2 + AdamW),
one rank per "node", each node with its own keeper process (trainer/memkeeper.py) on
loopback; S3 is moto's server on loopback. Two parts, each with its baseline in the
same run:

* **overhead**: the same ranks train in phases of --steps steps: memory tier off, and
  snapshots every K = 1, 2, 4, 8 steps (order rotated every round so drift on this
  shared machine hits all alike; durable checkpoints off in every phase). Per phase:
  process CPU time per step of rank 0 (all its threads, so the background send counts),
  the keepers' CPU, and the training thread's own CPU time (and wall time) inside
  `step_done` (where the snapshot is taken) plus the end-of-phase wait for the last send. Overheads are
  medians of per-round ratios against the same round's tier-off phase.
* **recovery** (--recovery-model, 3 nodes): one job, durable checkpoints every
  --ckpt-every steps to S3, snapshots every step; node 1 is killed (its rank and its
  keeper, SIGKILL) --kill-offset steps after a durable checkpoint, the rest of the gang
  is killed as the agent does, and the job is relaunched at once on the survivors plus
  a spare node with an empty keeper. Alternately the *memory* path (node 1 lost: its
  shard is on node 2's keeper) and the *store* path (node 1's and node 2's keepers lost,
  so rank 1's both copies are gone and every rank resumes from the durable checkpoint).
  Downtime = SIGKILL -> the relaunch's first step done; lost work = the last step done
  before the kill - the step resumed from; time to regain = SIGKILL -> a step past the
  last one done before the kill. No failure-detection delay is in either path.

Writes benchmarks/results/memtier.json.

    .venv/bin/python benchmarks/bench_memtier.py [--model small] [--ranks 2] [--rounds 6]
        [--steps 16] [--recovery-model small] [--kills 3] [--skip-recovery]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.procstats import proc_cpu_s  # noqa: E402
from tests.trainer.launch import Run, free_port, launch, read_log  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "memtier.json"
TOKEN = "bench-token"
KS = (1, 2, 4, 8)
# Besides the trainer's presets: a model between "small" (1M params, ms steps, a
# checkpoint that loads in no time) and "200m" (too large for 3 ranks plus their
# keepers in this machine's memory), so recovery compares paths with real bytes.
BENCH_MODELS = {"60m": {"vocab_size": 32000, "d_model": 512, "n_layers": 8, "n_heads": 8,
                        "d_ff": 2048, "seq_len": 128}}
BUCKET = "bench-memtier"


def med(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


# ------------------------------------------------------------------ worker (one rank)
def worker(args: argparse.Namespace) -> None:
    import torch

    import trainer as cb
    from trainer.config import MODEL_PRESETS, ModelConfig
    from trainer.data import SyntheticTokens
    from trainer.model import build_model

    run = cb.init(heartbeat_s=2.0)
    cfg = (ModelConfig(**BENCH_MODELS[args.model]) if args.model in BENCH_MODELS
           else MODEL_PRESETS[args.model])
    model = run.shard(build_model(cfg, 0), blocks=None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sampler = cb.ResumableSampler(1 << 20, global_batch=args.batch, seed=0, micro_batch=args.batch)
    ckpt = run.checkpointer(model=model, optimizer=opt, data=sampler, every=args.ckpt_every,
                            keep_last=2)
    data = SyntheticTokens(0, cfg.vocab_size, cfg.seq_len)

    def one_step() -> float:
        batch = sampler.next()
        opt.zero_grad(set_to_none=True)
        loss = torch.zeros(())
        for ids in batch.micro:
            tokens, targets = data.batch(ids)
            per_sample = model(tokens, targets)
            (per_sample.sum() * batch.scale).backward()
            loss += per_sample.detach().sum()
        opt.step()
        return run.all_sum(loss) / args.batch

    if args.mode == "train":
        log = Path(args.steps_log)
        for step in range(ckpt.resume() + 1, 10**9):
            loss = one_step()
            if run.is_main:
                with log.open("a") as fh:
                    fh.write(json.dumps({"step": step, "t": time.time(), "loss": loss,
                                         "attempt": run.attempt}) + "\n")
            run.step_done(step, loss=loss)
        return
    overhead_phases(args, run, ckpt, one_step)


def overhead_phases(args: argparse.Namespace, run: Any, ckpt: Any, one_step: Any) -> None:
    import torch

    mem = ckpt.memory
    if mem is None:
        raise SystemExit("bench worker: the memory tier is not configured")
    keeper_pids = [int(p) for p in args.keeper_pids.split(",") if p]
    step = 0
    mem.every = 1  # warm-up: optimizer state, allocator, the tier's buffers and connections
    for _ in range(2):
        loss = one_step()
        step += 1
        run.step_done(step, loss=loss)
    mem.wait()
    modes = ["off", *(f"k{k}" for k in args.ks)]
    out: dict[str, dict[str, list[float]]] = {
        m: {"wall": [], "cpu": [], "inside": [], "inside_cpu": [], "keepers_cpu": [], "taken": [],
            "skipped": []}
        for m in modes}
    for r in range(args.rounds):
        order = modes[r % len(modes):] + modes[: r % len(modes)]
        for mode in order:
            ckpt.memory = None if mode == "off" else mem
            mem.every = int(mode[1:]) if mode != "off" else 1
            taken0, skipped0 = mem.stats.taken, mem.stats.skipped
            torch.distributed.barrier()
            k0 = sum(proc_cpu_s(p) for p in keeper_pids)
            t0, c0 = time.perf_counter(), time.process_time()
            inside = inside_cpu = 0.0  # training thread in step_done: wall, its own CPU
            for _ in range(args.steps):
                loss = one_step()
                step += 1
                t1, u1 = time.perf_counter(), time.thread_time()
                run.step_done(step, loss=loss)
                inside += time.perf_counter() - t1
                inside_cpu += time.thread_time() - u1
            t1, u1 = time.perf_counter(), time.thread_time()
            mem.wait()  # the last send belongs to this phase
            inside += time.perf_counter() - t1
            inside_cpu += time.thread_time() - u1
            cpu = time.process_time() - c0
            torch.distributed.barrier()
            o = out[mode]
            o["wall"].append((time.perf_counter() - t0) / args.steps)
            o["cpu"].append(cpu / args.steps)
            o["inside"].append(inside / args.steps)
            o["inside_cpu"].append(inside_cpu / args.steps)
            o["keepers_cpu"].append((sum(proc_cpu_s(p) for p in keeper_pids) - k0) / args.steps)
            o["taken"].append(mem.stats.taken - taken0)
            o["skipped"].append(mem.stats.skipped - skipped0)
            if run.is_main:
                print(f"round {r} {mode}: {o['cpu'][-1] * 1e3:.1f} ms CPU/step, "
                      f"{o['inside'][-1] * 1e3:.2f} ms inside", flush=True)
    ckpt.memory = mem
    if run.is_main:
        Path(args.out).write_text(json.dumps({"phases": out, "report": mem.report()}))
    # no final checkpoint (run.finish() would write one: 3 GB for 200m, not measured)
    torch.distributed.barrier()
    sys.stdout.flush()
    os._exit(0)


# ------------------------------------------------------------------ keepers and ranks
class Keeper:
    """One node's keeper process on an ephemeral loopback port."""

    def __init__(self, tmp: Path, name: str, keep: int = 2) -> None:
        port_file = tmp / f"keeper-{name}.port"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainer.memkeeper", "--port-file", str(port_file),
             "--keep", str(keep)],
            env={**os.environ, "CB_MEMORY_TOKEN": TOKEN, "PYTHONPATH": str(REPO)}, cwd=REPO)
        deadline = time.monotonic() + 60
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"keeper {name} did not start")
            time.sleep(0.05)
        self.address = f"127.0.0.1:{port_file.read_text()}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def start_ranks(work: Path, args: argparse.Namespace, keepers: list[Keeper], *, mode: str,
                model: str, ckpt_uri: str, attempt: int, env: dict[str, str],
                extra: list[str]) -> Run:
    nodes = len(keepers)
    argv = [__file__, "--worker", "--mode", mode, "--model", model, "--batch", str(args.batch),
            *extra]
    env = {**env, "CB_MEMORY_EVERY": "1", "CB_MEMORY_TOKEN": TOKEN,
           "CB_MEMORY_KEEPERS": ",".join(k.address for k in keepers)}
    return launch(work, nodes, "{}", ckpt_uri, attempt=attempt, argv=argv, job_id="j-memtier",
                  env=env, rank_env={r: {"NODE_RANK": str(r)} for r in range(nodes)})


def mem_available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


def wait_codes(run: Run, timeout: float, min_free_gb: float = 1.5,
               keepers: list[Keeper] | None = None) -> None:
    """Wait for the ranks; stop them and their keepers first if the machine runs short of
    memory (it is shared: the 200m model's snapshots take gigabytes per rank and keeper)."""
    end = time.monotonic() + timeout
    while any(p.poll() is None for p in run.procs) and time.monotonic() < end:
        if mem_available_gb() < min_free_gb:
            run.kill()
            for k in keepers or []:
                k.kill()
            raise SystemExit(f"stopped: under {min_free_gb} GB of memory left on the machine")
        time.sleep(0.5)
    codes = run.wait(max(1.0, end - time.monotonic()))
    if codes != [0] * len(codes):
        raise SystemExit(f"bench ranks exited {codes}:\n{run.output()[-4000:]}")


# ------------------------------------------------------------------ part (a): overhead
def overhead(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    keepers = [Keeper(tmp, f"o{i}", args.keep) for i in range(args.ranks)]
    try:
        out = tmp / "overhead.json"
        run = start_ranks(tmp / "overhead", args, keepers, mode="overhead", model=args.model,
                          ckpt_uri=str(tmp / "ckpt-overhead"), attempt=0, env={},
                          extra=["--ckpt-every", "0", "--ks", *map(str, args.ks), "--rounds",
                                 str(args.rounds), "--steps",
                                 str(args.steps), "--out", str(out), "--keeper-pids",
                                 ",".join(str(k.proc.pid) for k in keepers)])
        wait_codes(run, args.timeout, keepers=keepers)
        raw = json.loads(out.read_text())
    finally:
        for k in keepers:
            k.kill()
    ph = raw["phases"]
    off = ph["off"]
    res: dict[str, Any] = {
        "model": args.model, "ranks": args.ranks, "nodes": args.ranks, "rounds": args.rounds,
        "steps_per_phase": args.steps, "global_batch": args.batch,
        "keeper_keep": args.keep, "keepers_per_snapshot": min(2, args.ranks),
        "off_cpu_ms_per_step": round(med(off["cpu"]) * 1e3, 2),
        "off_wall_ms_per_step": round(med(off["wall"]) * 1e3, 2),
        "snapshot_bytes_rank0": raw["report"]["snapshot_bytes"],
        "per_k": {},
        "raw": ph,
    }
    for k in args.ks:
        p = ph[f"k{k}"]
        cpu_ratio = med([b / a - 1 for a, b in zip(off["cpu"], p["cpu"], strict=True)])
        wall_ratio = med([b / a - 1 for a, b in zip(off["wall"], p["wall"], strict=True)])
        keepers_share = med([kc / a for a, kc in zip(off["cpu"], p["keepers_cpu"], strict=True)])
        # the training thread's own CPU inside step_done (load-proof, unlike its wall time)
        inside_off = med(off["inside_cpu"])
        inside_share = med([(i - io) / a for a, i, io in
                            zip(off["cpu"], p["inside_cpu"], off["inside_cpu"], strict=True)])
        res["per_k"][str(k)] = {
            "cpu_ms_per_step": round(med(p["cpu"]) * 1e3, 2),
            "cpu_overhead": round(cpu_ratio, 4),
            "wall_overhead": round(wall_ratio, 4),
            "training_thread_ms_per_step": round((med(p["inside_cpu"]) - inside_off) * 1e3, 3),
            "training_thread_wall_ms_per_step": round((med(p["inside"]) - med(off["inside"]))
                                                      * 1e3, 3),
            "training_thread_share": round(inside_share, 4),
            "keepers_cpu_share": round(keepers_share, 4),
            "snapshots": sum(p["taken"]), "skipped": sum(p["skipped"]),
        }
    meets = [k for k in args.ks if res["per_k"][str(k)]["cpu_overhead"] <= args.goal]
    res["smallest_k_meeting_goal_cpu"] = meets[0] if meets else None
    return res


# ------------------------------------------------------------------ part (b): recovery
def _wait_log(log: Path, pred: Any, run: Run, timeout: float) -> dict[str, Any]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if log.exists():
            for rec in reversed(read_log(log)):
                if pred(rec):
                    return rec
        if any(p.poll() is not None for p in run.procs):
            raise SystemExit(f"a rank exited early:\n{run.output()[-4000:]}")
        time.sleep(0.02)
    raise SystemExit(f"timed out waiting for the steps log:\n{run.output()[-4000:]}")


def _restore_seconds(text: str) -> float | None:
    m = (re.search(r"resumed from the memory tier \(step \d+.*? in ([\d.]+)s", text)
         or re.search(r"resumed from s3://\S+ \(step .*? in ([\d.]+)s", text))
    return float(m.group(1)) if m else None


def recovery(args: argparse.Namespace, tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    nodes, c, off = 3, args.ckpt_every_recovery, args.kill_offset
    ckpt_uri = f"s3://{BUCKET}/jobs/j-memtier"
    log = tmp / "steps.jsonl"
    keepers = [Keeper(tmp, f"r{i}") for i in range(nodes)]
    every_keeper = list(keepers)
    extra = ["--ckpt-every", str(c), "--steps-log", str(log)]
    attempt = 1
    run = start_ranks(tmp / f"a{attempt}", args, keepers, mode="train", model=args.recovery_model,
                      ckpt_uri=ckpt_uri, attempt=attempt, env=env, extra=extra)
    samples: list[dict[str, Any]] = []
    try:
        start = 0
        for i in range(2 * args.kills):
            path = "memory" if i % 2 == 0 else "store"
            # kill `off` steps after a durable checkpoint at least one interval ahead
            target = (start // c + 1) * c + off
            _wait_log(log, lambda r, t=target, a=attempt: r["attempt"] == a and r["step"] >= t,
                      run, args.timeout)
            run.procs[1].send_signal(signal.SIGKILL)
            t_kill = time.time()
            lost_keepers = [1] if path == "memory" else [1, 2]
            for n in lost_keepers:
                keepers[n].kill()
            run.kill()  # the agent stops the rest of the gang
            last = max(r["step"] for r in read_log(log) if r["attempt"] == attempt)
            for n in lost_keepers:  # spare nodes with empty keepers
                keepers[n] = Keeper(tmp, f"r{n}-{i}")
                every_keeper.append(keepers[n])
            attempt += 1
            run = start_ranks(tmp / f"a{attempt}", args, keepers, mode="train",
                              model=args.recovery_model, ckpt_uri=ckpt_uri, attempt=attempt,
                              env=env, extra=extra)
            first = _wait_log(log, lambda r, a=attempt: r["attempt"] == a, run, args.timeout)
            regained = _wait_log(log, lambda r, a=attempt, s=last: r["attempt"] == a
                                 and r["step"] > s, run, args.timeout)
            prog = run.progress() or {}
            resumed = int(first["step"]) - 1
            tier = prog.get("resume_tier")
            if tier != path:
                raise SystemExit(f"kill {i}: expected the {path} path, the job used {tier}:\n"
                                 f"{run.output(0)[-3000:]}")
            samples.append({
                "path": path, "killed_after_step": last, "resumed_step": resumed,
                "lost_steps": last - resumed, "downtime_s": round(first["t"] - t_kill, 3),
                "regain_s": round(regained["t"] - t_kill, 3),
                "restore_s": _restore_seconds(run.output(0)),
                "restored_from_peer": prog.get("restored_from_peer"),
            })
            print(f"kill {i} ({path}): after step {last}, resumed {resumed}, downtime "
                  f"{samples[-1]['downtime_s']:.2f}s, regained in {samples[-1]['regain_s']:.2f}s, "
                  f"restore {samples[-1]['restore_s']}s", flush=True)
            start = int(regained["step"])
    finally:
        run.kill()
        for k in every_keeper:
            k.kill()
    steps = [r for r in read_log(log)]
    step_s = med([b["t"] - a["t"] for a, b in zip(steps, steps[1:], strict=False)
                  if b["attempt"] == a["attempt"] and b["step"] == a["step"] + 1])
    by = {p: [s for s in samples if s["path"] == p] for p in ("memory", "store")}
    summary = {p: {"downtime_s_median": round(med([s["downtime_s"] for s in v]), 3),
                   "regain_s_median": round(med([s["regain_s"] for s in v]), 3),
                   "lost_steps_max": max(s["lost_steps"] for s in v),
                   "lost_steps_median": med([s["lost_steps"] for s in v]),
                   "restore_s_median": med([s["restore_s"] for s in v if s["restore_s"] is not None])}
               for p, v in by.items()}
    return {
        "model": args.recovery_model, "nodes": nodes, "ranks": nodes, "global_batch": args.batch,
        "checkpoint_every": c, "kill_offset_after_checkpoint": off, "kills_per_path": args.kills,
        "step_s_median": round(step_s, 4),
        "memory": summary["memory"], "store": summary["store"],
        "downtime_ratio": round(summary["memory"]["downtime_s_median"]
                                / summary["store"]["downtime_s_median"], 3),
        "regain_ratio": round(summary["memory"]["regain_s_median"]
                              / summary["store"]["regain_s_median"], 3),
        "samples": samples,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="small", help="model preset for the overhead part")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=16, help="steps per phase (a multiple of every K)")
    ap.add_argument("--ks", type=int, nargs="+", default=list(KS), help="snapshot intervals")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--goal", type=float, default=0.03)
    ap.add_argument("--keep", type=int, default=2,
                    help="steps each keeper holds in the overhead part (1: half the memory)")
    ap.add_argument("--recovery-model", default="small")
    ap.add_argument("--kills", type=int, default=3, help="kills per path (memory, store)")
    ap.add_argument("--ckpt-every-recovery", type=int, default=10)
    ap.add_argument("--kill-offset", type=int, default=7)
    ap.add_argument("--skip-recovery", action="store_true")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--merge", action="store_true",
                    help="keep the other parts of an existing result file")
    ap.add_argument("--timeout", type=float, default=3600)
    # worker-only
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--mode", default="overhead")
    ap.add_argument("--ckpt-every", type=int, default=0)
    ap.add_argument("--out", default="")
    ap.add_argument("--steps-log", default="")
    ap.add_argument("--keeper-pids", default="")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if any(args.steps % k for k in args.ks):
        raise SystemExit("--steps must be a multiple of every K (each K divides a phase)")

    import boto3
    from botocore.config import Config
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    load_start = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="bench-memtier-"))
    prev = json.loads(RESULTS.read_text()) if args.merge and RESULTS.exists() else {}
    result: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared), torch CPU, gloo; "
                   "keepers and S3 (moto) on loopback",
        "goal": {"overhead_at_k1": args.goal, "downtime_ratio": 0.3, "lost_steps": 1},
    }
    try:
        if not args.skip_overhead:
            key = f"overhead_{args.model}"
            result[key] = overhead(args, tmp)
            result[key]["load_average_1_5_15_end"] = [round(x, 2) for x in os.getloadavg()]
        if not args.skip_recovery:
            port = free_port()
            server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
            server.start()
            env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "bench",
                   "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
                   "AWS_REGION": "us-east-1"}
            boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                         aws_access_key_id="bench", aws_secret_access_key="bench",
                         config=Config(s3={"addressing_style": "path"})).create_bucket(Bucket=BUCKET)
            try:
                key = f"recovery_{args.recovery_model}"
                result[key] = recovery(args, tmp, env)
                result[key]["load_average_1_5_15_end"] = [round(x, 2) for x in os.getloadavg()]
            finally:
                server.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["load_average_1_5_15_start"] = [round(x, 2) for x in load_start]
    result["load_average_1_5_15_end"] = [round(x, 2) for x in os.getloadavg()]
    merged = {**prev, **result}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(merged, indent=2) + "\n")
    for key, d in merged.items():
        if key.startswith("overhead_"):
            print(f"{key}: tier off {d['off_cpu_ms_per_step']} ms CPU/step; snapshot "
                  f"{d['snapshot_bytes_rank0'] / 1e6:.1f} MB (rank 0)")
            for k, v in d["per_k"].items():
                print(f"  K={k}: CPU {v['cpu_overhead']:+.2%}, training thread "
                      f"{v['training_thread_share']:.2%}, keepers {v['keepers_cpu_share']:.2%}")
    for key, r in merged.items():
        if key.startswith("recovery_"):
            print(f"{key}: memory {r['memory']}, store {r['store']}, downtime ratio "
                  f"{r['downtime_ratio']}")
    print(f"wrote {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
