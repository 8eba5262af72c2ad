"""Pure placement and task-governance decisions.

No I/O and nothing of ours imported: the broker builds a :class:`Snapshot`,
calls :func:`schedule`, and applies the returned :class:`Decisions` (Kueue's
snapshot / decide / apply split). Same input, same output.
"""

from placement.model import (
    Admission,
    CapacityType,
    Decisions,
    JobRequest,
    NodeInfo,
    Preemption,
    Reservation,
    RunningJob,
    Snapshot,
    TeamQuota,
    TopologyLevel,
)
from placement.quota import ResourceUsage, TeamUsage, team_usage
from placement.scheduler import schedule

__all__ = [
    "Admission",
    "CapacityType",
    "Decisions",
    "JobRequest",
    "NodeInfo",
    "Preemption",
    "Reservation",
    "ResourceUsage",
    "RunningJob",
    "Snapshot",
    "TeamQuota",
    "TeamUsage",
    "TopologyLevel",
    "schedule",
    "team_usage",
]
