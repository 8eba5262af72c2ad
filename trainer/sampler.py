"""`ResumableSampler`: which samples each rank trains on, resumable on any world size.

Why not `torch.utils.data.DistributedSampler`: its order depends on the world size
(it deals indices round-robin over ranks) and it has no position to save, so a job
moved from 2 ranks to 1 would see different samples, and a resumed one would start
its epoch over. Here (MosaicML streaming's idea, see trainer/data.py):

* the global order is a permutation of `range(dataset_size)` fixed by `(seed, epoch)`,
  epochs laid end to end; global step `s` takes stream positions `[s*G, (s+1)*G)`;
* rank `r` of `W` takes a contiguous slice of those G ids, split into the same number
  of micro-batches on every rank (gradient accumulation keeps the global batch G
  whatever W is; a short rank gets empty micro-batches so collectives stay in step);
* the whole data position is one integer, `samples_seen`, saved in every checkpoint.

So a run stopped on 2 ranks and resumed on 1 (or 3) continues with exactly the next
unseen sample, and its losses match an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist

from trainer.data import GlobalOrder, micro_batches, rank_slice


@dataclasses.dataclass(frozen=True)
class StepBatch:
    """One global step's samples, seen from one rank.

    `micro` is this rank's ids in micro-batches (the same count on every rank; some may
    be empty). `scale` (= world_size / global_batch) turns a sum of per-sample losses
    into this rank's share of the *global* mean: `(per_sample.sum() * batch.scale)
    .backward()` then gives the same gradient on any world size (FSDP averages over ranks).
    """

    step: int  # 0-based global step these samples belong to
    ids: list[int]  # all G ids of the step, in order
    local: list[int]  # this rank's slice
    micro: list[list[int]]
    scale: float

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.micro)


class ResumableSampler:
    """World-size-independent, exactly resumable sample order (a torch `Stateful`).

    `next()` returns the next step's `StepBatch` and advances the position; register
    the sampler with `run.checkpointer(data=sampler)` and a resume restores it.
    """

    def __init__(
        self,
        dataset_size: int,
        *,
        global_batch: int,
        seed: int = 0,
        micro_batch: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        """`micro_batch`: samples per forward pass per rank (0 = the whole rank slice).
        `rank` / `world_size` default to the process group's (1 process without one)."""
        if dataset_size < 1 or global_batch < 1 or micro_batch < 0:
            raise ValueError("dataset_size and global_batch must be >= 1, micro_batch >= 0")
        self.dataset_size, self.global_batch, self.seed = dataset_size, global_batch, seed
        self.micro_batch = micro_batch
        inited = dist.is_available() and dist.is_initialized()
        self.rank = rank if rank is not None else (dist.get_rank() if inited else 0)
        self.world_size = (
            world_size if world_size is not None else (dist.get_world_size() if inited else 1)
        )
        self.samples_seen = 0
        self._order = GlobalOrder(seed, dataset_size, global_batch)

    @property
    def step(self) -> int:
        """Global steps consumed so far (the data position in steps)."""
        return self.samples_seen // self.global_batch

    @property
    def epoch(self) -> float:
        return self.samples_seen / self.dataset_size

    @property
    def micro_steps(self) -> int:
        """Micro-batches per rank per step (gradient accumulation), equal on all ranks."""
        per_rank = math.ceil(self.global_batch / self.world_size)
        micro = min(self.micro_batch or per_rank, max(1, per_rank))
        return max(1, math.ceil(per_rank / micro))

    def peek(self) -> StepBatch:
        """The next step's samples, without advancing."""
        ids = self._order.ids_at(self.samples_seen, self.global_batch)
        local = rank_slice(ids, self.rank, self.world_size)
        per_rank = math.ceil(self.global_batch / self.world_size)
        micro = min(self.micro_batch or per_rank, max(1, per_rank))
        return StepBatch(
            step=self.step,
            ids=ids,
            local=local,
            micro=micro_batches(local, micro, self.micro_steps),
            scale=self.world_size / self.global_batch,
        )

    def next(self) -> StepBatch:
        """The next step's samples; advances the position by one global batch."""
        batch = self.peek()
        self.samples_seen += self.global_batch
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {
            "samples_seen": self.samples_seen,
            "seed": self.seed,
            "dataset_size": self.dataset_size,
            "global_batch": self.global_batch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the position. The order must be the same one: a different seed,
        dataset size or global batch would silently train on other samples."""
        for key in ("seed", "dataset_size", "global_batch"):
            if int(state[key]) != getattr(self, key):
                from trainer.errors import TrainerError

                raise TrainerError(
                    f"the checkpoint's data order has {key}={state[key]} but this run has "
                    f"{getattr(self, key)}; resume with the same value or a new checkpoint URI"
                )
        self.samples_seen = int(state["samples_seen"])
