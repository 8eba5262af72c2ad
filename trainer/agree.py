"""Ranks agree on how a store-touching step ended, so none is left alone in a collective.

Why: a resume reads the checkpoint store on every rank (listing, manifest, shards) and on
rank 0 alone (removing a previous attempt's incomplete saves). When the store went down
between two of those reads, one rank raised StoreUnavailable and exited 81 while its
peers sat in the next barrier, which gloo then broke ("Connection closed by peer"): three
rank tracebacks, a crash counted, in one run of the fault campaign's s3_refused kind.

:func:`agree` is the one collective each such step ends with: every rank contributes how
*it* ended (an :class:`Outcome`), one ``all_reduce(MAX)`` picks the most serious, and every
rank raises that same kind of error with the reporting rank's message. The order of
:class:`Outcome` is the decision: a crash outranks a bad checkpoint, which outranks a
missing one, which outranks an outage (a rank that read a corrupt file must not have the
job wait for a store that one of its peers merely found slow).
"""

from __future__ import annotations

import enum
from typing import Any

import torch
import torch.distributed as dist

from checkpoint_layout.faults import describe, is_outage
from trainer.errors import PeerCrashed, ResumeUnavailable, StoreUnavailable, TrainerError


class Outcome(enum.IntEnum):
    """How one rank's step ended; higher wins the agreement."""

    OK = 0
    OUTAGE = 1  # StoreUnavailable: the job waits for the store (exit 81)
    RESUME_UNAVAILABLE = 2  # the checkpoint is gone (exit 77, relaunched)
    CONFIG = 3  # TrainerError: bad checkpoint or config (exit 2)
    CRASH = 4  # anything else: a bug, a traceback (exit 1)


_RAISES: dict[Outcome, type[Exception]] = {
    Outcome.OUTAGE: StoreUnavailable,
    Outcome.RESUME_UNAVAILABLE: ResumeUnavailable,
    Outcome.CONFIG: TrainerError,
}


def outcome_of(exc: BaseException | None) -> Outcome:
    """Which :class:`Outcome` ``exc`` is (None = OK). A raw store error that the fault
    table calls an outage counts as one, wherever it came from."""
    if exc is None:
        return Outcome.OK
    if isinstance(exc, StoreUnavailable) or is_outage(exc):
        return Outcome.OUTAGE
    if isinstance(exc, ResumeUnavailable):
        return Outcome.RESUME_UNAVAILABLE
    if isinstance(exc, TrainerError):
        return Outcome.CONFIG
    return Outcome.CRASH


def _message(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    if isinstance(exc, (StoreUnavailable, ResumeUnavailable, TrainerError)):
        return str(exc)
    if is_outage(exc):
        return f"checkpoint store unreachable: {describe(exc)}"
    return f"{type(exc).__name__}: {describe(exc)}"


def agree(exc: BaseException | None, group: Any = None, world_size: int = 1) -> None:
    """End a store-touching step on every rank the same way: return on all ranks if none
    failed, else raise the most serious failure on all of them.

    Call it on every rank at the same point, with the exception this rank caught (None
    if its part went well). The rank that failed re-raises its own exception (its
    traceback, for a crash); the others raise the same kind with its message and
    "(reported by rank N)". One all_reduce when all went well; an all_gather of the
    messages only on failure."""
    mine = outcome_of(exc)
    if world_size > 1 and dist.is_initialized():
        flag = torch.tensor([int(mine)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        agreed = Outcome(int(flag.item()))
        if agreed is Outcome.OK:
            return
        msgs: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(msgs, (int(mine), _message(exc)), group=group)
    else:
        agreed, msgs = mine, [(int(mine), _message(exc))]
        if agreed is Outcome.OK:
            return
    if mine is agreed and exc is not None:
        if isinstance(exc, (StoreUnavailable, ResumeUnavailable, TrainerError)) or (
                mine is Outcome.CRASH):
            raise exc
        raise StoreUnavailable(_message(exc)) from None  # a raw outage error: say it as one
    rank, msg = next((r, m) for r, (o, m) in enumerate(msgs) if o == int(agreed))
    text = f"{msg} (reported by rank {rank})"
    raise _RAISES.get(agreed, PeerCrashed)(text) from None
