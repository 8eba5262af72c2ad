"""The built-in trainer (`python -m trainer`): the toy LM presets on top of the public
library (trainer/run.py), so the library is what the broker's own jobs exercise.

Loss and gradient are the mean over the *global* batch whatever the world size: each
rank sums per-sample losses of its slice (in micro-batches, i.e. gradient accumulation),
scales by world_size / global_batch (`StepBatch.scale`; FSDP's reduce-scatter divides by
world size), so the optimizer sees sum(all samples) / G. Powers of two make that scaling
exact; what differs between world sizes is only the order of float additions (~1e-7).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from trainer.config import RunEnv, TrainerSpec
from trainer.data import SyntheticTokens
from trainer.model import build_model, count_params
from trainer.run import grace_deadline, init
from trainer.sampler import ResumableSampler
from trainer.signals import SignalFlags

__all__ = ["grace_deadline", "lr_lambda", "train"]


def lr_lambda(warmup: int, total: int):
    """Linear warmup then cosine to 10%: a pure function of the step, also checkpointed."""

    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        frac = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

    return f


def _ids_record(ids: list[int]) -> dict[str, Any]:
    if len(ids) <= 256:
        return {"ids": ids}
    digest = hashlib.sha256(json.dumps(ids).encode()).hexdigest()
    return {"ids_sha256": digest, "first_id": ids[0], "last_id": ids[-1], "n": len(ids)}


def train(spec: TrainerSpec, env: RunEnv, flags: SignalFlags) -> int:
    """Run one attempt. Ends with `RunExit` (0 done, 75 checkpointed and stopped) raised
    by the library; `env` and `flags` are the ones `__main__` already read/installed."""
    opts = spec.options
    mcfg = spec.model_shape()
    run = init(
        total_steps=spec.total_steps,
        checkpoint_dir="",  # CB_CHECKPOINT_URI is required here (checked in __main__)
        parallelism=opts.parallelism,
        hsdp_replicate=opts.hsdp_replicate,
        timeout_s=opts.dist_timeout_s,
        heartbeat_s=opts.heartbeat_s,
        s3_max_concurrency=opts.s3_max_concurrency,
        handle_exit=False,  # __main__ maps errors to exit codes itself
    )
    G = spec.global_batch_size
    model = build_model(mcfg, spec.seed)
    n_params = count_params(model)
    model = run.shard(
        model,
        blocks=list(model.blocks),
        mixed_precision=opts.mixed_precision,
        activation_checkpointing=opts.activation_checkpointing,
    )
    optim = torch.optim.AdamW(model.parameters(), lr=opts.lr, weight_decay=opts.weight_decay)
    sched = LambdaLR(optim, lr_lambda(opts.warmup_steps, spec.total_steps))
    sampler = ResumableSampler(
        opts.dataset_size, global_batch=G, seed=spec.seed, micro_batch=opts.micro_batch_size
    )
    ckpt = run.checkpointer(
        model=model,
        optimizer=optim,
        scheduler=sched,
        data=sampler,
        every=spec.checkpoint_every,
        keep_last=opts.keep_last,
        async_save=opts.async_checkpoint,
        model_config=mcfg.to_dict(),
        meta={"model_preset": spec.model},
        storage_threads=opts.storage_threads,
    )
    start = ckpt.resume()
    if start == 0:
        run.log(f"starting fresh: model {spec.model} ({n_params:,} params), world size {run.world_size}")

    data = SyntheticTokens(spec.seed, mcfg.vocab_size, mcfg.seq_len)
    sample_log = opts.sample_log if run.is_main else ""
    for step in range(start + 1, spec.total_steps + 1):
        t_step, started = time.perf_counter(), time.time()
        batch = sampler.next()
        model.train()
        optim.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=run.device)
        for mb in batch.micro:
            real = bool(mb)
            tokens, targets = data.batch(mb if real else [batch.ids[0]])
            per_sample = model(tokens.to(run.device), targets.to(run.device))
            # empty micro-batch: still run forward/backward so FSDP collectives stay in step
            (per_sample.sum() * (batch.scale if real else 0.0)).backward()
            if real:
                loss_sum += per_sample.detach().sum()
        optim.step()
        sched.step()
        loss = run.all_sum(loss_sum) / G
        if spec.step_sleep_s:
            time.sleep(spec.step_sleep_s)
        dt = time.perf_counter() - t_step
        if sample_log:
            rec = {"step": step, "loss": loss, "world_size": run.world_size, "attempt": env.attempt,
                   "start": started, "time": time.time()}  # wall clock: a move's downtime
            rec.update(_ids_record(batch.ids))
            with open(sample_log, "a") as f:
                f.write(json.dumps(rec) + "\n")
        if step % opts.log_every == 0 or step == spec.total_steps:
            run.log(f"step {step}/{spec.total_steps} loss {loss:.5f} ({dt * 1000:.0f} ms)")
        if opts.stop_at_step and step >= opts.stop_at_step:
            run.request_stop()  # simulated preemption: checkpoint this step, exit 75
        run.step_done(step, loss=loss, tokens=G * mcfg.seq_len)
    run.finish()
