"""Make-before-break handoff: which checkpoint a standby destination resumes from.

Why a pure function of its own: the go is the one decision that makes make-before-break
safe, so it is made in one place, from data, and tested as a table. The destination
attempt was started early (trainer/standby.py) and waits; it may only take its first
step once the source attempt is *fenced* (exited after its final save, failed, or
declared lost and told to stop), and it must resume from a checkpoint that is complete:

* the source ended CHECKPOINTED -> go from its final checkpoint (the one the trainer
  reported durable with its exit), else from the newest durable one we know;
* the source FAILED or was LOST -> its final save is not to be trusted: go from the
  newest checkpoint reported durable before (a periodic one), or from scratch when there
  is none (the job starts over, as a relaunch would; nothing is lost twice);
* the source is still RUNNING (no end reported yet) -> no decision: keep waiting. A go
  is never given before the fence; the caller tears the standby down (ABORT) when the
  move is called off (the source finished, the job was cancelled).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class SourceEnd(enum.Enum):
    """How the source attempt of a move ended, as far as the decider knows."""

    RUNNING = "running"  # not fenced yet: the standby must keep waiting
    CHECKPOINTED = "checkpointed"  # exit 75 after its final checkpoint became durable
    FAILED = "failed"  # the final save (or the process) failed
    LOST = "lost"  # agent or attempt lost; fenced by the broker (STALE_ATTEMPT)
    FINISHED = "finished"  # the job ended at the source (done or cancelled): no move


class GoAction(enum.Enum):
    """What the standby is told (the same words as trainer/standby.py's go file)."""

    WAIT = "wait"
    GO = "go"
    ABORT = "abort"


@dataclass(frozen=True)
class Handoff:
    action: GoAction
    resume_from: str = ""
    reason: str = ""


def decide(end: SourceEnd, *, final_uri: str, durable_uri: str) -> Handoff:
    """``final_uri``: the checkpoint the source reported with its end ("" if none);
    ``durable_uri``: the newest checkpoint reported durable before (may equal it)."""
    if end is SourceEnd.RUNNING:
        return Handoff(GoAction.WAIT, reason="source attempt not fenced yet")
    if end is SourceEnd.FINISHED:
        return Handoff(GoAction.ABORT, reason="the job ended at the source; move called off")
    if end is SourceEnd.CHECKPOINTED and (final_uri or durable_uri):
        return Handoff(GoAction.GO, final_uri or durable_uri, "final checkpoint durable")
    if durable_uri:
        return Handoff(GoAction.GO, durable_uri,
                       f"source {end.value} without its final checkpoint: newest durable one")
    return Handoff(GoAction.GO, "", f"source {end.value} and no durable checkpoint: from scratch")
