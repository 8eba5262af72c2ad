"""The executor interface the agent drives, whatever runs the ranks.

Why an interface: the agent's stream logic (fencing, acks, reconnect) is the same
for local processes and Kubernetes Jobs; only "start these ranks", "signal them"
and "what happened since I last looked" differ. ``poll()`` is pull-based so the
agent owns threading and rate limits in one place.
"""

from __future__ import annotations

import abc
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from checkpoint_layout.standby_go import Go
from checkpoint_layout.workdir_store import EXIT_WORKDIR_REFUSED as _WORKDIR_REFUSED
from computebroker.v1 import agent_pb2, common_pb2
from region_agents.logship import LogSource

AS = agent_pb2.AttemptState
TERMINAL_STATES = frozenset(
    {
        AS.ATTEMPT_STATE_SUCCEEDED,
        AS.ATTEMPT_STATE_FAILED,
        AS.ATTEMPT_STATE_CHECKPOINTED,
        AS.ATTEMPT_STATE_STOPPED,
    }
)

# Trainer exit codes (docs/contracts.md section 1).
EXIT_OK = 0
EXIT_CHECKPOINTED = 75
EXIT_BAD_CONFIG = 2
# The resume checkpoint is gone or incomplete (the trainer found it so, or the agent
# could not resolve it): retryable, and no node is to blame.
EXIT_RESUME_UNAVAILABLE = 77
EXIT_AGENT_LEASE_EXPIRED = 78  # the ranks stopped: their agent lost its broker (trainer/agent_lease.py)
EXIT_STORAGE_FAILED = 79  # a checkpoint save failed after retries: the store, not the node
EXIT_RENDEZVOUS_PORT_TAKEN = 80  # MASTER_PORT was taken before rank 0 listened: no one's fault
EXIT_STORE_UNAVAILABLE = 81  # the checkpoint store is down (checkpoint_layout/faults.py)
# A pod could not fetch, verify or unpack the job's workdir (checkpoint_layout/workdir_store.py)
EXIT_WORKDIR_REFUSED = _WORKDIR_REFUSED
NOT_THE_NODE = frozenset({EXIT_BAD_CONFIG, EXIT_RESUME_UNAVAILABLE, EXIT_AGENT_LEASE_EXPIRED,
                          EXIT_STORAGE_FAILED, EXIT_RENDEZVOUS_PORT_TAKEN,
                          EXIT_STORE_UNAVAILABLE, EXIT_WORKDIR_REFUSED})  # exits that blame no node


@dataclass
class AttemptSpec:
    """Everything needed to start one attempt (a ``Launch`` command, unpacked)."""

    job_id: str
    attempt: int
    spec: common_pb2.JobSpec
    placement: common_pb2.Placement
    checkpoint_uri: str = ""
    resume_from: str = ""
    env: dict[str, str] = field(default_factory=dict)
    workdir_tar: str = ""  # the job's verified workdir tarball on this host (agent's cache)
    workdir_size: int = 0  # its size in bytes (what a pod checks its copy against)
    standby: bool = False  # make-before-break: hold the ranks before their first step (Go)
    spare_nodes: tuple[str, ...] = ()  # its pool's spares at admission (Launch.spare_nodes)

    @classmethod
    def from_launch(cls, launch: agent_pb2.Launch) -> AttemptSpec:
        return cls(
            job_id=launch.job_id,
            attempt=launch.attempt,
            spec=launch.spec,
            placement=launch.placement,
            checkpoint_uri=launch.checkpoint_uri,
            resume_from=launch.resume_from,
            env=dict(launch.env),
            standby=launch.standby,
            spare_nodes=tuple(launch.spare_nodes),
        )

    def node_ids(self) -> list[str]:
        return [n.node_id for n in self.placement.nodes]


@dataclass
class AttemptEvent:
    """A state change or a progress report of one attempt (becomes a ``JobUpdate``)."""

    job_id: str
    attempt: int
    state: int
    progress: common_pb2.Progress | None = None
    exit_code: int = 0
    message: str = ""
    failed_nodes: list[str] = field(default_factory=list)
    time: float = field(default_factory=time.time)
    # The ranks wait for their checkpoint store (ProgressSnapshot.store_wait); None = not.
    store_wait: agent_pb2.RanksStoreWait | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def to_proto(self) -> agent_pb2.JobUpdate:
        upd = agent_pb2.JobUpdate(
            job_id=self.job_id,
            attempt=self.attempt,
            state=self.state,
            exit_code=self.exit_code,
            message=self.message,
            failed_nodes=self.failed_nodes,
            time=self.time,
        )
        if self.progress is not None:
            upd.progress.CopyFrom(self.progress)
        if self.store_wait is not None and not self.terminal:
            upd.store_wait.CopyFrom(self.store_wait)
        return upd


@dataclass
class RunningInfo:
    """What an attempt is doing now (for Register / Heartbeat ``running`` lists)."""

    job_id: str
    attempt: int
    state: int
    progress: common_pb2.Progress | None = None
    node_ids: list[str] = field(default_factory=list)

    def to_proto(self) -> agent_pb2.RunningAttempt:
        ra = agent_pb2.RunningAttempt(job_id=self.job_id, attempt=self.attempt, state=self.state)
        if self.progress is not None:
            ra.progress.CopyFrom(self.progress)
        return ra


def trainer_config_json(trainer: common_pb2.TrainerSpec) -> str:
    """``CB_TRAINER_CONFIG``: the TrainerSpec fields as one JSON object (contract 1)."""
    return json.dumps(
        {
            "total_steps": int(trainer.total_steps),
            "checkpoint_every": int(trainer.checkpoint_every),
            "global_batch_size": int(trainer.global_batch_size),
            "seed": int(trainer.seed),
            "model": trainer.model,
            "step_sleep_s": float(trainer.step_sleep_s),
            "options": dict(trainer.options),
        },
        sort_keys=True,
    )


class Executor(abc.ABC):
    """Runs attempts. All methods are called from the agent with its lock held."""

    name: str = "abstract"

    @abc.abstractmethod
    def launch(self, spec: AttemptSpec) -> None:
        """Start all ranks of an attempt (raise ``ValueError`` for a bad spec)."""

    def prepare(self, spec: AttemptSpec) -> None:
        """Before anything is staged for the attempt: make its local directories for the
        identity its ranks run as (local executor). ``ValueError`` refuses the launch."""
        return None

    supports_standby = False  # make-before-break standby attempts (Launch.standby, Go)
    # The ranks cannot read the agent's workdir cache (pods on other machines): the agent
    # calls stage_workdir for every attempt with a workdir, cached or not.
    ships_workdir = False

    def stage_workdir(self, spec: AttemptSpec, tar: str) -> None:
        """Put the attempt's verified workdir tarball ``tar`` where its ranks will read it.
        Called in the attempt's staging thread, *without* the agent's lock (it may copy
        megabytes), before ``launch``; an exception fails the attempt with its message.
        Only for executors with ``ships_workdir`` (the local one unpacks at launch)."""
        return None

    def ranks(self, spec: AttemptSpec) -> int:
        """How many ranks ``launch(spec)`` starts (the trainer's world size), reported to
        the broker in every JobUpdate: the GPU count placed is not always the rank count,
        and an elastic move's headline is the rank count. 0 = unknown."""
        return 0

    def go(self, job_id: str, attempt: int, go: Go) -> None:
        """Release (or abort) a standby attempt held before its first step."""
        raise NotImplementedError(f"{type(self).__name__} does not run standby attempts")

    def parked(self, job_id: str, attempt: int) -> bool | None:
        """Is this standby attempt started and parked before its first step (progress
        state ``standby``)? None when it no longer runs here (or cannot be known)."""
        return None

    @abc.abstractmethod
    def stop(self, job_id: str, attempt: int, checkpoint_first: bool, grace_s: float) -> None:
        """checkpoint_first: SIGTERM (trainer checkpoints, exits 75), SIGKILL after
        grace_s; else SIGKILL now. The terminal state comes out of ``poll()``."""

    @abc.abstractmethod
    def checkpoint(self, job_id: str, attempt: int) -> None:
        """Ask the ranks for a checkpoint at the next step boundary (SIGUSR1)."""

    @abc.abstractmethod
    def fail(self, job_id: str, attempt: int, message: str, failed_nodes: list[str]) -> None:
        """Kill an attempt and report it FAILED (e.g. one of its nodes went unhealthy)."""

    @abc.abstractmethod
    def poll(self) -> list[AttemptEvent]:
        """State changes and progress since the last call (oldest first)."""

    @abc.abstractmethod
    def running(self) -> list[RunningInfo]:
        """Attempts that have not reached a terminal state."""

    def log_sources(self, job_id: str, attempt: int) -> list[LogSource]:
        """Files holding each rank's stdout/stderr (shipped to the broker by
        region_agents/logship.py); [] = this executor's output is not shipped."""
        return []

    @abc.abstractmethod
    def shutdown(self, grace_s: float = 0.0) -> None:
        """Stop everything (checkpoint-first when grace_s > 0) and release resources."""

    # ---- restart safety (optional; the local executor implements them) --------------
    def recover(self) -> list[AttemptEvent]:  # noqa: B027 - optional hook
        """After an agent restart: re-adopt surviving attempts (``running()`` then lists
        them) and return finished outcomes the broker has not acknowledged yet."""
        return []

    def known_attempts(self) -> dict[str, int]:
        """Highest attempt per job this executor has durable knowledge of."""
        return {}

    def notify_log_writes(self, fn: Callable[[str, int], None]) -> bool:
        """Ask to be told ``fn(job_id, attempt)`` whenever an attempt's rank files (its
        ``log_sources``) grow; True if this executor can. Why: the agent's log shipper
        then looks at an attempt's files only when they grew, instead of a ``stat`` of
        every rank's files of every attempt each second (at 2,500 attempts, about half
        of a Kubernetes agent's steady CPU). False (the default): ranks write the files
        themselves, and only looking tells."""
        return False

    def acknowledged(self, job_id: str, attempt: int) -> None:  # noqa: B027 - optional hook
        """The broker committed this attempt's terminal update."""
