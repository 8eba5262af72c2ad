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
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from trainer.errors import StoreUnavailable
    from trainer.run import Run

FIRST_DELAY_S = 1.0
# At most this long between tries: how late the ranks may notice that the store is back.
# A try is one listing per rank, so trying every 2 s costs the store nothing; 15 s made
# the ranks of a long outage's attempts step again up to 15 s after it ended, 5 s still
# 2.5 s on average (fault campaign).
MAX_DELAY_S = 2.0


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


def pause_or_raise(run: Run, wait: OutageWait, exc: StoreUnavailable, while_: str) -> None:
    """The store is down (every rank agreed on ``exc``): wait one backoff, or re-raise
    ``exc`` on every rank once the budget is spent or a SIGTERM came (agreed too).
    ``while_`` says what the ranks were doing ("resuming", "starting")."""
    mine = wait.give_up() or run.flags.term
    if agreed_give_up(mine, run.ckpt_group, run.world_size):
        if wait.tries:
            run.log(f"checkpoint store still unreachable after {wait.waited():.1f}s"
                    f" (CB_STORE_WAIT_S={wait.budget_s:g}): exiting for the broker to wait")
        raise exc
    delay = wait.next_delay()
    wait.tries += 1
    run.progress.update(state="store_wait", store_wait_since=wait.since_wall,
                        store_wait_message=str(exc)[:300])
    why = f"unreachable while {while_} ({exc})" if wait.tries == 1 else "still unreachable"
    run.log(f"checkpoint store {why}; every rank waits {delay:.1f}s and tries again"
            f" (try {wait.tries}, {wait.waited():.0f}s of {wait.budget_s:g}s)")
    sleep_unless(delay, lambda: run.flags.term)
