"""Rank script for tests/trainer/test_memtier_snapshot.py: trains the small LM with the
memory tier on and checks every snapshot its keeper holds against the live state as it
was when the snapshot was taken (the copy overlaps the next step's forward and backward;
the optimizer step pre-hook must fence it). Midway the optimizer's state tensors are
replaced (cloned), so the tier must notice and walk the state again.
Rank 0 writes what it found as JSON to argv[1]."""

from __future__ import annotations

import json
import pickle
import sys

import numpy as np
import torch
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.tensor import DTensor

import trainer as cb
from trainer import rng
from trainer.config import MODEL_PRESETS
from trainer.data import SyntheticTokens
from trainer.memtier import decode
from trainer.model import build_model

STEPS, REPLACE_AT = 8, 4


def deep_equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(deep_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return (type(a) is type(b) and len(a) == len(b)
                and all(deep_equal(x, y) for x, y in zip(a, b, strict=True)))
    return a == b


def live_state(ckpt: cb.Checkpointer, step: int) -> dict[str, object]:
    flat, _ = flatten_state_dict(ckpt.manager._state(step, ckpt.samples_seen))
    return {k: (v.to_local() if isinstance(v, DTensor) else v).detach().clone()
            if isinstance(v, torch.Tensor | DTensor) else v for k, v in flat.items()}


def main() -> None:
    run = cb.init()
    cfg = MODEL_PRESETS["small"]
    model = run.shard(build_model(cfg, 0), blocks=None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    sampler = cb.ResumableSampler(4096, global_batch=8, seed=0, micro_batch=8)
    ckpt = run.checkpointer(model=model, optimizer=opt, scheduler=sched, data=sampler, every=0)
    mem = ckpt.memory
    assert mem is not None, "the tier is not configured"
    mem.overlap_min_bytes = 0  # a small model: copy on the side anyway, to test the fence
    data = SyntheticTokens(0, cfg.vocab_size, cfg.seq_len)
    expected: dict[int, dict[str, object]] = {}
    layouts, mismatches, compared = set(), [], 0
    for step in range(1, STEPS + 1):
        if step == REPLACE_AT:  # every optimizer state tensor becomes a new one
            for st in opt.state.values():
                for k, v in st.items():
                    st[k] = v.clone()
        batch = sampler.next()
        opt.zero_grad(set_to_none=True)
        for ids in batch.micro:
            tokens, targets = data.batch(ids)
            (model(tokens, targets).sum() * batch.scale).backward()
        opt.step()  # the pre-hook waits for the previous snapshot's copy
        sched.step()
        run.step_done(step, loss=0.0)  # snapshot: small items now, shards on the side
        expected[step] = live_state(ckpt, step)
        layouts.add(mem._layout.fingerprint)
    mem.wait()
    for step in sorted(expected)[-2:]:  # the keeper holds the newest KEEP steps
        reply, payload = mem.own.request({"op": "get", "job": run.env.job_id,
                                          "rank": run.rank, "step": step})
        assert reply["ok"], reply
        snap = decode(payload)
        state = snap["state"]
        if set(state) != set(expected[step]):
            mismatches.append(f"step {step}: keys {sorted(set(state) ^ set(expected[step]))[:4]}")
        for key, want in expected[step].items():
            got = state.get(key)
            same = (torch.equal(got, want) if isinstance(want, torch.Tensor) else got == want)
            compared += 1
            if not same and key.startswith(f"trainer.{rng.PER_RANK_KEY}."):
                # pickling equal states may give other bytes (memo of shared objects)
                same = deep_equal(pickle.loads(got), pickle.loads(want))  # noqa: S301
            if not same:
                mismatches.append(f"step {step}: {key}")
    report = {"mismatches": mismatches[:20], "compared": compared, "layouts": len(layouts),
              "stats": mem.report(), "overlap": mem._overlap}
    if run.is_main:
        with open(sys.argv[1], "w") as fh:
            json.dump(report, fh)
    ckpt.memory = None
    run.finish()


if __name__ == "__main__":
    main()
