"""The scenario file: fleet, teams and job-shaping rules, as typed data.

Why a file and not flags: a trace says only who submitted how many GPUs for how long;
everything that makes it a multi-region fleet (regions, pools, prices, interruptions,
plans, topology, quotas, checkpoint sizes) is an assumption, and assumptions must be
written down and echoed in the result (``Scenario.to_dict``).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from pathlib import Path

import yaml

from simulator.node_recovery import NodeFailures, Tier


class ScenarioError(ValueError):
    """The scenario file is wrong; the message says where and how to fix it."""


class PoolKind(enum.StrEnum):
    ON_DEMAND = "on_demand"
    SPOT = "spot"
    TRAINING_PLAN = "training_plan"


@dataclass(frozen=True)
class Pool:
    kind: PoolKind
    nodes: int
    price_per_gpu_hour: float
    name: str = ""
    # spot: interruptions per node-hour (Poisson), notice before reclaim, time until back
    interruptions_per_node_hour: float = 0.0
    notice_s: float = 120.0
    return_after_s: float = 3600.0
    # training plan window [start_s, end_s) in trace seconds
    start_s: float = 0.0
    end_s: float = 0.0


@dataclass(frozen=True)
class Region:
    name: str
    pools: tuple[Pool, ...]
    gpus_per_node: int = 8
    accelerator: str = "v100"
    ultraserver_nodes: int = 4  # nodes per UltraServer
    layer3_nodes: int = 8  # nodes per layer-3 block
    layer2_nodes: int = 16
    node_mtbf_h: float = 0.0  # 0 = no failures
    hang_mtbf_h: float = 0.0
    repair_s: float = 3600.0
    hang_detect_s: float = 600.0


@dataclass(frozen=True)
class Team:
    name: str
    region: str  # home region
    guaranteed_gpus: int
    priority_class: str = "training"


@dataclass(frozen=True)
class Window:
    region: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Checkpoint:
    bytes_per_gpu: float = 2e9  # model + optimizer state per GPU of the job (model size)
    interval_s: float = 1800.0  # periodic checkpoints while running
    write_gbps: float = 2.0  # GB/s of one job's writer to the region's store
    read_gbps: float = 4.0
    # GB/s of a region's store for all its jobs together: concurrent checkpoint writes and
    # restores queue for it (a drain that checkpoints every job at once waits its turn)
    store_gbps: float = 10.0
    process_start_s: float = 60.0


@dataclass(frozen=True)
class Scenario:
    name: str
    regions: tuple[Region, ...]
    teams: tuple[Team, ...]
    checkpoint: Checkpoint = Checkpoint()
    scheduler_interval_s: float = 60.0
    # Preemption bounds: the live broker's settings of the same names (BrokerConfig
    # preempt_min_run_s / preempt_budget), applied by the same code (0 = no bound).
    preempt_min_run_s: float = 0.0
    preempt_budget: int = 0
    # Preempt only when it pays (BrokerConfig preempt_gain_factor / preempt_requeue_s,
    # broker/scheduling/preemption_rules.py ``spared``; 0 = off).
    preempt_gain_factor: float = 0.0
    preempt_requeue_s: float = 600.0
    inter_region_gbps: float = 1.0  # a link's GB/s, shared by every transfer on it (in turn)
    bandwidth_gbps: tuple[tuple[str, str, float], ...] = ()  # (from, to, GB/s) overrides
    # gang shaping: jobs above gpus_per_node span ceil(gpus / gpus_per_node) nodes
    gang_required: str = "layer_3"  # hard topology for multi-node gangs (none/ultraserver/layer_3)
    gang_preferred: str = "ultraserver"
    # seconds of wall time per second of work when a gang spans this domain (no topology
    # awareness lands gangs across blocks): throughput slowdown factors
    slowdown: tuple[tuple[str, float], ...] = (("ultraserver", 1.0), ("layer_3", 0.95),
                                               ("layer_2", 0.85), ("cluster", 0.75))
    spot_for_gpus_at_most: int = 8  # jobs this small accept spot
    movable_gpus: int = 8  # defragmentation moves jobs this small
    outages: tuple[Window, ...] = ()
    drains: tuple[Window, ...] = ()
    # scheduled spot reclaims: every spot node of the region gets a notice at start_s,
    # is gone notice_s later, and is back at end_s (on top of the random process)
    reclaims: tuple[Window, ...] = ()
    # What policies are told about durations (simulator/estimates.py): lognormal (sigma),
    # requested_limit (padding, rounded up to a ladder of limits) or exact (an oracle).
    duration_estimate: str = "lognormal"
    estimate_sigma: float = 1.0
    estimate_padding: float = 1.5
    unknown_team_region: str = ""  # home of teams not listed ("" = first region)
    unknown_team_quota: int = 0
    # node failures at a fleet-scaled rate, the recovery tier and in-place replacement
    # (simulator/node_recovery.py); the default keeps each region's node_mtbf_h, store only
    node_failures: NodeFailures = NodeFailures()

    def bandwidth(self, src: str, dst: str) -> float:
        for a, b, gbps in self.bandwidth_gbps:
            if (a, b) == (src, dst) or (b, a) == (src, dst):
                return gbps
        return self.inter_region_gbps

    def team(self, name: str) -> Team:
        for t in self.teams:
            if t.name == name:
                return t
        return Team(name, self.unknown_team_region or self.regions[0].name, self.unknown_team_quota)

    def to_dict(self) -> dict:
        return _plain(dataclasses.asdict(self))


def _plain(v):  # noqa: ANN001, ANN202 - JSON-friendly copy (tuples -> lists, enums -> str)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, enum.Enum):
        return v.value
    return v


def _build(cls, data: dict, where: str):  # noqa: ANN001, ANN202
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: expected a mapping, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    data = dict(data)
    for f in dataclasses.fields(cls):
        # YAML reads `name: 103959` as an int: a name compared with a trace's string team
        # would silently never match (that team fell back to the default quota). Names are text.
        if f.name in data and f.type == "str" and isinstance(data[f.name], int | float) \
                and not isinstance(data[f.name], bool):
            data[f.name] = str(data[f.name])
        # YAML 1.1 reads 2.0e9 as a string: coerce numbers
        if f.name in data and f.type in ("float", "int"):
            try:
                data[f.name] = (float if f.type == "float" else int)(data[f.name])
            except (TypeError, ValueError):
                raise ScenarioError(f"{where}: {f.name} must be a number, got {data[f.name]!r}") from None
    try:
        return cls(**data)
    except TypeError as e:
        raise ScenarioError(f"{where}: {e}") from None


def load(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML file."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ScenarioError(f"cannot read scenario {path}: {e}") from None
    except yaml.YAMLError as e:
        raise ScenarioError(f"scenario {path} is not valid YAML: {e}") from None
    return parse(raw, str(path))


def parse(raw: dict, where: str = "scenario") -> Scenario:
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: expected a mapping at the top")
    raw = dict(raw)
    regions = []
    for i, r in enumerate(raw.pop("regions", None) or []):
        r = dict(r)
        pools = []
        for j, p in enumerate(r.pop("pools", None) or []):
            p = dict(p)
            try:
                p["kind"] = PoolKind(p.get("kind", ""))
            except ValueError:
                raise ScenarioError(f"{where}: regions[{i}].pools[{j}].kind must be one of "
                                    f"{', '.join(k.value for k in PoolKind)}") from None
            pool = _build(Pool, p, f"{where}: regions[{i}].pools[{j}]")
            if pool.kind is PoolKind.TRAINING_PLAN and not (pool.name and pool.end_s > pool.start_s):
                raise ScenarioError(f"{where}: regions[{i}].pools[{j}]: a training plan needs a name"
                                    " and end_s > start_s")
            pools.append(pool)
        regions.append(_build(Region, {**r, "pools": tuple(pools)}, f"{where}: regions[{i}]"))
    if not regions:
        raise ScenarioError(f"{where}: no regions; add at least one under `regions:`")
    known = {r.name for r in regions}
    teams = tuple(_build(Team, t, f"{where}: teams[{i}]") for i, t in enumerate(raw.pop("teams", None) or []))
    seen: set[str] = set()
    for t in teams:
        if t.name in seen:
            raise ScenarioError(f"{where}: team {t.name!r} is listed twice; list each team once")
        seen.add(t.name)
    for t in teams:
        if t.region not in known:
            raise ScenarioError(f"{where}: team {t.name} has home region {t.region!r}, not one of {sorted(known)}")
    if "duration_estimate" in raw:
        from simulator.estimates import EstimateModel

        try:
            EstimateModel(raw["duration_estimate"])
        except ValueError:
            raise ScenarioError(f"{where}: duration_estimate must be one of "
                                f"{', '.join(m.value for m in EstimateModel)}") from None
    ck = _build(Checkpoint, raw.pop("checkpoint", None) or {}, f"{where}: checkpoint")
    nf = dict(raw.pop("node_failures", None) or {})
    if "tier" in nf:
        try:
            nf["tier"] = Tier(nf["tier"])
        except ValueError:
            raise ScenarioError(f"{where}: node_failures.tier must be one of "
                                f"{', '.join(t.value for t in Tier)}") from None
    if "replace_in_place" in nf:  # the broker's recovery policy decides, as live
        raise ScenarioError(f"{where}: node_failures.replace_in_place is no longer a setting: the broker's"
                            " recovery policy replaces a lost node in place when the memory tier is on"
                            " (tier: memory) and the pool has a ready spare (spares_per_pool)")
    failures = _build(NodeFailures, nf, f"{where}: node_failures")
    if failures.spares_per_pool < 0 or failures.memory_snapshot_s <= 0 or failures.peer_gbps <= 0:
        raise ScenarioError(f"{where}: node_failures: spares_per_pool must be >= 0, memory_snapshot_s"
                            " and peer_gbps > 0")
    wins = {}
    for key in ("outages", "drains", "reclaims"):
        wins[key] = tuple(_build(Window, w, f"{where}: {key}[{i}]") for i, w in enumerate(raw.pop(key, None) or []))
    bw = tuple((str(b["from"]), str(b["to"]), float(b["gbps"])) for b in raw.pop("bandwidth_gbps", None) or [])
    slow = raw.pop("slowdown", None)
    extra = {"slowdown": tuple(sorted(slow.items()))} if slow else {}
    return _build(Scenario, {**raw, **extra, "regions": tuple(regions), "teams": teams, "checkpoint": ck,
                             "node_failures": failures,
                             "bandwidth_gbps": bw, **wins}, where)
