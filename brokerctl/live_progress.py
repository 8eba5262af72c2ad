"""Live progress of one job for ``watch`` / ``submit --wait``: step/total, loss, region,
world size, folded from the job's event stream.

Why from events and not GetJob polling: the watch stream already carries progress
events (the broker writes one every ``progress_event_every_steps``, default 50), and the launch events carry the world
size of each attempt, so the line stays right across a resume (the total comes from the
job spec when a progress event omits it, and the step restarts from the checkpoint).
"""

from __future__ import annotations

from computebroker.v1 import common_pb2


class LiveProgress:
    """The fold of a job's events into what a person watching wants on one line."""

    def __init__(self, job: common_pb2.Job) -> None:
        self.total = job.progress.total_steps or (0 if job.spec.command
                                                  else job.spec.trainer.total_steps)
        self.step = job.progress.step
        self.loss = f"{job.progress.loss:.4f}" if job.progress.loss else "-"
        self.region = job.placement.region or "-"
        self.world_size = job.placement.world_size
        self.ranks = job.placement.ranks  # what really ran; 0 = not reported (GPUs shown)
        self.attempt = job.attempt
        self._bucket = -1

    def refresh(self, job: common_pb2.Job) -> None:
        """Fold in a fetched job (GetJob): the terminal's status line refreshes between the
        broker's progress events, which come only every N steps."""
        if job.progress.step >= self.step or job.attempt > self.attempt:
            self.step = job.progress.step
        self.total = job.progress.total_steps or self.total
        if job.progress.loss:
            self.loss = f"{job.progress.loss:.4f}"
        self.region = job.placement.region or self.region
        self.world_size = job.placement.world_size or self.world_size
        if job.attempt >= self.attempt:
            self.ranks = job.placement.ranks or (self.ranks if job.attempt == self.attempt else 0)
        self.attempt = max(self.attempt, job.attempt)

    def update(self, e: common_pb2.JobEvent) -> bool:
        """Fold one event in; True when a progress line is worth printing (a new tenth
        of the run, or the first step of a new attempt)."""
        d = e.details
        if e.region:
            self.region = e.region
        if e.attempt and e.attempt != self.attempt:
            self.attempt = e.attempt
            self._bucket = -1
            self.ranks = 0
        if e.type == "launched" and d.get("world_size", "").isdigit():
            self.world_size = int(d["world_size"])
        if e.type == "running" and d.get("ranks", "").isdigit():
            self.ranks = int(d["ranks"])
        if e.type != "progress":
            return False
        if d.get("step", "").isdigit():
            self.step = int(d["step"])
        if d.get("total_steps", "").isdigit() and int(d["total_steps"]) > 0:
            self.total = int(d["total_steps"])
        if d.get("loss") and float(d["loss"] or 0) > 0:
            self.loss = f"{float(d['loss']):.4f}"
        bucket = (10 * self.step // self.total) if self.total else self.step
        if self.step and bucket != self._bucket:
            self._bucket = bucket
            return True
        return False

    def text(self) -> str:
        total = f"/{self.total}" if self.total else ""
        ws = (f"{self.ranks} rank{'' if self.ranks == 1 else 's'}" if self.ranks
              else f"world {self.world_size}" if self.world_size else "world -")
        return (f"step {self.step}{total} · loss {self.loss} · {self.region} · {ws}"
                f" · attempt {self.attempt or '-'}")
