"""Library overhead per training step: the same loop with and without `import trainer`.

Runs --ranks real gloo processes. Each rank trains the built-in "small" LM (FSDP2) in
phases of --steps steps: *plain* (the loop alone: forward, backward, optimizer, the
loss all_reduce), *hooks* (plus `run.step_done` every step: the progress file
(CB_PROGRESS_FILE) rewritten every step plus its heartbeat, the SIGTERM/SIGUSR1 agreement, which rides on the loss all_reduce) and
*library* (hooks plus an async checkpoint every --every steps to a local directory,
waited for at the end of the phase so its background work is counted). The order of
the three phases rotates every round so drift on this shared machine hits all alike.

Besides wall time it measures process CPU time per step (all threads, so the
background checkpoint write counts): on a machine shared with other work wall time
swings by tens of percent between phases, CPU time much less. And it times the
training thread inside library calls (step_done, the end-of-phase wait). Overheads
are medians of per-round ratios. Writes benchmarks/results/library.json.

    .venv/bin/python benchmarks/bench_library.py [--ranks 2] [--rounds 12] [--steps 50] [--every 50]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RESULTS = REPO / "benchmarks" / "results" / "library.json"


def worker(args: argparse.Namespace) -> None:
    import torch

    import trainer as cb
    from trainer.config import MODEL_PRESETS
    from trainer.data import SyntheticTokens
    from trainer.model import build_model

    run = cb.init(checkpoint_dir=args.ckpt, heartbeat_s=2.0)
    cfg = MODEL_PRESETS["small"]
    model = run.shard(build_model(cfg, 0), blocks=None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sampler = cb.ResumableSampler(65536, global_batch=args.batch, seed=0, micro_batch=args.batch)
    ckpt = run.checkpointer(model=model, optimizer=opt, data=sampler, every=args.every,
                            keep_last=2)
    data = SyntheticTokens(0, cfg.vocab_size, cfg.seq_len)
    step = 0

    def one_step() -> float:
        batch = sampler.next()
        opt.zero_grad(set_to_none=True)
        tokens, targets = data.batch(batch.micro[0])
        per_sample = model(tokens, targets)
        (per_sample.sum() * batch.scale).backward()
        opt.step()
        return run.all_sum(per_sample.detach().sum()) / args.batch

    # warm-up (optimizer state, allocator, first collectives), and it puts each phase's
    # checkpoint mid-phase, so its background write overlaps training as in a real run
    # (a save right before the end-of-phase wait would be timed as if synchronous)
    for _ in range(max(1, args.every // 2)):
        one_step()
        step += 1
        run.step_done(step, loss=0.0)
    modes = ("plain", "hooks", "library")
    times: dict[str, list[float]] = {k: [] for m in modes for k in (m, f"{m}_cpu")}
    times["in_library"] = []
    for r in range(args.rounds):
        order = modes[r % 3:] + modes[: r % 3]  # rotate so drift hits every mode alike
        for mode in order:
            ckpt.every = args.every if mode == "library" else 0
            torch.distributed.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            inside = 0.0  # time the training thread spends in library calls
            for _ in range(args.steps):
                loss = one_step()
                step += 1
                if mode != "plain":
                    t1 = time.perf_counter()
                    run.step_done(step, loss=loss, tokens=args.batch * cfg.seq_len)
                    inside += time.perf_counter() - t1
            if mode == "library":
                t1 = time.perf_counter()
                ckpt.wait()  # the async save's background work belongs to this phase
                inside += time.perf_counter() - t1
                times["in_library"].append(inside / args.steps)
            times[f"{mode}_cpu"].append((time.process_time() - c0) / args.steps)
            torch.distributed.barrier()
            times[mode].append((time.perf_counter() - t0) / args.steps)
    stats = ckpt.manager.stats
    if run.is_main:
        Path(args.out).write_text(json.dumps({"times": times, "saves": stats}))
    run.finish()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--ckpt", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r0.json"
        port = _free_port()
        procs = []
        for rank in range(args.ranks):
            env = {k: v for k, v in os.environ.items() if not k.startswith("CB_")}
            env.update(RANK=str(rank), WORLD_SIZE=str(args.ranks), LOCAL_RANK=str(rank),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                       PYTHONPATH=str(REPO), CB_PROGRESS_FILE=f"{tmp}/progress.json")
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--worker", "--ckpt", f"{tmp}/ckpt", "--out", str(out),
                 "--rounds", str(args.rounds), "--steps", str(args.steps),
                 "--every", str(args.every), "--batch", str(args.batch)], env=env))
        codes = [p.wait() for p in procs]
        if codes != [0] * args.ranks:
            raise SystemExit(f"bench ranks exited {codes}")
        raw = json.loads(out.read_text())
    plain, lib = raw["times"]["plain"], raw["times"]["library"]
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    p_ms, l_ms = med(plain) * 1e3, med(lib) * 1e3
    # paired by round (adjacent phases share the machine's load at that moment)
    overhead = med([b / a - 1 for a, b in zip(plain, lib, strict=True)])
    pc, lc = raw["times"]["plain_cpu"], raw["times"]["library_cpu"]
    hc = raw["times"]["hooks_cpu"]
    cpu_overhead = med([b / a - 1 for a, b in zip(pc, lc, strict=True)])
    hooks_cpu_overhead = med([b / a - 1 for a, b in zip(pc, hc, strict=True)])
    hooks_overhead = med([b / a - 1 for a, b in zip(plain, raw["times"]["hooks"], strict=True)])
    inside_ms = med(raw["times"]["in_library"]) * 1e3
    inside_share = med([i / t for i, t in zip(raw["times"]["in_library"], lib, strict=True)])
    blocked = [s["blocked_s"] * 1e3 for s in raw["saves"]]
    result: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared), torch CPU, gloo",
        "model": "small (built-in LM, FSDP2)",
        "ranks": args.ranks,
        "global_batch": args.batch,
        "steps_per_phase": args.steps,
        "rounds": args.rounds,
        "checkpoint_every": args.every,
        "plain_ms_per_step": round(p_ms, 2),
        "library_ms_per_step": round(l_ms, 2),
        "overhead": round(overhead, 4),
        "plain_cpu_ms_per_step": round(med(pc) * 1e3, 2),
        "library_cpu_ms_per_step": round(med(lc) * 1e3, 2),
        "cpu_overhead": round(cpu_overhead, 4),
        "hooks_ms_per_step": round(med(raw["times"]["hooks"]) * 1e3, 2),
        "hooks_cpu_ms_per_step": round(med(hc) * 1e3, 2),
        "hooks_overhead": round(hooks_overhead, 4),
        "hooks_cpu_overhead": round(hooks_cpu_overhead, 4),
        "in_library_ms_per_step": round(inside_ms, 3),
        "in_library_share": round(inside_share, 4),
        "goal": 0.02,
        "load_average_1min": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "async_save_blocked_ms_median": round(med(blocked), 2) if blocked else None,
        "saves": len(blocked),
        "raw_seconds_per_step": raw["times"],
    }
    print(f"plain loop      : {p_ms:8.2f} ms/step (median of {args.rounds} phases x {args.steps})")
    print(f"with the library: {l_ms:8.2f} ms/step (async checkpoint every {args.every} steps)")
    print(f"overhead (wall) : {overhead:+.2%} (median of per-round ratios; goal < 2%)")
    print(f"hooks only (no checkpoints): wall {hooks_overhead:+.2%}, CPU {hooks_cpu_overhead:+.2%}")
    print(f"overhead (CPU)  : {cpu_overhead:+.2%} (process CPU time per step, all threads: "
          f"{med(pc) * 1e3:.1f} vs {med(lc) * 1e3:.1f} ms)")
    print(f"inside library calls: {inside_ms:.2f} ms/step = {inside_share:.2%} of a step "
          "(step_done + waiting for saves, on the training thread)")
    if blocked:
        print(f"async save blocked the loop {med(blocked):.1f} ms (median of {len(blocked)} saves)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
