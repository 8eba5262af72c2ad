"""A plain PyTorch training loop made portable with the `trainer` library.

The 8 lines marked `# cb` are all the library adds (docs/user/bring-your-own-code.md
shows the diff). With them the script, unchanged, can be stopped at any step
(SIGTERM: emergency checkpoint, exit 75), resumed on another world size at exactly
the next unseen sample, and report progress to the broker; without the broker it
checkpoints into ./checkpoints and resumes from there.

    python examples/byo/train_plain.py                       # one process
    torchrun --nproc-per-node 2 examples/byo/train_plain.py  # two ranks (gloo on CPU)
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

import trainer as cb  # cb


class MLP(nn.Module):
    """A small residual MLP classifier; its blocks are what FSDP2 shards one by one."""

    def __init__(self, d_in: int = 32, width: int = 64, depth: int = 3, classes: int = 10):
        super().__init__()
        self.inp = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())
            for _ in range(depth)
        )
        self.out = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.out(h)


def make_dataset(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Points labelled by a fixed random teacher network: learnable, deterministic."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=g)
    teacher = torch.randn(32, 10, generator=g)
    return x, (x @ teacher + 0.5 * torch.randn(n, 10, generator=g)).argmax(dim=1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-sleep", type=float, default=0.0, help="slow down (for demos/tests)")
    p.add_argument("--step-sleep-file", default="",
                   help="when this file exists, its number replaces --step-sleep (slow a running"
                        " job down or speed it up from outside, for demos/tests)")
    p.add_argument("--log-every", type=int, default=50, help="print the loss every N steps")
    p.add_argument("--loss-log", default="", help="rank 0 appends {step, loss, ids} per step")
    p.add_argument("--export", default="", help="write the final full model state here")
    args = p.parse_args()

    run = cb.init(total_steps=args.steps)  # cb
    x, y = make_dataset(4096, args.seed)
    torch.manual_seed(args.seed)  # same initial weights on every rank
    model = run.shard(MLP())  # cb (optional: FSDP2 over the ranks)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
    sampler = cb.ResumableSampler(  # cb
        len(x), global_batch=args.global_batch, seed=args.seed, micro_batch=args.micro_batch
    )
    ckpt = run.checkpointer(  # cb
        model=model, optimizer=opt, scheduler=sched, data=sampler, every=args.checkpoint_every
    )
    for step in range(ckpt.resume() + 1, args.steps + 1):  # cb (was: range(1, steps + 1))
        batch = sampler.next()  # this rank's share of the global batch, in micro-batches
        opt.zero_grad(set_to_none=True)
        loss_sum = torch.zeros(())
        for ids in batch.micro:  # gradient accumulation keeps the global batch on any world size
            idx = torch.tensor(ids or batch.ids[:1])  # empty: keep FSDP's collectives in step
            per_sample = nn.functional.cross_entropy(model(x[idx]), y[idx], reduction="none")
            (per_sample.sum() * (batch.scale if ids else 0.0)).backward()
            loss_sum += per_sample.detach().sum() if ids else 0.0
        opt.step()
        sched.step()
        loss = run.all_sum(loss_sum) / args.global_batch  # the global mean loss
        if run.is_main and args.loss_log:
            with open(args.loss_log, "a") as f:
                f.write(json.dumps({"step": step, "loss": loss, "ids": batch.ids,
                                    "world_size": run.world_size, "attempt": run.attempt}) + "\n")
        if step % args.log_every == 0:
            run.log(f"step {step} loss {loss:.4f}")
        pause = args.step_sleep
        if args.step_sleep_file:
            with contextlib.suppress(OSError, ValueError):
                pause = float(Path(args.step_sleep_file).read_text())
        if pause:
            import time

            time.sleep(pause)
        run.step_done(step, loss=loss, tokens=args.global_batch)  # cb
    if args.export:  # a collective: every rank takes part, rank 0 writes
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                     cpu_offload=True))
        if run.is_main:
            torch.save(full, args.export)
    run.finish()  # cb: final checkpoint, exit 0


if __name__ == "__main__":
    main()
