"""Fencing: which commands an agent may obey (docs/contracts.md section 6, rule 5).

Why a separate, pure object: the attempt number is the fencing token that keeps
a partitioned agent from double-running a job, so its rules deserve their own
tests, free of threads and sockets.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    accepted: bool
    message: str = ""
    kill_attempt: int = 0  # an older attempt of the same job to kill first (0 = none)
    duplicate: bool = False  # the very same attempt is already running: ack, do nothing


class AttemptLedger:
    """Highest attempt seen per job, and the attempt running now (if any)."""

    def __init__(self) -> None:
        self.highest: dict[str, int] = {}
        self.running: dict[str, int] = {}

    def on_launch(self, job_id: str, attempt: int) -> Decision:
        seen = self.highest.get(job_id, 0)
        if attempt < seen:
            return Decision(False, f"stale attempt {attempt} for {job_id}: attempt {seen} already seen")
        current = self.running.get(job_id)
        if attempt == seen and current == attempt:
            return Decision(True, f"attempt {attempt} of {job_id} already running", duplicate=True)
        if attempt == seen and seen:
            return Decision(False, f"attempt {attempt} of {job_id} already ran here")
        return Decision(True, "", kill_attempt=current or 0)

    def on_stop(self, job_id: str, attempt: int) -> Decision:
        current = self.running.get(job_id)
        if current is None:
            return Decision(False, f"{job_id} is not running here")
        if current != attempt:
            return Decision(False, f"{job_id} runs attempt {current} here, not {attempt}")
        return Decision(True)

    def launched(self, job_id: str, attempt: int) -> None:
        self.highest[job_id] = max(attempt, self.highest.get(job_id, 0))
        self.running[job_id] = attempt

    def seen(self, job_id: str, attempt: int) -> None:
        """Record an attempt we learnt about without launching it (e.g. adopted)."""
        self.highest[job_id] = max(attempt, self.highest.get(job_id, 0))

    def finished(self, job_id: str, attempt: int) -> None:
        if self.running.get(job_id) == attempt:
            del self.running[job_id]
