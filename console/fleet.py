"""Fleet view model: regions -> pools -> UltraServers / layer-3 blocks -> nodes.

Why a pure function of the API's answers (ListRegions, GetCapacity with nodes): the page,
the live refresh and the tests all read the same plain data, and the heat map's colour
rules live in one table (:data:`CELL_STYLE`), not in the template.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Container, Iterable
from dataclasses import dataclass, field

from brokersdk.enums import SPOT_NOTICE_LABEL, capacity_type_name
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb


class CellState(enum.Enum):
    """What a node cell says at a glance (the strongest condition wins)."""

    RECLAIMED = "reclaimed"  # a spot node the cloud is taking back (interruption notice)
    UNHEALTHY = "unhealthy"
    CORDONED = "cordoned"
    BORROWED = "borrowed"  # some of its GPUs are held beyond a team's guarantee
    FULL = "full"
    PARTIAL = "partial"
    FREE = "free"


# Legend text per state, in the order the legend shows them.
CELL_STYLE: dict[CellState, str] = {
    CellState.FREE: "all GPUs free",
    CellState.PARTIAL: "some GPUs used",
    CellState.FULL: "all GPUs used",
    CellState.BORROWED: "GPUs borrowed beyond a guarantee",
    CellState.CORDONED: "cordoned: no new work",
    CellState.UNHEALTHY: "unhealthy",
    CellState.RECLAIMED: "spot node reclaimed (interruption notice)",
}

# What a viewer sees in place of a job id they may not read (another team's job).
HIDDEN_JOB = "another team's job"


@dataclass
class NodeCell:
    id: str
    gpus: int
    used: int
    borrowed: int
    healthy: bool
    cordoned: bool
    jobs: list[str]
    accelerator: str
    zone: str
    instance_type: str = ""
    price: float = 0.0  # per GPU-hour
    capacity_type: str = ""
    reclaimed: bool = False

    @property
    def state(self) -> CellState:
        if self.reclaimed:
            return CellState.RECLAIMED
        if not self.healthy:
            return CellState.UNHEALTHY
        if self.cordoned:
            return CellState.CORDONED
        if self.borrowed:
            return CellState.BORROWED
        if self.used >= self.gpus > 0:
            return CellState.FULL
        return CellState.PARTIAL if self.used else CellState.FREE

    @property
    def free(self) -> int:
        return 0 if not self.healthy or self.cordoned else max(0, self.gpus - self.used)

    @property
    def fill(self) -> tuple[int, int]:
        """Percent of the cell drawn as owned-used and as borrowed GPUs."""
        if self.gpus <= 0:
            return 0, 0
        borrowed = round(100 * self.borrowed / self.gpus)
        return round(100 * self.used / self.gpus) - borrowed, borrowed

    @property
    def price_text(self) -> str:
        return f"{self.price:.2f}/GPU-h" if self.price else "prepaid" if (
            self.capacity_type == "training-plan") else "-"

    @property
    def title(self) -> str:
        jobs = f"; jobs {', '.join(self.jobs)}" if self.jobs else ""
        return (f"{self.id} · {self.instance_type or self.accelerator} · {self.zone} · "
                f"{self.capacity_type} {self.price_text}: {self.used}/{self.gpus} GPUs used,"
                f" {self.borrowed} borrowed, {self.state.value}{jobs}")


@dataclass
class Totals:
    gpus: int = 0
    used: int = 0
    borrowed: int = 0
    free: int = 0
    nodes: int = 0
    unhealthy: int = 0
    cordoned: int = 0
    reclaimed: int = 0

    def add(self, c: NodeCell) -> None:
        self.gpus += c.gpus
        self.used += c.used
        self.borrowed += c.borrowed
        self.free += c.free
        self.nodes += 1
        self.unhealthy += not c.healthy and not c.reclaimed
        self.cordoned += c.cordoned
        self.reclaimed += c.reclaimed


@dataclass
class Block:
    name: str
    kind: str  # "UltraServer" | "layer-3 block" | "no topology"
    nodes: list[NodeCell] = field(default_factory=list)
    totals: Totals = field(default_factory=Totals)


@dataclass
class Pool:
    capacity_type: str
    name: str
    ctype: int = 0  # the wire enum, for ordering
    blocks: list[Block] = field(default_factory=list)
    totals: Totals = field(default_factory=Totals)

    @property
    def label(self) -> str:
        """"spot", or "training-plan · tp-123" when the pool has a name of its own."""
        same = self.name.replace("_", "-").lower() in ("", self.capacity_type)
        return self.capacity_type if same else f"{self.capacity_type} · {self.name}"


@dataclass
class RegionView:
    name: str
    connected: bool
    draining: bool
    drain_reason: str
    running_jobs: int
    pools: list[Pool] = field(default_factory=list)
    totals: Totals = field(default_factory=Totals)

    @property
    def cordoned_nodes(self) -> list[str]:
        return [c.id for p in self.pools for b in p.blocks for c in b.nodes if c.cordoned]


def _natural(text: str) -> list[object]:
    """"us2" before "us10": numbers in names compare as numbers."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


def _short(name: str, region: str) -> str:
    """A block's name without its region's prefix (the section already says the region)."""
    return name[len(region) + 1:] if name.startswith(region + "-") and len(name) > len(region) + 1 else name


# Pools in the order a person reads them: what is paid for first.
_POOL_ORDER = {pb.CAPACITY_TYPE_TRAINING_PLAN: 0, pb.CAPACITY_TYPE_RESERVED: 1,
               pb.CAPACITY_TYPE_ON_DEMAND: 2, pb.CAPACITY_TYPE_SPOT: 3}


@dataclass
class OwnJobs:
    """What a viewer who reads only their team's jobs knows of them: their ids and the
    GPUs they hold per node. Why the GPUs: the broker leaves other teams' job ids out of a
    member's answer, so a node's used GPUs beyond their own jobs' are another team's."""

    ids: set[str]
    node_gpus: dict[str, int]

    @classmethod
    def of(cls, jobs: Iterable[pb.Job]) -> OwnJobs:
        ids: set[str] = set()
        gpus: dict[str, int] = {}
        for j in jobs:
            ids.add(j.id)
            for a in j.placement.nodes:
                gpus[a.node_id] = gpus.get(a.node_id, 0) + a.gpus
        return cls(ids, gpus)


def job_label(job_id: str, visible: Container[str] | None) -> str:
    """The job id, or :data:`HIDDEN_JOB` when the viewer may not read that job (``visible``
    None: the viewer reads every job, an operator)."""
    return job_id if visible is None or job_id in visible else HIDDEN_JOB


def build_fleet(regions: Iterable[cpb.RegionInfo], nodes: Iterable[cpb.NodeUsage],
                own: OwnJobs | None = None) -> list[RegionView]:
    """The heat map's tree from ListRegions and GetCapacity(include_nodes=True).
    ``own``: the viewer's team's jobs when they may read only those (None = an operator,
    who reads all); other teams' jobs are shown as :data:`HIDDEN_JOB`, never by id."""
    views = {r.name: RegionView(r.name, r.connected, r.draining, r.drain_reason, r.running_jobs)
             for r in regions}
    pools: dict[tuple[str, int, str], Pool] = {}
    blocks: dict[tuple[str, int, str, str], Block] = {}
    for usage in nodes:
        n = usage.node
        region = views.setdefault(n.region, RegionView(n.region, False, False, "", 0))
        pkey = (n.region, n.capacity_type, n.pool)
        pool = pools.get(pkey)
        if pool is None:
            pool = pools[pkey] = Pool(capacity_type_name(n.capacity_type) or "unknown", n.pool,
                                         n.capacity_type)
            region.pools.append(pool)
        bname, kind = ((n.ultraserver_id, "UltraServer") if n.ultraserver_id else
                       (n.network_layer_3, "layer-3 block") if n.network_layer_3 else
                       ("", "no topology"))
        bkey = (*pkey, bname)
        block = blocks.get(bkey)
        if block is None:
            block = blocks[bkey] = Block(_short(bname, n.region) or "-", kind)
            pool.blocks.append(block)
        jobs = [job_label(j, own.ids if own else None) if j else HIDDEN_JOB
                for j in usage.job_ids]
        if own is not None and usage.allocated_gpus > own.node_gpus.get(n.id, 0) and (
                HIDDEN_JOB not in jobs):
            jobs.append(HIDDEN_JOB)  # GPUs in use beyond the viewer's own jobs'
        cell = NodeCell(n.id, n.gpus, usage.allocated_gpus, usage.borrowed_gpus, n.healthy,
                        n.cordoned, jobs,
                        n.accelerator, n.zone, n.instance_type, n.price_per_gpu_hour,
                        pool.capacity_type,
                        not n.healthy and SPOT_NOTICE_LABEL in n.labels)
        block.nodes.append(cell)
        for t in (block.totals, pool.totals, region.totals):
            t.add(cell)
    out = sorted(views.values(), key=lambda r: r.name)
    for r in out:
        r.pools.sort(key=lambda p: (_POOL_ORDER.get(p.ctype, 9), p.name))
        for p in r.pools:
            p.blocks.sort(key=lambda b: _natural(b.name))
            for b in p.blocks:
                b.nodes.sort(key=lambda c: _natural(c.id))
    return out
