"""train_plain.py with dropout: what it takes for a stochastic model to survive a move
to another world size exactly.

`--dropout-kind sample` uses the library's `SampleDropout` inside `sample_randomness`:
each sample's mask depends only on (seed, step, sample id, layer), so a run moved
2 -> 1 -> 2 ranks trains exactly as an uninterrupted one. `--dropout-kind torch` uses
`nn.Dropout`: resumes on the same world size are exact (every rank's generators are in
the checkpoint), but after a world-size change the masks differ (docs: Randomness).

    torchrun --nproc-per-node 2 examples/byo/train_dropout.py --dropout-kind sample
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

import trainer as cb


class DropMLP(nn.Module):
    """train_plain.py's residual MLP with dropout after every block's activation."""

    def __init__(self, p: float, kind: str, d_in: int = 32, width: int = 64, depth: int = 3):
        super().__init__()

        def drop(i: int) -> nn.Module:
            return cb.SampleDropout(p, key=f"block{i}") if kind == "sample" else nn.Dropout(p)

        self.inp = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU(), drop(i))
            for i in range(depth)
        )
        self.out = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.out(h)


def make_dataset(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
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
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--dropout-kind", choices=("sample", "torch"), default="sample")
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-sleep", type=float, default=0.0, help="slow down (for demos/tests)")
    p.add_argument("--loss-log", default="", help="rank 0 appends {step, loss, ids} per step")
    p.add_argument("--export", default="", help="write the final full model state here")
    args = p.parse_args()

    run = cb.init(total_steps=args.steps)
    x, y = make_dataset(4096, args.seed)
    torch.manual_seed(args.seed)  # same initial weights on every rank
    model = run.shard(DropMLP(args.dropout, args.dropout_kind))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sampler = cb.ResumableSampler(
        len(x), global_batch=args.global_batch, seed=args.seed, micro_batch=args.micro_batch
    )
    ckpt = run.checkpointer(model=model, optimizer=opt, data=sampler, every=args.checkpoint_every)
    torch.manual_seed(args.seed + 1 + run.rank)  # nn.Dropout: a stream of its own per rank
    for step in range(ckpt.resume() + 1, args.steps + 1):
        batch = sampler.next()
        opt.zero_grad(set_to_none=True)
        loss_sum = torch.zeros(())
        for ids in batch.micro:
            rows = ids or batch.ids[:1]  # empty: keep FSDP's collectives in step
            with cb.sample_randomness(args.seed, batch.step, rows):
                per_sample = nn.functional.cross_entropy(
                    model(x[torch.tensor(rows)]), y[torch.tensor(rows)], reduction="none"
                )
            (per_sample.sum() * (batch.scale if ids else 0.0)).backward()
            loss_sum += per_sample.detach().sum() if ids else 0.0
        opt.step()
        loss = run.all_sum(loss_sum) / args.global_batch
        if run.is_main and args.loss_log:
            with open(args.loss_log, "a") as f:
                f.write(json.dumps({"step": step, "loss": loss, "ids": batch.ids,
                                    "world_size": run.world_size, "attempt": run.attempt}) + "\n")
        if args.step_sleep:
            import time

            time.sleep(args.step_sleep)
        run.step_done(step, loss=loss, tokens=args.global_batch)
    if args.export:
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                     cpu_offload=True))
        if run.is_main:
            torch.save(full, args.export)
    run.finish()


if __name__ == "__main__":
    main()
