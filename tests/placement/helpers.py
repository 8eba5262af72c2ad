"""Small builders for placement tests: clusters with topology, jobs, and a broker-like
multi-pass driver that applies Decisions the way the broker does."""

from __future__ import annotations

from dataclasses import replace

from placement.model import (
    CapacityType,
    Decisions,
    JobRequest,
    NodeInfo,
    RunningJob,
    Snapshot,
)


def node(i: int | str, agent: str = "a1", region: str = "r1", zone: str = "z1", gpus: int = 8, **kw) -> NodeInfo:
    return NodeInfo(id=str(i) if isinstance(i, str) else f"{agent}-n{i:03d}", agent_id=agent, region=region,
                    zone=zone, gpus=gpus, **kw)


def block_cluster(blocks: dict[str, int], agent: str = "a1", region: str = "r1", gpus: int = 8, **kw) -> list[NodeInfo]:
    """Nodes grouped into named layer-3 blocks: {"b0": 4, "b1": 2} -> 6 nodes."""
    out = []
    i = 0
    for blk, count in blocks.items():
        for _ in range(count):
            out.append(node(i, agent=agent, region=region, gpus=gpus, layer1="l1", layer2="l2", layer3=blk, **kw))
            i += 1
    return out


def ultraservers(count: int, agent: str = "a1", region: str = "r1", nodes_per: int = 18) -> list[NodeInfo]:
    return [
        NodeInfo(id=f"{agent}-us{u}-{k:02d}", agent_id=agent, region=region, zone="z1", gpus=4,
                 accelerator="gb200", layer1="l1", layer2="l2", layer3=f"ul3-{u}", ultraserver=f"us{u}",
                 capacity_type=CapacityType.RESERVED)
        for u in range(count)
        for k in range(nodes_per)
    ]


def job(jid: str, nodes: int = 1, gpus: int = 8, team: str = "t", priority: int = 70, **kw) -> JobRequest:
    return JobRequest(id=jid, team=team, priority=priority, nodes=nodes, gpus_per_node=gpus, **kw)


def snap(nodes, pending=(), running=(), teams=(), now: float = 1000.0, **kw) -> Snapshot:
    return Snapshot(now=now, nodes=tuple(nodes), running=tuple(running), pending=tuple(pending),
                    teams=tuple(teams), **kw)


def admitted(d: Decisions) -> dict[str, tuple[tuple[str, int], ...]]:
    return {a.job_id: a.assignments for a in d.admissions}


class Broker:
    """Applies decisions like the broker: admissions start running, preempted jobs are
    suspended (back to pending with their original request), time moves on."""

    def __init__(self, nodes, teams=(), now: float = 1000.0) -> None:
        self.nodes = list(nodes)
        self.teams = tuple(teams)
        self.now = now
        self.pending: dict[str, JobRequest] = {}
        self.running: dict[str, RunningJob] = {}
        self.requests: dict[str, JobRequest] = {}

    def submit(self, j: JobRequest) -> None:
        j = replace(j, submit_time=j.submit_time or self.now)
        self.requests[j.id] = j
        self.pending[j.id] = j

    def snapshot(self) -> Snapshot:
        return Snapshot(now=self.now, nodes=tuple(self.nodes), running=tuple(self.running.values()),
                        pending=tuple(self.pending.values()), teams=self.teams)

    def step(self, schedule) -> Decisions:
        d = schedule(self.snapshot())
        for a in d.admissions:
            j = self.pending.pop(a.job_id)
            self.running[j.id] = RunningJob(id=j.id, team=j.team, priority=j.priority, allocations=a.assignments,
                                            accelerator=j.accelerator, started_time=self.now,
                                            last_checkpoint_time=self.now)
        for p in d.preemptions:
            r = self.running.pop(p.job_id)
            self.pending[r.id] = self.requests[r.id]
        self.now += 60
        return d
