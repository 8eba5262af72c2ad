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
* **recovery** (3 nodes, through a real broker and agent: the local executor, one rank
  per node, a spare in the pool): one job (examples/byo/train_plain.py, snapshots every
  step, durable checkpoints every --ckpt-every-recovery steps); node 1 is lost (its
  rank, keeper and warm starter SIGKILLed) --kill-offset steps after a durable
  checkpoint, and the agent, the broker and the relaunch do the rest. Alternately the
  *memory* path (rank 1's shard is on node 2's keeper) and the *store* path (node 2's
  keeper lost too, so every rank resumes from the durable checkpoint). Downtime =
  SIGKILL -> the relaunch's first step done, split into stages (STAGES) from the
  agent's log, the job's events and the relaunch's Progress.startup
  (trainer/startup.py). Run twice in one invocation: with every rank spawned
  (trainer option warm_ranks=0, the path before warm starters) and with the job's warm
  rank starters (trainer/warm_start.py) ready, so the two are measured under the same
  load.

Writes benchmarks/results/memtier.json.

    .venv/bin/python benchmarks/bench_memtier.py [--model small] [--ranks 2] [--rounds 6]
        [--steps 16] [--kills 2] [--skip-recovery] [--skip-overhead] [--merge]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import math
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
from benchmarks.memtier_job import SIZES as JOB_SIZES  # noqa: E402
from benchmarks.procstats import cgroup_memory_peak, peak_rss_kb, proc_cpu_s  # noqa: E402
from tests.trainer.launch import Run, launch, read_log  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "memtier.json"
TOKEN = "bench-token"
KS = (1, 2, 4, 8)
# Besides the trainer's presets: models between "small" (1M params, ms steps, a
# checkpoint that loads in no time) and "200m" (too large for 3 ranks plus their
# keepers beside other work in this machine's memory), so recovery compares paths with
# real bytes; the recovery job (benchmarks/memtier_job.py) has the same table.
BENCH_MODELS = {name: dataclasses.asdict(cfg) for name, cfg in JOB_SIZES.items()}


def model_params(name: str) -> int:
    """Parameters of the benchmark's model ``name`` (built on the meta device: no memory)."""
    import torch

    from trainer.config import MODEL_PRESETS, ModelConfig
    from trainer.model import TransformerLM

    cfg = ModelConfig(**BENCH_MODELS[name]) if name in BENCH_MODELS else MODEL_PRESETS[name]
    with torch.device("meta"):
        return sum(p.numel() for p in TransformerLM(cfg).parameters())


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
        params = sum(p.numel() for p in ckpt.manager.model.parameters())  # local shards
        Path(args.out).write_text(json.dumps({
            "phases": out, "report": mem.report(), "local_params_rank0": params,
            "peak_rss_kb_rank0": peak_rss_kb(os.getpid())}))
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


class MemoryStop(SystemExit):
    """The run stopped itself because the machine ran short of memory; ``seen``: what it
    measured until then (written to the results as ``stopped_<part>_<model>``, so a run
    too large for the machine still leaves its figures)."""

    def __init__(self, message: str, seen: dict[str, Any]) -> None:
        super().__init__(message)
        self.seen = seen


def wait_codes(run: Run, timeout: float, min_free_gb: float = 1.5,
               keepers: list[Keeper] | None = None) -> None:
    """Wait for the ranks; stop them and their keepers first if the machine runs short of
    memory (it is shared: the 200m model's snapshots take gigabytes per rank and keeper)."""
    end = time.monotonic() + timeout
    peaks: dict[int, int] = {}
    lowest = float("inf")
    while any(p.poll() is None for p in run.procs) and time.monotonic() < end:
        for pid in [p.pid for p in run.procs] + [k.proc.pid for k in keepers or []]:
            with contextlib.suppress(OSError):
                peaks[pid] = max(peaks.get(pid, 0), peak_rss_kb(pid))
        lowest = min(lowest, free := mem_available_gb())
        if free < min_free_gb:
            run.kill()
            for k in keepers or []:
                k.kill()
            keeper_pids = {k.proc.pid for k in keepers or []}
            raise MemoryStop(f"stopped: under {min_free_gb} GB of memory left on the machine", {
                "peak_rss_mb_ranks": [round(kb / 1024) for pid, kb in peaks.items()
                                      if pid not in keeper_pids and kb],
                "peak_rss_mb_keepers": [round(kb / 1024) for pid, kb in peaks.items()
                                        if pid in keeper_pids and kb],
                "min_mem_available_gb": round(lowest, 2)})
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
        wait_codes(run, args.timeout, args.min_free_gb, keepers=keepers)
        raw = json.loads(out.read_text())
        keeper_peaks = [peak_rss_kb(k.proc.pid) for k in keepers]
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
        "params": model_params(args.model),
        "memory": {"peak_rss_mb_rank0": round(raw["peak_rss_kb_rank0"] / 1024),
                   "peak_rss_mb_keepers": [round(kb / 1024) for kb in keeper_peaks],
                   "cgroup": cgroup_memory_peak()},
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
    res.update(k_for_goal(ph, args.goal))
    return res


def k_for_goal(phases: dict[str, dict[str, list[float]]], goal: float) -> dict[str, Any]:
    """The rank's CPU for one snapshot (K=1: one per step, minus the same round's tier-off
    step) and the smallest K whose share of a step's CPU is within ``goal``. Why derived:
    a 200m step takes seconds of CPU, so phases long enough for K=8 do not fit a shared
    machine's afternoon; a snapshot costs the same whichever step takes it."""
    if "k1" not in phases:
        return {}
    off, k1 = phases["off"]["cpu"], phases["k1"]["cpu"]
    per_snapshot = med([b - a for a, b in zip(off, k1, strict=True)])
    step = med(off)
    k = max(1, math.ceil(per_snapshot / (goal * step))) if per_snapshot > 0 else 1
    return {"per_snapshot_cpu_s": round(per_snapshot, 3), "k_for_goal_from_per_snapshot_cost": k}


# ------------------------------------------------------------------ part (b): recovery
# The stages of one recovery, in order, and the mark that ends each one (see
# docs/recovery.md "Where a recovery's time goes"). Marks: "kill" (this script),
# "agent_noticed" (the agent's log: the attempt finished, the survivors' ranks killed),
# "broker_failed"/"decided"/"admitted" (the job's events), "agent_launched" (the agent's
# log: every rank spawned), the rest the relaunch's rank 0 (Progress.startup,
# trainer/startup.py).
STAGES = (
    ("notice", "kill", "agent_noticed"),  # the dead rank seen, the survivors stopped
    ("report", "agent_noticed", "broker_failed"),  # the agent's update reaches the broker
    ("decide_admit", "broker_failed", "admitted"),  # the recovery plan and the admission
    ("launch", "admitted", "spawned"),  # Launch to the agent, its prepare, the spawn
    ("imports", "spawned", "imported"),  # interpreter start, torch and the script's imports
    ("process_group", "imported", "process_group"),  # rendezvous, mesh, checkpoint group
    ("setup", "process_group", "resuming"),  # the script: model, FSDP, optimizer, tier
    ("restore", "resuming", "restored"),  # memory or store, agreed
    ("first_step", "restored", "first_step"),
)
AGENT_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) .*?: (\S+) attempt (\d+) "
                        r"(finished|launched|warm)")
SCRIPT = REPO / "examples" / "byo" / "train_plain.py"
JOB_SCRIPT = REPO / "benchmarks" / "memtier_job.py"  # --recovery-model
REGION = "us-east-2"


def _agent_marks(log: Path, job_id: str) -> dict[tuple[str, int], float]:
    """(what, attempt) -> epoch time of the agent's log lines for ``job_id``."""
    out: dict[tuple[str, int], float] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = AGENT_LINE.match(line)
        if m and m.group(3) == job_id:
            t = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1e3
            out.setdefault((m.group(5), int(m.group(4))), t)
    return out


def _breakdown(marks: dict[str, float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name, a, b in STAGES:
        out[name] = round(marks[b] - marks[a], 3) if a in marks and b in marks else None
    return out


def warm_nodes(root: Path, job_id: str) -> set[str]:
    """Nodes with a live warm rank starter for ``job_id`` whose imports are done (its
    log's last line; a restarted starter first writes that it is importing)."""
    from trainer.warm_start import READY_LINE

    live = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmdline = (d / "cmdline").read_bytes()
                environ = (d / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"trainer.warm_start" in cmdline and f"CB_JOB_ID={job_id}".encode() in environ:
                live |= {e.split(b"=", 1)[1].decode() for e in environ
                         if e.startswith(b"CB_NODE_ID=")}
    ready = set()
    for p in root.glob(f"agents/*/rank-starters/{job_id}/*.log"):
        lines = p.read_text(errors="replace").strip().splitlines()
        if p.stem in live and lines and lines[-1].startswith(READY_LINE):
            ready.add(p.stem)
    return ready


def _job_procs(job_id: str) -> dict[str, list[int]]:
    """The pids of ``job_id``'s ranks and memory keepers ("ranks", "keepers"), from /proc.
    A rank forked by a warm starter keeps its starter's command line and environment in
    /proc, so ranks are the starters' children and the processes spawned with the job's
    environment that are neither starters nor keepers."""
    procs: dict[int, tuple[bytes, list[bytes], int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                procs[int(d.name)] = ((d / "cmdline").read_bytes(),
                                      (d / "environ").read_bytes().split(b"\0"),
                                      int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]))
            except (OSError, ValueError, IndexError):
                continue
    mine = f"CB_JOB_ID={job_id}".encode()
    starters = {pid for pid, (cmd, env, _) in procs.items()
                if b"trainer.warm_start" in cmd and mine in env}
    out: dict[str, list[int]] = {"ranks": [], "keepers": []}
    for pid, (cmd, env, ppid) in procs.items():
        if b"trainer.memkeeper" in cmd and f"/memory-keepers/{job_id}/".encode() in cmd:
            out["keepers"].append(pid)
        elif ppid in starters or (mine in env and pid not in starters
                                  and b"trainer.memkeeper" not in cmd):
            out["ranks"].append(pid)
    return out


class MemoryWatch:
    """Samples a job's ranks' and keepers' peak RSS (VmHWM, read while they live) and the
    machine's lowest MemAvailable on a thread; ``low`` is set when the machine runs short
    (the benchmark then stops: other people's work shares this machine)."""

    def __init__(self, job_id: str, min_free_gb: float) -> None:
        import threading

        self.job_id, self.min_free_gb = job_id, min_free_gb
        self.peak_kb: dict[str, dict[int, int]] = {"ranks": {}, "keepers": {}}
        self.min_available_gb = float("inf")
        self.low = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            free = mem_available_gb()
            self.min_available_gb = min(self.min_available_gb, free)
            if free < self.min_free_gb:
                self.low.set()
            for kind, pids in _job_procs(self.job_id).items():
                for pid in pids:
                    with contextlib.suppress(OSError):
                        kb = peak_rss_kb(pid)
                        self.peak_kb[kind][pid] = max(self.peak_kb[kind].get(pid, 0), kb)

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        return self.summary()

    def summary(self) -> dict[str, Any]:
        return {"peak_rss_mb_ranks_max": round(max(self.peak_kb["ranks"].values(), default=0) / 1024),
                "peak_rss_mb_keepers_max": round(max(self.peak_kb["keepers"].values(), default=0)
                                                 / 1024),
                "rank_processes_seen": len(self.peak_kb["ranks"]),
                "keeper_processes_seen": len(self.peak_kb["keepers"]),
                "min_mem_available_gb": round(self.min_available_gb, 2)}


def recovery(args: argparse.Namespace, tmp: Path, warm: bool,
             model: str = "") -> dict[str, Any]:
    """The whole path through a real broker and agent (the local executor, one rank per
    node, a spare in the pool): kill node 1 (its rank, keeper and warm starter: SIGKILL),
    let the agent, the broker and the relaunch do the rest, and read every stage's end
    from the logs, the job's events and the relaunch's Progress.startup. ``warm``: the
    job's warm rank starters on (the kill waits until its nodes' and the spare's are
    ready, the steady state of a running job), else ``warm_ranks=0``. ``model``: run
    benchmarks/memtier_job.py with that LM size (keepers holding ``--recovery-keep``
    steps) instead of the small MLP of examples/byo/train_plain.py."""
    from computebroker.v1 import common_pb2 as pb
    from tests.e2e.test_replace_in_place import kill_node
    from tests.fixtures.cluster import Cluster, wait_until
    from tests.fixtures.pki import install

    install()  # a dev CA and an operator token for this process's clients (as the tests do)
    nodes, c, off = 3, args.ckpt_every_recovery, args.kill_offset
    steps = 10**5  # cancelled at the end
    cluster = Cluster(root=tmp / f"cluster-{'warm' if warm else 'cold'}")
    # every kill is a node failure, which counts against max_node_failures (10 an hour by
    # default; never against max_restarts)
    cluster.start_broker("--set", "max_restarts=1000", "--set", "max_node_failures=1000")
    # a slow model's steps on a loaded machine are minutes apart: not a hang
    cluster.start_agent(REGION, "--hang-timeout-s", "3600", nodes=nodes + 1, gpus=1, spares=1)
    code = tmp / f"project-{warm}"
    code.mkdir()
    script = JOB_SCRIPT if model else SCRIPT
    shutil.copy(script, code / script.name)
    log = tmp / f"loss-{warm}.jsonl"
    samples: list[dict[str, Any]] = []
    if model:
        run_cmd = ["python", script.name, "--model", model, "--checkpoint-every", str(c),
                   "--loss-log", str(log)]
        options = {"memory_every": "1", "memory_keep": str(args.recovery_keep)}
    else:
        run_cmd = ["python", script.name, "--steps", str(steps), "--checkpoint-every",
                   str(c), "--step-sleep", str(args.step_sleep), "--loss-log", str(log),
                   "--log-every", str(10**6)]
        options = {"memory_every": "1"}
    options["warm_ranks"] = "1" if warm else "0"
    watch: MemoryWatch | None = None
    try:
        with cluster.client() as client:
            client.set_team_quota(team="ml", guaranteed_gpus=8)
            wait_until(lambda: any(r.connected for r in client.regions()), timeout=300,
                       what="agent connected")
            handle = client.submit({
                "name": "bench-recovery", "team": "ml", "nodes": nodes, "gpus_per_node": 1,
                "workdir": str(code), "run": run_cmd,
                "trainer": {"total_steps": steps, "options": options}})
            watch = MemoryWatch(handle.id, args.min_free_gb)

            def wait(pred: Any, what: str) -> Any:
                """wait_until, stopped early when the machine runs short of memory."""
                def check() -> Any:
                    if watch is not None and watch.low.is_set():
                        done = [r["step"] for r in read_log(log)] if log.exists() else []
                        raise MemoryStop(f"stopped: under {args.min_free_gb} GB of memory "
                                         "left on the machine",
                                         {**watch.summary(), "steps_done": max(done, default=0),
                                          "kills_done": len(samples)})
                    return pred()
                return wait_until(check, timeout=args.timeout, what=what)
            start = 0
            for i in range(2 * args.kills):
                path = "memory" if i % 2 == 0 else "store"
                job = wait(lambda: (j := handle.status()).phase == pb.JOB_PHASE_RUNNING
                           and j, f"running\n{cluster.logs()}")
                attempt = job.attempt
                ready: set[str] = set()
                if warm:  # the attempt's nodes and the spare: nodes + 1 starters
                    ready = wait_until(lambda: len(r := warm_nodes(cluster.root, handle.id))
                                       >= nodes + 1 and r, timeout=args.timeout,
                                       what=f"warm starters\n{cluster.logs()}")
                    done = [r["step"] for r in read_log(log) if r["attempt"] == attempt]
                    start = max(start, *done) if done else start
                target = (start // c + 1) * c + off
                wait(lambda a=attempt, t=target: log.exists() and any(
                    r["attempt"] == a and r["step"] >= t for r in read_log(log)),
                    f"step {target}\n{cluster.logs()}")
                placed = [a.node_id for a in handle.status().placement.nodes]
                victim = placed[1]
                tier_report = _memory_tier_report(cluster.root, handle.id)
                t_kill = time.time()
                kill_node(cluster.root, handle.id, victim, attempt=attempt)
                if path == "store":  # rank 1's other copy (node 2's keeper) lost too
                    _kill_keeper(cluster.root, handle.id, placed[2])
                last = max(r["step"] for r in read_log(log) if r["attempt"] == attempt)
                job = wait(lambda a=attempt, t=t_kill: (j := handle.status()).attempt > a
                           and j.progress.startup.get("first_step", 0) > t and j,
                           f"the relaunch\n{cluster.logs()}")
                events = client.events(handle.id)
                marks: dict[str, float] = {"kill": t_kill}
                for e in events:
                    if e.attempt == attempt and e.type in ("failed", "requeued", "attempt_failed") \
                            and "broker_failed" not in marks:
                        marks["broker_failed"] = e.time
                    if e.type == "node_recovery" and e.time >= t_kill and "decided" not in marks:
                        marks["decided"] = e.time
                    if e.attempt == job.attempt and e.type in ("admitted", "launched") \
                            and "admitted" not in marks:
                        marks["admitted"] = e.time
                agent = _agent_marks(cluster.root / "logs" / f"agent-{REGION}.log", handle.id)
                if ("finished", attempt) in agent:
                    marks["agent_noticed"] = agent[("finished", attempt)]
                if ("launched", job.attempt) in agent:
                    marks["agent_launched"] = agent[("launched", job.attempt)]
                marks.update(dict(job.progress.startup))
                tier = job.progress.resume.tier
                # where the relaunch's restore went (rank 0's laps, trainer/memtier.py),
                # and a steady step of the killed attempt (what first_step compares with)
                laps = _restore_laps(cluster.root, handle.id)
                times = [r["time"] for r in read_log(log)
                         if r["attempt"] == attempt and "time" in r][-5:]
                steady = med([b - a for a, b in itertools.pairwise(times)]) if len(times) > 1 else None
                first_new = min(r["step"] for r in read_log(log) if r["attempt"] == job.attempt)
                resumed = first_new - 1
                if tier != path:
                    raise SystemExit(f"kill {i}: expected the {path} path, the job used {tier}:\n"
                                     f"{cluster.logs()}")
                sample = {
                    "path": path, "killed_after_step": last, "resumed_step": resumed,
                    "lost_steps": last - resumed,
                    "downtime_s": round(marks["first_step"] - t_kill, 3),
                    "plan": job.node_recovery.plan,
                    "replaced": dict(job.node_recovery.replaced),
                    "stages_s": _breakdown(marks),
                    "marks": {k: round(v - t_kill, 3) for k, v in sorted(marks.items(),
                                                                       key=lambda kv: kv[1])},
                    "load_average_1": round(os.getloadavg()[0], 2),
                    "warm_starters_at_kill": sorted(ready),
                    # rank 0's tier report just before the kill: snapshots taken and
                    # skipped (the previous one still sending: the real interval), bytes
                    "memory_tier_at_kill": tier_report,
                    # what the job's events say about the tier the resume came from
                    "event": next((e.message for e in client.events(handle.id)
                                   if e.type == "recovered" and e.time >= t_kill), ""),
                    "restore_laps_s": laps.get("memory_restore_s", {}),
                    "restore_bytes": laps.get("memory_restore_bytes", {}),
                    "steady_step_s_before_kill": round(steady, 3) if steady else None,
                }
                samples.append(sample)
                print(f"kill {i} ({path}): after step {last}, resumed {resumed}, downtime "
                      f"{sample['downtime_s']:.2f}s; {sample['stages_s']}", flush=True)
                start = max(r["step"] for r in read_log(log) if r["attempt"] == job.attempt)
            client.cancel(handle.id, reason="benchmark over")
    finally:
        memory = watch.stop() if watch is not None else {}
        cluster.stop()
    by = {p: [s for s in samples if s["path"] == p] for p in ("memory", "store")}
    summary = {p: {"downtime_s_median": round(med([s["downtime_s"] for s in v]), 3),
                   "lost_steps_max": max(s["lost_steps"] for s in v),
                   "lost_steps_median": med([s["lost_steps"] for s in v]),
                   "stages_s_median": {name: (round(med(xs), 3) if (xs := [
                       s["stages_s"][name] for s in v if s["stages_s"][name] is not None])
                       else None) for name, _, _ in STAGES}}
               for p, v in by.items()}
    snap = max((s["memory_tier_at_kill"].get("snapshot_bytes", 0) for s in samples), default=0)
    if memory and snap:  # a keeper serves two ranks (its node's, its ward's), `keep` each
        keep = args.recovery_keep if model else 2
        memory["keeper_bound_mb"] = round(keep * 2 * snap / 2**20)
        memory["snapshot_mb_rank0"] = round(snap / 2**20)
    return {
        "warm_ranks": warm,
        "memory": summary["memory"], "store": summary["store"],
        "downtime_ratio": round(summary["memory"]["downtime_s_median"]
                                / summary["store"]["downtime_s_median"], 3),
        "samples": samples,
        "load_average_1_during": [s["load_average_1"] for s in samples],
        "memory_use": memory,
    }


def _memory_tier_report(root: Path, job_id: str) -> dict[str, Any]:
    """Rank 0's ``memory_tier`` report from the job's newest progress file under ``root``
    (trainer/memtier.py ``report``); {} when there is none yet."""
    files = [p for p in root.rglob("progress.json") if job_id in str(p)]
    for path in sorted(files, key=lambda p: p.stat().st_mtime, reverse=True):
        with contextlib.suppress(OSError, ValueError):
            tier = json.loads(path.read_text()).get("memory_tier")
            if isinstance(tier, dict):
                return {k: tier[k] for k in ("every", "taken", "skipped", "failed",
                                             "snapshot_bytes", "keeper_bytes") if k in tier}
    return {}


def _restore_laps(root: Path, job_id: str) -> dict[str, Any]:
    """The newest progress file's record of the relaunch's restore from the keepers
    (``memory_restore_s``: seconds per lap of rank 0's restore, ``memory_restore_bytes``);
    {} when it has none (no memory tier)."""
    files = [p for p in root.rglob("progress.json") if job_id in str(p)]
    for path in sorted(files, key=lambda p: p.stat().st_mtime, reverse=True):
        with contextlib.suppress(OSError, ValueError):
            got = json.loads(path.read_text())
            return {k: got[k] for k in ("memory_restore_s", "memory_restore_bytes") if k in got}
    return {}


def _kill_keeper(root: Path, job_id: str, node: str) -> None:
    """SIGKILL ``node``'s memory keeper for ``job_id`` (under ``root`` only)."""
    mark = f"memory-keepers/{job_id}/{node}.port".encode()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmdline = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if str(root).encode() in cmdline and mark in cmdline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(d.name), signal.SIGKILL)


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
    ap.add_argument("--step-sleep", type=float, default=0.2,
                    help="recovery: the job's pause per step (a steady step time to kill at)")
    ap.add_argument("--kills", type=int, default=2, help="kills per path (memory, store)")
    ap.add_argument("--ckpt-every-recovery", type=int, default=10)
    ap.add_argument("--kill-offset", type=int, default=7)
    ap.add_argument("--recovery-model", default="",
                    help="recovery: benchmarks/memtier_job.py with this LM size (58m, 134m, "
                         "200m), warm starters only, written as recovery_<size>; default: the "
                         "small MLP, with and without warm starters (recovery_small)")
    ap.add_argument("--recovery-keep", type=int, default=2,
                    help="recovery with --recovery-model: steps each keeper holds per rank")
    ap.add_argument("--min-free-gb", type=float, default=1.5,
                    help="stop when the machine's MemAvailable falls below this")
    ap.add_argument("--skip-recovery", action="store_true")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--reuse-runs", default="",
                    help="recovery: a partial file of runs already measured (not run again)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the other parts of an existing result file")
    ap.add_argument("--results", default=str(RESULTS), help="the JSON file written")
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

    load_start = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="bench-memtier-"))
    results = Path(args.results)
    prev = json.loads(results.read_text()) if args.merge and results.exists() else {}
    result: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared), torch CPU, gloo; "
                   "keepers and S3 (moto) on loopback",
        "goal": {"overhead_at_k1": args.goal, "downtime_ratio": 0.3, "lost_steps": 1},
    }
    stopped: MemoryStop | None = None
    try:
        part = "overhead"
        if not args.skip_overhead:
            key = f"overhead_{args.model}"
            result[key] = overhead(args, tmp)
            result[key]["load_average_1_5_15_end"] = [round(x, 2) for x in os.getloadavg()]
        part = "recovery"
        if not args.skip_recovery and args.recovery_model:
            rec = recovery(args, tmp, True, args.recovery_model)
            result[f"recovery_{args.recovery_model}"] = {
                "method": "real broker + agent (local executor, one rank per node, 1 spare, warm"
                          " rank starters); downtime = SIGKILL of node 1's rank, keeper and"
                          " starter -> the relaunch's first step done, detection and decision"
                          " included; store = local disk (page cache)",
                "model": f"benchmarks/memtier_job.py --model {args.recovery_model}",
                "params": model_params(args.recovery_model), "nodes": 3, "ranks": 3,
                "global_batch": 3, "keeper_keep": args.recovery_keep,
                "checkpoint_every": args.ckpt_every_recovery,
                "kill_offset_after_checkpoint": args.kill_offset, "kills_per_path": args.kills,
                "stages": [name for name, _, _ in STAGES],
                **rec, "cgroup": cgroup_memory_peak(),
                "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "load_average_1_5_15_start": [round(x, 2) for x in load_start],
                "load_average_1_5_15_end": [round(x, 2) for x in os.getloadavg()]}
        elif not args.skip_recovery:
            runs = json.loads(Path(args.reuse_runs).read_text()) if args.reuse_runs else {}
            for warm in (False, True):  # the same job, without then with warm starters
                name = "warm rank starters" if warm else "spawned ranks (warm_ranks=0)"
                if name not in runs:
                    runs[name] = recovery(args, tmp, warm)
                    runs[name]["measured"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
                # a later failure keeps it (outside results/: not a result of its own)
                partial = Path(tempfile.gettempdir()) / "bench-memtier-recovery.partial.json"
                partial.write_text(json.dumps(runs, indent=2) + "\n")
            result["recovery_small"] = {
                "method": "real broker + agent (local executor, one rank per node, 1 spare);"
                          " downtime = SIGKILL of node 1's rank, keeper and starter -> the"
                          " relaunch's first step done, detection and decision included",
                "model": "examples/byo/train_plain.py", "nodes": 3, "ranks": 3,
                "checkpoint_every": args.ckpt_every_recovery,
                "kill_offset_after_checkpoint": args.kill_offset, "kills_per_path": args.kills,
                "step_sleep_s": args.step_sleep, "stages": [name for name, _, _ in STAGES],
                "runs": runs,
                "load_average_1_5_15_end": [round(x, 2) for x in os.getloadavg()]}
    except MemoryStop as e:  # keep what it saw; the parts measured before stay too
        stopped = e
        name = args.model if part == "overhead" else (args.recovery_model or "small")
        result[f"stopped_{part}_{name}"] = {
            "reason": str(e), **e.seen, "cgroup": cgroup_memory_peak(),
            "args": {k: v for k, v in vars(args).items() if not k.startswith("worker")},
            "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()]}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not args.skip_overhead or not prev:  # the overhead part's load (a recovery
        # section carries its own; merging one must not rewrite the overhead's figures)
        result["load_average_1_5_15_start"] = [round(x, 2) for x in load_start]
        result["load_average_1_5_15_end"] = [round(x, 2) for x in os.getloadavg()]
    merged = {**prev, **result}
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(merged, indent=2) + "\n")
    for key, d in merged.items():
        if key.startswith("overhead_"):
            print(f"{key}: tier off {d['off_cpu_ms_per_step']} ms CPU/step; snapshot "
                  f"{d['snapshot_bytes_rank0'] / 1e6:.1f} MB (rank 0)")
            for k, v in d["per_k"].items():
                print(f"  K={k}: CPU {v['cpu_overhead']:+.2%}, training thread "
                      f"{v['training_thread_share']:.2%}, keepers {v['keepers_cpu_share']:.2%}")
    for key, r in merged.items():
        if key.startswith("recovery_") and "runs" not in r:
            print(f"{key}: memory {r['memory']}, store {r['store']}, downtime ratio "
                  f"{r['downtime_ratio']}")
        for name, run in r.get("runs", {}).items() if key.startswith("recovery_") else ():
            print(f"{key} {name}: memory {run['memory']}, store {run['store']}, downtime "
                  f"ratio {run['downtime_ratio']}")
    print(f"wrote {results}")
    if stopped is not None:
        raise stopped


if __name__ == "__main__":
    main()
