"""JobHandle: a submitted job to wait on, follow, cancel or read the logs of."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import grpc

from brokersdk.enums import TERMINAL_PHASES, phase_name
from brokersdk.errors import BrokerError
from computebroker.v1 import common_pb2, logs_pb2

if TYPE_CHECKING:
    from brokersdk.client import BrokerClient


class JobHandle:
    """A submitted job. Cheap: holds only the id and the last known state."""

    def __init__(
        self,
        client: BrokerClient,
        job_id: str,
        job: common_pb2.Job | None = None,
        created: bool | None = None,
    ) -> None:
        self.client = client
        self.id = job_id
        self.job = job
        self.created = created

    def __repr__(self) -> str:
        phase = phase_name(self.job.phase) if self.job is not None else "?"
        return f"JobHandle({self.id!r}, phase={phase!r})"

    def status(self) -> common_pb2.Job:
        """Fetch the job now (GetJob)."""
        self.job = self.client.get_job(self.id)
        return self.job

    @property
    def phase(self) -> str:
        """The phase name of the last fetched state (e.g. "running")."""
        return phase_name((self.job or self.status()).phase)

    def wait(self, timeout: float | None = None, poll: float = 1.0) -> common_pb2.Job:
        """Block until the job is terminal and return it; TimeoutError after ``timeout`` s.

        Follows the WatchJob stream (no polling load on the broker); falls back to
        polling GetJob every ``poll`` seconds if the broker does not offer WatchJob.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        job = self.status()
        if job.phase in TERMINAL_PHASES:
            return job
        try:
            remaining = None if deadline is None else max(0.001, deadline - time.monotonic())
            for event in self.client.watch(self.id, timeout=remaining):
                if event.to_phase in TERMINAL_PHASES:
                    break
        except BrokerError as e:
            if e.code is not grpc.StatusCode.UNIMPLEMENTED:
                raise
        # The stream ends at a terminal phase; confirm (and poll if it was unavailable).
        while True:
            job = self.status()
            if job.phase in TERMINAL_PHASES:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"job {self.id} still {phase_name(job.phase)} after {timeout:.0f}s"
                )
            time.sleep(poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic())))

    def events(
        self, follow: bool = True, include_progress: bool = False, after_seq: int = 0
    ) -> Iterator[common_pb2.JobEvent]:
        """The job's events: history then live ones until terminal (``follow``),
        or just the recorded history."""
        if follow:
            yield from self.client.watch(
                self.id, after_seq=after_seq, include_progress=include_progress
            )
        else:
            yield from self.client.events(self.id, after_seq=after_seq)

    def cancel(self, reason: str = "") -> common_pb2.Job:
        self.job = self.client.cancel(self.id, reason)
        return self.job

    def logs(
        self,
        follow: bool = False,
        rank: int | None = None,
        attempt: int | None = None,
        tail: int | None = None,
    ) -> Iterator[logs_pb2.LogRecord]:
        """The ranks' output, attempt by attempt (see :meth:`BrokerClient.logs`)."""
        return self.client.logs(self.id, follow=follow, rank=rank, attempt=attempt, tail=tail)
