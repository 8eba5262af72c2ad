"""First-fit gang placement: the foundation's scheduler and the benchmark baseline.

Walks pending jobs in queue order and, per job, the agents (clusters) in name
order, taking the first nodes with enough free GPUs. All nodes or none (gang).
Knows nothing of topology, cost or quotas; ``placement.scheduler`` does.
"""

from __future__ import annotations

from collections import defaultdict

from placement.model import Admission, CapacityType, Decisions, JobRequest, NodeInfo, Snapshot


def usable(node: NodeInfo, now: float) -> bool:
    """A node can take new work: healthy, not cordoned, inside its plan window."""
    if not node.healthy or node.cordoned:
        return False
    if node.plan_start is not None and now < node.plan_start:
        return False
    return not (node.plan_end is not None and now >= node.plan_end)


def allowed_types(job: JobRequest) -> frozenset[CapacityType]:
    if job.capacity_types:
        return job.capacity_types
    return frozenset({CapacityType.ON_DEMAND, CapacityType.TRAINING_PLAN, CapacityType.RESERVED})


def accepts(job: JobRequest, region: str, accelerator: str) -> bool:
    """The job's accelerator and region constraints allow capacity of this kind there."""
    if job.accelerator and accelerator != job.accelerator:
        return False
    if job.allowed_regions and region not in job.allowed_regions:
        return False
    return region not in job.denied_regions


def node_fits_job(node: NodeInfo, job: JobRequest, draining: frozenset[str]) -> bool:
    """Static eligibility of a node for a job (ignores free GPUs)."""
    if node.region in draining or node.id in job.excluded_nodes:
        return False
    if not accepts(job, node.region, node.accelerator):
        return False
    if node.capacity_type not in allowed_types(job):
        return False
    if job.max_price_per_gpu_hour and node.price_per_gpu_hour > job.max_price_per_gpu_hour:
        return False
    return node.gpus >= job.gpus_per_node


def free_gpus(snapshot: Snapshot) -> dict[str, int]:
    used: dict[str, int] = defaultdict(int)
    for run in snapshot.running:
        for node_id, gpus in run.allocations:
            used[node_id] += gpus
    return {n.id: n.gpus - used.get(n.id, 0) for n in snapshot.nodes}


def schedule_first_fit(snapshot: Snapshot) -> Decisions:
    free = free_gpus(snapshot)
    by_agent: dict[str, list[NodeInfo]] = defaultdict(list)
    for node in sorted(snapshot.nodes, key=lambda n: (n.agent_id, n.id)):
        if usable(node, snapshot.now):
            by_agent[node.agent_id].append(node)
    decisions = Decisions()
    for job in snapshot.pending:
        placed = False
        for agent_id in sorted(by_agent):
            chosen = [
                n
                for n in by_agent[agent_id]
                if node_fits_job(n, job, snapshot.draining_regions) and free[n.id] >= job.gpus_per_node
            ][: job.nodes]
            if len(chosen) < job.nodes:
                continue
            for n in chosen:
                free[n.id] -= job.gpus_per_node
            first = chosen[0]
            decisions.admissions.append(
                Admission(
                    job_id=job.id,
                    agent_id=agent_id,
                    region=first.region,
                    assignments=tuple((n.id, job.gpus_per_node) for n in chosen),
                    capacity_type=first.capacity_type,
                    pool=first.pool,
                    price_per_gpu_hour=first.price_per_gpu_hour,
                    explanation=f"first fit on {len(chosen)} node(s) of {agent_id}",
                )
            )
            placed = True
            break
        if not placed:
            decisions.pending_reasons[job.id] = (
                f"needs {job.nodes} node(s) x {job.gpus_per_node} GPU(s)"
                f"{' of ' + job.accelerator if job.accelerator else ''}; no cluster has that many free"
            )
    return decisions
