"""The input and output types of the placement engine.

Plain frozen dataclasses (not protobuf) on purpose: ``placement`` imports nothing
of ours, so it can be tested, benchmarked and reasoned about without the API.
The broker converts its state into these (``broker/scheduling/snapshot.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class CapacityType(IntEnum):
    """Mirrors computebroker.v1.CapacityType (same numbers)."""

    UNSPECIFIED = 0
    ON_DEMAND = 1
    SPOT = 2
    TRAINING_PLAN = 3
    RESERVED = 4


class TopologyLevel(IntEnum):
    """Mirrors computebroker.v1.TopologyLevel: smaller = tighter domain."""

    NONE = 0
    ULTRASERVER = 1
    LAYER_3 = 2
    LAYER_2 = 3
    LAYER_1 = 4
    ZONE = 5
    REGION = 6


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One schedulable node. ``agent_id`` is the cluster it belongs to: a gang
    never spans two agents (and so never two regions)."""

    id: str
    agent_id: str
    region: str
    zone: str
    gpus: int
    accelerator: str = ""
    instance_type: str = ""
    layer1: str = ""
    layer2: str = ""
    layer3: str = ""
    ultraserver: str = ""
    capacity_type: CapacityType = CapacityType.ON_DEMAND
    pool: str = ""
    price_per_gpu_hour: float = 0.0
    interruption_risk: float = 0.0
    healthy: bool = True
    cordoned: bool = False
    # Training-plan nodes exist only inside [plan_start, plan_end).
    plan_start: float | None = None
    plan_end: float | None = None
    # A scheduled plan's instances already up before plan_start (provisioned early or
    # kept from a previous window): the engine may backfill them before the start, but
    # only with work that checkpoints or finishes before plan_start. False = the node
    # does not exist before plan_start.
    available_before_plan: bool = False


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A pending job, in queue order (the broker orders by priority, then submit time)."""

    id: str
    team: str
    priority: int
    nodes: int
    gpus_per_node: int
    accelerator: str = ""
    required: TopologyLevel = TopologyLevel.NONE
    preferred: TopologyLevel = TopologyLevel.NONE
    allowed_regions: frozenset[str] = frozenset()
    denied_regions: frozenset[str] = frozenset()
    preferred_regions: tuple[str, ...] = ()
    dataset_region: str = ""
    # Empty = anything but SPOT (spot must be asked for).
    capacity_types: frozenset[CapacityType] = frozenset()
    max_price_per_gpu_hour: float = 0.0
    min_nodes: int = 0  # elastic range; 0 = exactly `nodes`
    max_nodes: int = 0
    submit_time: float = 0.0
    expected_duration_s: float = 0.0
    # Seconds until the job could take its next durable checkpoint from a fresh start
    # (used for training-plan windows); 0 = unknown.
    checkpoint_interval_s: float = 0.0
    excluded_nodes: frozenset[str] = frozenset()

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job holding GPUs now (admitted, launching, running or checkpointing)."""

    id: str
    team: str
    priority: int
    allocations: tuple[tuple[str, int], ...]  # (node_id, gpus)
    accelerator: str = ""
    started_time: float = 0.0
    last_checkpoint_time: float = 0.0  # last durable checkpoint (or start when none)
    restart_cost_s: float = 60.0  # time to relaunch and reload
    preemptible: bool = True
    # Not a victim before this time (math.inf: never again): the broker's minimum run
    # time between preemptions and per-job budget (broker/scheduling/preemption_rules.py).
    protected_until: float = 0.0
    # Not a victim in [spared[0], spared[1]): it is expected to end by itself sooner than
    # preempting it would pay (broker/scheduling/preemption_rules.py ``spared``).
    spared: tuple[float, float] = (0.0, 0.0)
    # The broker is already checkpointing/suspending it (a victim from an earlier pass):
    # its GPUs count as soon-free victims at no extra cost and it is not re-announced.
    stopping: bool = False

    @property
    def gpus(self) -> int:
        return sum(g for _, g in self.allocations)

    def victim_at(self, now: float) -> bool:
        """May this job be chosen as a preemption victim at ``now`` (already stopping
        jobs aside)? Preemptible, past its protection, outside its spared interval."""
        return self.preemptible and self.protected_until <= now and not (self.spared[0] <= now < self.spared[1])


@dataclass(frozen=True, slots=True)
class TeamQuota:
    team: str
    cohort: str = ""
    # accelerator ("" = any) -> guaranteed GPUs, global across regions
    guaranteed: tuple[tuple[str, int], ...] = ()
    borrow_limit: int | None = None  # None = unlimited
    lend_limit: int | None = None
    can_lend: bool = True
    can_borrow: bool = True
    weight: float = 1.0
    # Optional per-region ceilings on top of the global quota: region -> most GPUs
    # (all accelerators) this team may hold there. Absent region = no ceiling.
    region_caps: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    nodes: tuple[NodeInfo, ...]
    running: tuple[RunningJob, ...]
    pending: tuple[JobRequest, ...]
    teams: tuple[TeamQuota, ...] = ()
    draining_regions: frozenset[str] = frozenset()
    # Free nodes reserved as their pool's spares (broker/scheduling/spares.py): in
    # ``nodes`` as cordoned, so no ordinary placement uses them.
    spares: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Admission:
    job_id: str
    agent_id: str
    region: str
    assignments: tuple[tuple[str, int], ...]  # (node_id, gpus)
    capacity_type: CapacityType = CapacityType.ON_DEMAND
    pool: str = ""
    price_per_gpu_hour: float = 0.0
    explanation: str = ""

    @property
    def nodes(self) -> int:
        return len(self.assignments)


@dataclass(frozen=True, slots=True)
class Preemption:
    job_id: str  # the victim
    for_job_id: str  # the job it makes room for
    reason: str  # e.g. "reclaim_lent_quota", "higher_priority"
    work_lost_gpu_s: float = 0.0
    message: str = ""


@dataclass(frozen=True, slots=True)
class Reservation:
    """A pending gang promised future capacity: a scheduled training plan's nodes
    from ``start_time`` (Slurm-style backfill reservation). Not an admission: the
    job stays PENDING; the engine re-derives the same reservation every pass until
    the plan starts and the job is admitted on those nodes."""

    job_id: str
    agent_id: str
    region: str
    pool: str
    start_time: float
    assignments: tuple[tuple[str, int], ...]  # (node_id, gpus)
    explanation: str = ""


@dataclass(slots=True)
class Decisions:
    admissions: list[Admission] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    # job_id -> why it is still pending, for people
    pending_reasons: dict[str, str] = field(default_factory=dict)
    reservations: list[Reservation] = field(default_factory=list)
