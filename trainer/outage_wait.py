"""The ranks of an attempt wait out a store outage together while they resume.

Why in the attempt: a store that refuses connections for half a minute while an attempt
loads its checkpoint used to end the attempt (exit 81) on the rank that saw it first;
the broker then backed off and relaunched, and ranks, model build and rendezvous were
paid again. Waiting here, bounded by ``CB_STORE_WAIT_S`` (which the broker derives from
the job's store-wait budget, broker/jobs/store_wait.py), costs nothing but the wait;
past it the ranks exit 81 together and the broker's wait takes over (a region whose
store stays down is left out, the job may move). The decision to give up is agreed
(one all_reduce), so no rank retries while another has left.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

FIRST_DELAY_S = 1.0
MAX_DELAY_S = 15.0


@dataclass
class OutageWait:
    """One resume's wait: since when, how many tries, how long it may last."""

    budget_s: float
    since: float = field(default_factory=time.monotonic)
    since_wall: float = field(default_factory=time.time)
    tries: int = 0

    def waited(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.since

    def give_up(self, now: float | None = None) -> bool:
        """This rank's view: the budget is spent (0 = never wait)."""
        return self.waited(now) >= self.budget_s

    def next_delay(self, now: float | None = None) -> float:
        """Exponential from FIRST_DELAY_S, capped at MAX_DELAY_S and at what is left."""
        delay = min(FIRST_DELAY_S * 2 ** self.tries, MAX_DELAY_S)
        return max(0.0, min(delay, self.budget_s - self.waited(now)))


def agreed_give_up(mine: bool, group: Any, world_size: int) -> bool:
    """True on every rank if any rank gives up (one all_reduce MAX)."""
    if world_size <= 1 or not dist.is_initialized():
        return mine
    flag = torch.tensor([int(mine)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return bool(flag.item())


def sleep_unless(seconds: float, stop: Callable[[], bool], tick: float = 0.2) -> None:
    """Sleep ``seconds``, ending early once ``stop()`` (a SIGTERM) is true."""
    end = time.monotonic() + seconds
    while not stop():
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(tick, left))
