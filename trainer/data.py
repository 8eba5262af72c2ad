"""Deterministic, world-size-independent data order (MosaicML streaming's idea).

* Sample `i` is a pure function of `(seed, i)`: a synthetic token sequence with a
  learnable pattern (an arithmetic progression mod vocab, plus a little noise).
* The global order is a permutation of `range(dataset_size)` fixed by `(seed, epoch)`;
  epochs are laid end to end into one infinite stream of sample ids.
* Global step `s` (0-based) consumes stream positions `[s*G, (s+1)*G)`, G = global batch,
  whatever the world size; rank `r` takes a contiguous slice of those G ids.
So the data position is fully described by `samples_seen = step * G`, which is all a
checkpoint needs to store, and a resumed run on any world size continues with exactly
the next unseen sample (torchtitan's loader refuses a changed DP degree; ours does not).
"""

from __future__ import annotations

import hashlib

import torch

_MASK64 = (1 << 64) - 1


def _mix(*parts: int) -> int:
    """Stable 63-bit seed from integers (Python's hash() is salted per process)."""
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(int(p).to_bytes(16, "little", signed=True))
    return int.from_bytes(h.digest(), "little") & (_MASK64 >> 1)


class SyntheticTokens:
    """Sample i = seq_len+1 tokens, a pure function of (seed, i)."""

    def __init__(self, seed: int, vocab_size: int, seq_len: int) -> None:
        self.seed, self.vocab, self.seq_len = seed, vocab_size, seq_len

    def sample(self, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(_mix(self.seed, 1, i))
        n = self.seq_len + 1
        start = int(torch.randint(self.vocab, (1,), generator=g))
        stride = int(torch.randint(1, 4, (1,), generator=g))
        seq = (start + stride * torch.arange(n)) % self.vocab
        noise = torch.rand(n, generator=g) < 0.1
        seq[noise] = torch.randint(self.vocab, (int(noise.sum()),), generator=g)
        return seq

    def batch(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        seqs = torch.stack([self.sample(i) for i in ids])
        return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()


class GlobalOrder:
    """Sample ids for each global step; depends on (seed, dataset_size, G) only."""

    def __init__(self, seed: int, dataset_size: int, global_batch_size: int) -> None:
        self.seed, self.n, self.g = seed, dataset_size, global_batch_size
        self._epoch = -1
        self._perm: list[int] = []

    def _perm_for(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            gen = torch.Generator().manual_seed(_mix(self.seed, 2, epoch))
            self._perm = torch.randperm(self.n, generator=gen).tolist()
            self._epoch = epoch
        return self._perm

    def ids_at(self, position: int, count: int) -> list[int]:
        """Sample ids at stream positions [position, position+count); position = samples_seen."""
        return [self._perm_for(p // self.n)[p % self.n] for p in range(position, position + count)]

    def step_ids(self, step: int) -> list[int]:
        """Global sample ids of 0-based global step `step`."""
        return self.ids_at(step * self.g, self.g)


def rank_slice(ids: list[int], rank: int, world_size: int) -> list[int]:
    """Contiguous, as-even-as-possible slice (the first G % W ranks get one extra)."""
    base, extra = divmod(len(ids), world_size)
    start = rank * base + min(rank, extra)
    return ids[start : start + base + (1 if rank < extra else 0)]


def micro_batches(ids: list[int], micro: int, count: int) -> list[list[int]]:
    """Split into exactly `count` micro-batches (some may be empty) so ranks stay in lockstep."""
    return [ids[i * micro : (i + 1) * micro] for i in range(count)]
