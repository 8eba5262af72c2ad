"""The training loop: resume, step, checkpoint, react to signals, exit with the contract's code.

Loss and gradient are the mean over the *global* batch whatever the world size: each
rank sums per-sample losses of its slice (in micro-batches, i.e. gradient accumulation),
scales by world_size / global_batch (FSDP's reduce-scatter divides by world size), so
the optimizer sees sum(all samples) / G. Powers of two make that scaling exact; what
differs between world sizes is only the order of float additions (~1e-7 relative).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LambdaLR

from trainer import telemetry
from trainer.checkpoint import CheckpointManager, GraceExceeded, find_resume_point
from trainer.config import RunEnv, TrainerSpec
from trainer.data import GlobalOrder, SyntheticTokens, micro_batches, rank_slice
from trainer.errors import EXIT_CHECKPOINTED, EXIT_GRACE_EXCEEDED, EXIT_OK
from trainer.model import build_model, count_params
from trainer.parallel import init_distributed, shard_model
from trainer.progress import ProgressReporter
from trainer.signals import SignalFlags
from trainer.storage import open_store


def lr_lambda(warmup: int, total: int):
    """Linear warmup then cosine to 10%: a pure function of the step, also checkpointed."""

    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        frac = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

    return f


def log(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"trainer: {msg}", flush=True)


def grace_deadline(term_time: float, grace_s: float) -> float:
    """When the emergency save must be done: CB_GRACE_S after SIGTERM, minus a margin
    (10%, at most 5 s) so the process has exited before the agent's SIGKILL."""
    return term_time + grace_s - min(5.0, 0.1 * grace_s)


def _ids_record(ids: list[int]) -> dict[str, Any]:
    if len(ids) <= 256:
        return {"ids": ids}
    digest = hashlib.sha256(json.dumps(ids).encode()).hexdigest()
    return {"ids_sha256": digest, "first_id": ids[0], "last_id": ids[-1], "n": len(ids)}


def train(spec: TrainerSpec, env: RunEnv, flags: SignalFlags) -> int:
    """Run one attempt; returns the exit code (0 done, 75 checkpointed and stopped)."""
    opts = spec.options
    mcfg = spec.model_shape()
    store = open_store(env.checkpoint_uri, opts.s3_max_concurrency)
    store.check_reachable()  # before peers are involved: a bad endpoint fails fast, clearly

    d = init_distributed(env, opts)
    rank, ws, G = d.rank, d.world_size, spec.global_batch_size
    model = build_model(mcfg, spec.seed)
    n_params = count_params(model)
    model = shard_model(model, d, opts)
    optim = torch.optim.AdamW(model.parameters(), lr=opts.lr, weight_decay=opts.weight_decay)
    sched = LambdaLR(optim, lr_lambda(opts.warmup_steps, spec.total_steps))

    progress = ProgressReporter(
        env.progress_file,
        rank == 0,
        {
            "job_id": env.job_id,
            "attempt": env.attempt,
            "total_steps": spec.total_steps,
            "world_size": ws,
        },
        opts.heartbeat_s,
    )
    progress.start()
    ckpt = CheckpointManager(
        store,
        model=model,
        optim=optim,
        sched=sched,
        ckpt_group=d.ckpt_group,
        rank=rank,
        world_size=ws,
        manifest_base={
            "job_id": env.job_id,
            "attempt": env.attempt,
            "model_preset": spec.model,
            "model": mcfg.to_dict(),
            "seed": spec.seed,
            "global_batch_size": G,
            "dataset_size": opts.dataset_size,
        },
        keep_last=opts.keep_last,
        threads=opts.storage_threads,
        use_async=opts.async_checkpoint,
        on_durable=progress.checkpoint_durable,
    )

    step, samples_seen = 0, 0
    resume = find_resume_point(store, env.resume_from, opts.s3_max_concurrency)
    if resume is not None:
        src, name = resume
        t0 = time.perf_counter()
        manifest = ckpt.load(name, store=src)
        telemetry.checkpoint_loaded(t0, manifest, src.uri(name))
        step, samples_seen = int(manifest["step"]), int(manifest["samples_seen"])
        log(
            rank,
            f"resumed from {src.uri(name)} (step {step}, saved on {manifest['world_size']} "
            f"ranks, loaded on {ws}) in {time.perf_counter() - t0:.2f}s",
        )
        if manifest.get("seed") != spec.seed or manifest.get("global_batch_size") != G:
            log(rank, "warning: seed or global batch differs from the checkpoint's")
        progress.checkpoint_durable(step, src.uri(name))
    else:
        log(rank, f"starting fresh: model {spec.model} ({n_params:,} params), world size {ws}")
    if rank == 0:
        dropped = ckpt.drop_incomplete(step)
        if dropped:
            log(rank, f"removed incomplete checkpoints of a previous attempt: steps {dropped}")
    dist.barrier()
    progress.update(state="running", step=step, samples_seen=samples_seen)

    data = SyntheticTokens(spec.seed, mcfg.vocab_size, mcfg.seq_len)
    order = GlobalOrder(spec.seed, opts.dataset_size, G)
    per_rank_max = -(-G // ws)
    micro = min(opts.micro_batch_size, max(1, per_rank_max))
    n_micro = max(1, -(-per_rank_max // micro))
    scale = ws / G
    stop_requested = False
    sample_log = opts.sample_log if rank == 0 else ""
    staging_warm = not (opts.async_checkpoint and spec.checkpoint_every)

    while step < spec.total_steps:
        stop, ckpt_now = flags.agree(d.device)
        if stop:
            stop_requested = True
            break
        t_step = time.perf_counter()
        ids = order.ids_at(samples_seen, G)
        local = rank_slice(ids, rank, ws)
        model.train()
        optim.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=d.device)
        for mb in micro_batches(local, micro, n_micro):
            real = bool(mb)
            tokens, targets = data.batch(mb if real else [ids[0]])
            per_sample = model(tokens.to(d.device), targets.to(d.device))
            # empty micro-batch: still run forward/backward so FSDP collectives stay in step
            (per_sample.sum() * (scale if real else 0.0)).backward()
            if real:
                loss_sum += per_sample.detach().sum()
        optim.step()
        sched.step()
        if ws > 1:
            dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
        loss = float(loss_sum) / G
        step += 1
        samples_seen += G
        if spec.step_sleep_s:
            time.sleep(spec.step_sleep_s)
        dt = time.perf_counter() - t_step
        if sample_log:
            rec = {"step": step, "loss": loss, "world_size": ws, "attempt": env.attempt}
            rec.update(_ids_record(ids))
            with open(sample_log, "a") as f:
                f.write(json.dumps(rec) + "\n")
        progress.update(
            step=step,
            samples_seen=samples_seen,
            loss=loss,
            tokens_per_s=G * mcfg.seq_len / max(dt, 1e-9),
        )
        if step % opts.log_every == 0 or step == spec.total_steps:
            log(rank, f"step {step}/{spec.total_steps} loss {loss:.5f} ({dt * 1000:.0f} ms)")
        if step == spec.total_steps:
            break
        if not staging_warm:  # optimizer state exists now: fault in async staging buffers
            staging_warm = True
            log(rank, f"async checkpoint staging buffers ready in {ckpt.warm_staging():.2f}s")
        if ckpt_now or (spec.checkpoint_every and step % spec.checkpoint_every == 0):
            ckpt.save(step, samples_seen)
        if opts.stop_at_step and step >= opts.stop_at_step:
            stop_requested = True
            break

    if stop_requested:
        progress.update(state="checkpointing")
        t0 = time.perf_counter()
        deadline = grace_deadline(flags.term_time, env.grace_s) if flags.term_time else None
        try:
            ckpt.save(step, samples_seen, blocking=True, deadline=deadline)
        except GraceExceeded as exc:
            last = ckpt.last_durable_step
            print(
                f"trainer error (rank {rank}): emergency checkpoint of step {step} could not "
                f"complete within CB_GRACE_S={env.grace_s:g}s after SIGTERM ({exc}); exiting "
                f"{EXIT_GRACE_EXCEEDED} without it. Latest complete checkpoint: "
                + (f"step {last}" if last >= 0 else "none"),
                file=sys.stderr,
                flush=True,
            )
            progress.stop()
            return EXIT_GRACE_EXCEEDED
        waited = time.monotonic() - flags.term_time if flags.term_time else 0.0
        log(
            rank,
            f"stopped at step {step}; checkpoint durable in {time.perf_counter() - t0:.2f}s "
            f"({waited:.1f}s after SIGTERM, grace {env.grace_s:.0f}s); exit 75",
        )
        progress.update(state="checkpointing")
        progress.stop()
        return EXIT_CHECKPOINTED
    progress.update(state="checkpointing")
    ckpt.save(step, samples_seen, blocking=True)
    progress.update(state="done")
    progress.stop()
    log(rank, f"done: {step} steps, final checkpoint durable")
    sys.stdout.flush()
    return EXIT_OK
