"""One typed vocabulary for why a job stops, moves or is requeued.

Why enums with the old strings as values: the job record stores ``stop_reason``,
``requeue_cause`` and ``Migration.cause``/``state`` as strings, and jobs written by
an older broker (or read by an older CLI) must keep meaning the same thing. A
``str`` enum is both: code compares and switches on members, the store and the
wire keep the exact strings they always had, and each member carries its human
text (events, ``brokerctl``), its goodput bucket (metrics) and its proto enum.

Three enums, because they name three fields with different domains:

* :class:`Cause` - the specific reason (``Migration.cause``, event reasons): spot
  interruption, region drain, plan ending, preemption, loss, failure, ...
* :class:`Family` - the goodput bucket a cause charges (``Job.requeue_cause``):
  failure, preemption or migration.
* :class:`StopKind` - what a stop request asks the agent (``Job.stop_reason`` and
  ``Stop.reason`` on the wire): preempt, drain, migrate or cancel.

:class:`MoveState` is the ``Migration.state`` milestone vocabulary.
"""

from __future__ import annotations

import enum
from typing import TypeVar

from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb

E = TypeVar("E", bound=enum.StrEnum)


def _parse(cls: type[E], value: str) -> E | None:
    """The member whose value is ``value`` (a stored string), or None."""
    try:
        return cls(value) if value else None
    except ValueError:
        return None


class Family(enum.StrEnum):
    """Goodput bucket of lost or waiting time; stored in ``Job.requeue_cause``."""

    FAILURE = "failure"
    PREEMPTION = "preemption"
    MIGRATION = "migration"

    @property
    def goodput_field(self) -> str:
        """``Goodput.lost_<family>_s``."""
        return f"lost_{self.value}_s"

    @classmethod
    def parse(cls, value: str, default: Family | None = None) -> Family | None:
        """A stored ``requeue_cause`` or ``stop_reason`` string -> its family."""
        fam = _parse(cls, value)
        kind = _parse(StopKind, value)
        return fam or (kind.family if kind is not None else default)


class StopKind(enum.StrEnum):
    """What a stop asks; stored in ``Job.stop_reason`` while the stop is in flight."""

    PREEMPT = "preempt"
    DRAIN = "drain"
    MIGRATE = "migrate"
    CANCEL = "cancel"

    @property
    def family(self) -> Family:
        return Family.PREEMPTION if self is StopKind.PREEMPT else Family.MIGRATION

    @property
    def wire(self) -> int:
        """The agent-facing ``Stop.reason``."""
        return _STOP_WIRE[self]

    @property
    def event(self) -> str:
        """Event type of RUNNING -> CHECKPOINTING for this stop."""
        return _STOP_EVENT[self]

    @classmethod
    def parse(cls, value: str) -> StopKind | None:
        return _parse(cls, value)


_STOP_WIRE = {StopKind.PREEMPT: apb.STOP_REASON_PREEMPT, StopKind.DRAIN: apb.STOP_REASON_DRAIN,
              StopKind.MIGRATE: apb.STOP_REASON_MIGRATE, StopKind.CANCEL: apb.STOP_REASON_CANCEL}
_STOP_EVENT = {StopKind.PREEMPT: "preempted", StopKind.DRAIN: "draining",
               StopKind.MIGRATE: "migrating_out", StopKind.CANCEL: "cancel_requested"}


class Cause(enum.StrEnum):
    """The specific reason of a stop, move or requeue (``Migration.cause``, event reasons)."""

    SPOT_INTERRUPTION = "spot_interruption"
    REGION_DRAIN = "region_drain"
    PLAN_ENDING = "plan_ending"
    RECLAIM_LENT_QUOTA = "reclaim_lent_quota"
    HIGHER_PRIORITY = "higher_priority"
    PREEMPTED = "preempted"
    AGENT_LOST = "agent_lost"
    ATTEMPT_MISSING = "attempt_missing"
    LAUNCH_REFUSED = "launch_refused"
    ATTEMPT_FAILED = "auto_resume"
    STOPPED_BY_AGENT = "stopped_by_agent"
    HANG = "hang"
    NODE_UNHEALTHY = "node_unhealthy"
    BETTER_CAPACITY = "better_capacity"
    DEFRAGMENT = "defragment"
    GROW_BACK = "grow_back"
    USER_CANCEL = "user_cancel"

    @property
    def text(self) -> str:
        """Human text (CLI, events)."""
        return _TEXT[self]

    @property
    def emergency(self) -> bool:
        """No planned checkpoint: a reclaim deadline or a loss."""
        return self in _EMERGENCY

    @property
    def proto(self) -> int:
        return _PROTO_CAUSE.get(self, pb.MIGRATION_CAUSE_OTHER)

    @classmethod
    def parse(cls, value: str) -> Cause | None:
        return _parse(cls, value)


_TEXT = {
    Cause.SPOT_INTERRUPTION: "spot interruption notice",
    Cause.REGION_DRAIN: "region draining",
    Cause.PLAN_ENDING: "training plan ending",
    Cause.RECLAIM_LENT_QUOTA: "lent quota reclaimed by its owner",
    Cause.HIGHER_PRIORITY: "preempted by higher priority work",
    Cause.PREEMPTED: "preempted",
    Cause.AGENT_LOST: "region agent lost",
    Cause.ATTEMPT_MISSING: "attempt missing after the agent reconnected",
    Cause.LAUNCH_REFUSED: "agent refused the launch",
    Cause.ATTEMPT_FAILED: "attempt failed",
    Cause.STOPPED_BY_AGENT: "attempt stopped by the agent",
    Cause.HANG: "attempt made no progress",
    Cause.NODE_UNHEALTHY: "node became unhealthy",
    Cause.BETTER_CAPACITY: "cheaper or better capacity",
    Cause.DEFRAGMENT: "moved to free a block for a waiting gang",
    Cause.GROW_BACK: "capacity returned: relaunched at its requested size",
    Cause.USER_CANCEL: "cancelled by a user",
}
_EMERGENCY = frozenset({Cause.SPOT_INTERRUPTION, Cause.AGENT_LOST, Cause.ATTEMPT_MISSING})
_PROTO_CAUSE = {
    Cause.SPOT_INTERRUPTION: pb.MIGRATION_CAUSE_SPOT_INTERRUPTION,
    Cause.REGION_DRAIN: pb.MIGRATION_CAUSE_REGION_DRAIN,
    Cause.PLAN_ENDING: pb.MIGRATION_CAUSE_PLAN_ENDING,
    Cause.RECLAIM_LENT_QUOTA: pb.MIGRATION_CAUSE_PREEMPTED,
    Cause.HIGHER_PRIORITY: pb.MIGRATION_CAUSE_PREEMPTED,
    Cause.PREEMPTED: pb.MIGRATION_CAUSE_PREEMPTED,
    Cause.AGENT_LOST: pb.MIGRATION_CAUSE_AGENT_LOST,
    Cause.ATTEMPT_MISSING: pb.MIGRATION_CAUSE_ATTEMPT_MISSING,
    Cause.LAUNCH_REFUSED: pb.MIGRATION_CAUSE_LAUNCH_REFUSED,
    Cause.NODE_UNHEALTHY: pb.MIGRATION_CAUSE_NODE_UNHEALTHY,
    Cause.BETTER_CAPACITY: pb.MIGRATION_CAUSE_BETTER_CAPACITY,
}


def cause_text(value: str) -> str:
    """Human text of a stored cause string (unknown strings are shown as they are)."""
    c = Cause.parse(value)
    return c.text if c is not None else value.replace("_", " ")


class MoveState(enum.StrEnum):
    """``Migration.state`` milestones (see broker.jobs.migration)."""

    CHECKPOINTING = "checkpointing"
    QUEUED = "queued"
    LAUNCHING = "launching"
    TRANSFERRING = "transferring"
    STARTING = "starting"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def proto(self) -> int:
        return pb.MigrationState.Value(f"MIGRATION_STATE_{self.name}")

    @property
    def open(self) -> bool:
        return self not in (MoveState.DONE, MoveState.FAILED, MoveState.CANCELLED)
