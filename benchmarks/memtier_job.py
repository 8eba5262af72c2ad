"""The memory-tier recovery benchmark's job (benchmarks/bench_memtier.py, ``--recovery-model``):
the trainer library's LM (FSDP2 per block + AdamW) at a size picked by name, run through a
real broker and agent like any bring-your-own script.

Why a script of its own and not the built-in trainer (``python -m trainer``): the built-in
trainer takes only its presets (``tiny``, ``small``, ``200m``), and the benchmark needs the
sizes between them that fit beside other work on a shared machine. Rank 0 appends one JSON
line per step to ``--loss-log`` (step, loss, attempt, wall time), which the benchmark reads
to time its kills and count the steps a recovery lost.

    python memtier_job.py --model 134m --checkpoint-every 4 --loss-log steps.jsonl
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import trainer as cb
from trainer.config import MODEL_PRESETS, ModelConfig
from trainer.data import SyntheticTokens
from trainer.model import build_model

# Sizes besides the trainer's presets (parameters in the name; vocabulary and sequence
# length as the 200m preset's). Why these: "58m" and "134m" fit three ranks, their keepers
# (two steps each of a rank's own and its ward's snapshot) and warm starters in about 8
# and 15 GB; the 200m preset needs about 19 GB (docs/recovery.md, "Measured").
SIZES: dict[str, ModelConfig] = {
    "58m": ModelConfig(vocab_size=32000, d_model=512, n_layers=8, n_heads=8, d_ff=2048,
                       seq_len=128),
    "134m": ModelConfig(vocab_size=32000, d_model=768, n_layers=12, n_heads=12, d_ff=3072,
                        seq_len=128),
}


def model_config(name: str) -> ModelConfig:
    """A size of this script or a trainer preset; a clear error for anything else."""
    if name in SIZES:
        return SIZES[name]
    if name in MODEL_PRESETS:
        return MODEL_PRESETS[name]
    raise SystemExit(f"unknown model {name!r}; known: {sorted({*SIZES, *MODEL_PRESETS})}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="58m")
    p.add_argument("--steps", type=int, default=10**5)
    p.add_argument("--global-batch", type=int, default=0, help="default: one sample per rank")
    p.add_argument("--checkpoint-every", type=int, default=4)
    p.add_argument("--loss-log", default="")
    args = p.parse_args()

    cfg = model_config(args.model)
    run = cb.init(total_steps=args.steps)
    model = build_model(cfg, 0)
    model = run.shard(model, blocks=list(model.blocks))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch_size = args.global_batch or run.world_size
    sampler = cb.ResumableSampler(1 << 20, global_batch=batch_size, seed=0, micro_batch=1)
    # synchronous saves: an async save stages a second copy of the state in memory
    ckpt = run.checkpointer(model=model, optimizer=opt, data=sampler,
                            every=args.checkpoint_every, keep_last=1, async_save=False)
    data = SyntheticTokens(0, cfg.vocab_size, cfg.seq_len)
    for step in range(ckpt.resume() + 1, args.steps + 1):
        batch = sampler.next()
        opt.zero_grad(set_to_none=True)
        loss_sum = torch.zeros(())
        for ids in batch.micro:
            tokens, targets = data.batch(ids or batch.ids[:1])
            per_sample = model(tokens, targets)
            (per_sample.sum() * (batch.scale if ids else 0.0)).backward()
            loss_sum += per_sample.detach().sum() if ids else 0.0
        opt.step()
        loss = run.all_sum(loss_sum) / batch_size
        if run.is_main and args.loss_log:
            with open(args.loss_log, "a") as f:
                f.write(json.dumps({"step": step, "loss": loss, "attempt": run.attempt,
                                    "world_size": run.world_size, "time": time.time()}) + "\n")
        run.step_done(step, loss=loss)
    run.finish()


if __name__ == "__main__":
    main()
