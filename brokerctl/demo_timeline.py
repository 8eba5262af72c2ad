"""The demo's timeline: one line per event that tells the story, for every demo job.

Why a timeline and not only progress bars: the headline (a spot notice in one region,
an emergency checkpoint, a move to another region on a different world size, a resume
at the next unseen sample) is a sequence of events; bars redraw in place and hide it,
and they show nothing at all when the output is not a terminal (CI, ``| tee``). Each
line is cut to the console width, so it never wraps.

The data is the broker's own event history (ListJobEvents, read incrementally with
``after_seq``); the "next unseen sample" comes from the resumed checkpoint's manifest
(``samples_seen``: the data position the trainer saved, docs/contracts.md section 3).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.text import Text

from brokersdk.client import BrokerClient, BrokerError
from computebroker.v1 import common_pb2

# event type -> (label, style); types not listed are not shown.
LABELS: dict[str, tuple[str, str]] = {
    "admitted": ("placed", "cyan"),
    "launched": ("launched", "cyan"),
    "checkpoint": ("checkpoint", "dim"),
    "migrating_out": ("NOTICE", "bold magenta"),
    "migrating": ("stopped", "magenta"),
    "migration_completed": ("MOVED", "bold magenta"),
    "succeeded": ("succeeded", "bold green"),
    "failed": ("failed", "bold red"),
    "cancelled": ("cancelled", "dim"),
    "preempted": ("preempted", "yellow"),
}


def read_manifest(uri: str) -> dict | None:
    """The manifest of a checkpoint directory (local path, file:// or s3://), or None."""
    try:
        if uri.startswith("s3://"):
            from checkpoint_layout.s3 import make_s3_client  # the agents' S3 client setup

            bucket, _, key = uri.removeprefix("s3://").partition("/")
            body = make_s3_client(None).get_object(Bucket=bucket, Key=f"{key.rstrip('/')}/manifest.json")
            return json.loads(body["Body"].read())
        path = Path(uri.removeprefix("file://")) / "manifest.json"
        return json.loads(path.read_text())
    except Exception:  # the timeline is commentary: a missing manifest only drops a detail
        return None


@dataclass
class Timeline:
    """Prints new events of the demo's jobs, one line each, relative to the demo start."""

    client: BrokerClient
    console: Console
    t0: float
    names: dict[str, str]
    after: dict[str, int] = field(default_factory=dict)
    resumed: set[tuple[str, int]] = field(default_factory=set)
    width: Callable[[], int] | None = None

    def poll(self) -> None:
        for job_id in self.names:
            try:
                events = self.client.events(job_id, after_seq=self.after.get(job_id, 0))
            except BrokerError:
                continue
            for e in events:
                self.after[job_id] = max(self.after.get(job_id, 0), e.seq)
                line = self.line(job_id, e)
                if line is not None:
                    self.console.print(line, no_wrap=True, overflow="ellipsis", crop=True)

    def line(self, job_id: str, e: common_pb2.JobEvent) -> Text | None:
        name = self.names[job_id]
        if e.type == "progress":
            return self._resume_line(job_id, name, e)
        if e.type not in LABELS:
            return None
        label, style = LABELS[e.type]
        msg = self._message(job_id, e)
        if msg is None:
            return None
        t = Text()
        t.append(time.strftime("%H:%M:%S", time.localtime(e.time or time.time())), style="dim")
        t.append(f" +{max(0.0, (e.time or time.time()) - self.t0):5.1f}s ", style="dim")
        t.append(f"{name[:16]:<16} ", style="bold")
        t.append(f"{label:<10} ", style=style)
        t.append(msg)
        return t

    def _message(self, job_id: str, e: common_pb2.JobEvent) -> str | None:
        d = e.details
        if e.type == "admitted":
            tier = e.message.rsplit("; ", 1)[-1] if "; " in e.message else ""
            nodes = [n for n in d.get("nodes", "").split(",") if n]
            return f"{e.region}, {tier}, {len(nodes)} node(s)".replace(", , ", ", ")
        if e.type == "launched":
            ws = d.get("world_size", "?")
            if d.get("resume_from"):
                return (f"attempt {e.attempt}: {e.region}, world {ws}, from "
                        f"step-{self._step_of(d['resume_from'])} checkpoint")
            return None if e.attempt <= 1 else f"attempt {e.attempt}: {e.region}, world size {ws}"
        if e.type == "migrating_out":
            n = len([x for x in d.get("nodes", "").split(",") if x])
            return f"{n or 'its'} spot node(s) in {e.region} reclaimed: checkpoint, move"
        if e.type == "migrating":
            return f"attempt {e.attempt} stopped in {e.region}, checkpoint durable"
        if e.type == "checkpoint":
            return f"step {d.get('step', '?')} durable in {e.region}"
        if e.type == "migration_completed":
            ranks = d.get("ranks", "")
            size = (f"ranks {ranks.replace('->', ' → ')}" if ranks and "?" not in ranks
                    else f"world {d.get('world_size', '?').replace('->', ' → ')}")
            return (f"{d.get('from', '?').split('/')[0]} → {d.get('to', '?').split('/')[0]}, "
                    f"{size}, in "
                    f"{float(d.get('total_s', 0) or 0):.1f}s")
        if e.type == "succeeded":
            try:
                job = self.client.get_job(job_id)
            except BrokerError:
                return e.message
            return (f"{job.progress.step} steps in {job.placement.region or e.region}, "
                    f"final loss {job.progress.loss:.4f}")
        return e.message or e.reason

    @staticmethod
    def _step_of(uri: str) -> str:
        tail = uri.rstrip("/").rsplit("/", 1)[-1]
        return str(int(tail.removeprefix("step-"))) if tail.startswith("step-") else "?"

    def _resume_line(self, job_id: str, name: str, e: common_pb2.JobEvent) -> Text | None:
        """After a resume, the first step reported: where the data position continues."""
        key = (job_id, e.attempt)
        if e.attempt <= 1 or key in self.resumed or not int(e.details.get("step", "0") or 0):
            return None
        self.resumed.add(key)
        try:
            job = self.client.get_job(job_id)
        except BrokerError:
            return None
        migs = [m for m in job.migrations if m.to_attempt == e.attempt]
        if not migs:
            return None
        m = migs[-1]
        manifest = read_manifest(m.resume_from or m.checkpoint_uri) or {}
        seen = manifest.get("samples_seen")
        where = (f"from sample #{seen}, the next unseen"
                 if seen is not None else "from the checkpoint's data position")
        t = Text()
        t.append(time.strftime("%H:%M:%S", time.localtime(e.time or time.time())), style="dim")
        t.append(f" +{max(0.0, (e.time or time.time()) - self.t0):5.1f}s ", style="dim")
        t.append(f"{name[:16]:<16} ", style="bold")
        t.append(f"{'RESUMED':<10} ", style="bold green")
        size = f"ranks {m.to_ranks}" if m.to_ranks else f"world {m.to_world_size}"
        t.append(f"step {m.checkpoint_step + 1}, {size}: {where}")
        return t
