"""Read the trainer's progress file (docs/contracts.md section 2).

Why tolerant: rank 0 rewrites the file atomically, but a custom command might
not, and the file does not exist until the trainer's first step. A missing or
half-written file just means "nothing new"; it is never an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from checkpoint_layout.nofollow import read_small
from computebroker.v1 import agent_pb2, common_pb2


@dataclass(frozen=True)
class ProgressSnapshot:
    """One reading of the progress file."""

    state: str  # starting | running | checkpointing | done
    heartbeat: float  # trainer's last sign of life (epoch seconds)
    progress: common_pb2.Progress
    raw: dict

    def signature(self) -> tuple:
        """What counts as *new* progress (heartbeat-only refreshes do not)."""
        p = self.progress
        w = self.store_wait()
        return (self.state, p.step, p.samples_seen, p.last_checkpoint_step, p.last_checkpoint_uri,
                w.since if w is not None else 0.0)

    def store_wait(self) -> agent_pb2.RanksStoreWait | None:
        """The ranks' own wait for their checkpoint store (``store_wait_since``, written
        by trainer/outage_wait.py and trainer/checkpointer.py), None when they do not
        wait. Why the agent forwards it: a resume that waits looks like a slow start
        (LAUNCHING, step 0) otherwise, and a save that waits like nothing at all."""
        try:
            since = float(self.raw.get("store_wait_since") or 0.0)
        except (TypeError, ValueError):
            return None
        if since <= 0:
            return None
        msg = str(self.raw.get("store_wait_message") or "")[:300]
        return agent_pb2.RanksStoreWait(since=since, message=msg)


def read_progress(path: str) -> ProgressSnapshot | None:
    """Parse the progress file, or None if absent / unreadable / not a JSON object."""
    got = read_small(path)  # the job's file: no link, FIFO or device is opened
    if got is None:
        return None
    try:
        data = json.loads(got[0].decode("utf-8"))
    except ValueError:
        return None
    return parse_progress(data, got[1])


def parse_progress(data: object, mtime: float = 0.0) -> ProgressSnapshot | None:
    """The progress contract's JSON object (from the file, or as a Kubernetes pod
    publishes it in an annotation) as a snapshot; None if it is not an object."""
    if not isinstance(data, dict):
        return None

    def num(key: str, cast: type = float, default: float = 0) -> float:
        try:
            return cast(data.get(key) if data.get(key) is not None else default)
        except (TypeError, ValueError):
            return cast(default)

    updated = num("time") or mtime
    heartbeat = max(num("heartbeat") or 0.0, updated, mtime)
    progress = common_pb2.Progress(
        step=int(num("step", int)),
        total_steps=int(num("total_steps", int)),
        samples_seen=int(num("samples_seen", int)),
        loss=num("loss"),
        tokens_per_s=num("tokens_per_s"),
        last_checkpoint_step=int(num("last_checkpoint_step", int)),
        last_checkpoint_uri=str(data.get("last_checkpoint_uri") or ""),
        updated_time=updated,
        step_time=num("step_time"),
        resumed_time=num("resumed_time"),
    )
    tier = data.get("resume_tier")
    if tier in ("memory", "store"):  # the resume report (docs/contracts.md section 2)
        peers = data.get("restored_from_peer")
        progress.resume.tier = tier
        progress.resume.step = max(0, int(num("resumed_step", int)))
        if isinstance(peers, list):
            progress.resume.restored_from_peer.extend(
                int(r) for r in peers[:4096] if isinstance(r, int) and not isinstance(r, bool)
                and 0 <= r < 2**31)
        progress.resumed_from_world_size = min(2**31 - 1, max(0, int(num("resumed_from_world_size", int))))
        progress.world_size = min(2**31 - 1, max(0, int(num("world_size", int))))
    stages = data.get("startup")
    if isinstance(stages, dict):  # the ranks' start stages (trainer/startup.py)
        progress.startup.update({str(k)[:32]: float(v) for k, v in list(stages.items())[:16]
                                 if isinstance(v, (int, float)) and not isinstance(v, bool)
                                 and 0 <= v < 1e11})
    return ProgressSnapshot(
        state=str(data.get("state") or "running"), heartbeat=heartbeat, progress=progress, raw=data
    )
