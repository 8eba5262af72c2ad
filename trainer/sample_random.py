"""Randomness that does not depend on the world size: per-sample generators (opt-in).

Why: `nn.Dropout` draws one mask over the rank's whole micro-batch tensor from the
rank's generator. Which numbers a sample gets therefore depends on which rank holds it
and where in the micro-batch it sits, i.e. on the world size: a job moved 2 -> 1 ranks
trains on the same samples but with other masks, and its losses drift from an
uninterrupted run (seen: up to 0.95% relative loss, 15% in parameters). Saving and
restoring generator states (trainer/rng.py) cannot fix that; drawing each sample's mask
from its own generator can.

Here a sample's mask comes from a generator seeded by `(seed, step, global sample id,
layer key)`, so it is the same whatever rank processes the sample, in whichever
micro-batch, and after any resume. The loop says which samples a forward pass holds:

    with cb.sample_randomness(seed, batch.step, ids):
        out = model(x[ids])

and the model uses `cb.SampleDropout(p, key="...")` instead of `nn.Dropout(p)`. A
recomputation (activation checkpointing) draws the same mask again, since nothing is
consumed from a shared stream.

Costs and limits: one small CPU generator per sample and layer per forward pass (fine
for CPU and small batches; on a GPU the masks are drawn on the CPU and copied). The
same layer called twice on the same samples in one step gets the same mask; give each
call site its own `key`.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class SampleContext:
    """Which samples the current forward pass holds, along dimension 0, and when."""

    seed: int
    step: int
    sample_ids: tuple[int, ...]


_CURRENT: contextvars.ContextVar[SampleContext | None] = contextvars.ContextVar(
    "computebroker_sample_context", default=None
)


@contextlib.contextmanager
def sample_randomness(seed: int, step: int, sample_ids: Sequence[int]) -> Iterator[SampleContext]:
    """Within this block, per-sample layers draw from generators of these samples.

    `step` is the global step (`StepBatch.step`), `sample_ids` the global ids of the rows
    of the batch passed to the model, in order (one micro-batch's ids)."""
    ctx = SampleContext(int(seed), int(step), tuple(int(i) for i in sample_ids))
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)


def sample_seed(seed: int, step: int, sample_id: int, key: str) -> int:
    """The 63-bit seed of one sample's generator for one layer at one step (a hash, so
    nearby ids or steps give unrelated streams)."""
    digest = hashlib.blake2b(f"{seed}/{step}/{sample_id}/{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def current() -> SampleContext:
    """The enclosing `sample_randomness` block's context; a clear error outside one."""
    ctx = _CURRENT.get()
    if ctx is None:
        raise RuntimeError(
            "a per-sample random layer ran outside `with trainer.sample_randomness(seed, "
            "step, sample_ids):`; wrap the training forward pass in it (or call "
            "model.eval() for inference)"
        )
    return ctx


class SampleDropout(nn.Module):
    """Dropout whose mask for each sample depends only on (seed, step, sample id, key).

    A drop-in for `nn.Dropout(p)` in training code that runs its forward passes inside
    `sample_randomness(...)`; `key` names the call site (unique per layer). In eval mode
    it is the identity, as `nn.Dropout` is."""

    def __init__(self, p: float, *, key: str) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        if not key:
            raise ValueError("SampleDropout needs a key naming its call site")
        self.p, self.key = p, key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        ctx = current()
        if x.shape[0] != len(ctx.sample_ids):
            raise ValueError(
                f"SampleDropout {self.key!r}: the input has {x.shape[0]} rows but the "
                f"sample_randomness block names {len(ctx.sample_ids)} samples"
            )
        keep = torch.empty(x.shape, dtype=torch.float32)
        gen = torch.Generator()
        for row, sample_id in enumerate(ctx.sample_ids):
            gen.manual_seed(sample_seed(ctx.seed, ctx.step, sample_id, self.key))
            keep[row].uniform_(generator=gen)
        mask = (keep >= self.p).to(device=x.device, dtype=x.dtype)
        return x * mask / (1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}, key={self.key!r}"
