"""When a job's avoided nodes are all that could ever hold it, try them again.

A failed attempt adds the nodes the agent blamed to the job's ``excluded_nodes``
(broker/jobs/updates.py), so the relaunch goes elsewhere. Exclusions accumulate: in the
200-job SQLite fault campaign two 2-node on-demand jobs each excluded one node in both
2-node on-demand regions and then waited forever on an idle fleet. A demanding user
expects "avoid the node that just failed", not "never run again"; SkyPilot's failover
likewise clears its blocklist once every location is blocked. So exclusions are a
preference: when no connected cluster could hold the job *even empty* without the
excluded nodes, but one could with some of them, the fewest such nodes (the longest
avoided first) are forgiven, each time said in the job's history.

Static, not occupancy-based: a busy fleet is a reason to wait, not to go back to a node
that failed. Eligibility is the engine's own static test (``placement.firstfit.
node_fits_job``), per cluster (a gang never spans two agents). Topology requirements
below the cluster are not modelled here, so a job blocked only inside one cluster's
block keeps its exclusions (it waits, as before); nodes left out for other reasons (an
agent that refused the launch lately, broker/jobs/backoff.py; a training plan's nodes,
excluded as the plan ends) are never forgiven here.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping

import placement
from computebroker.v1 import common_pb2 as pb
from placement.firstfit import node_fits_job


def to_forgive(snapshot: placement.Snapshot, jobs: Mapping[str, pb.Job]) -> dict[str, tuple[str, ...]]:
    """Job id -> the excluded nodes to try again (empty map: nothing is blocked by its own
    exclusions). Only pending requests whose stored job has exclusions are looked at."""
    out: dict[str, tuple[str, ...]] = {}
    usable = [n for n in snapshot.nodes if n.healthy and not n.cordoned]
    for req in snapshot.pending:
        job = jobs.get(req.id)
        if job is None or not job.excluded_nodes:
            continue
        forgive = _forgive_one(req, tuple(job.excluded_nodes), usable, snapshot.draining_regions)
        if forgive:
            out[req.id] = forgive
    return out


def _forgive_one(req: placement.JobRequest, excluded: tuple[str, ...], nodes: list[placement.NodeInfo],
                 draining: frozenset[str]) -> tuple[str, ...]:
    # A training plan's nodes are excluded on purpose when the plan is about to end
    # (scheduling/plan_watch.py): forgiving them would only bring the job back to them.
    plan = {n.id for n in nodes if n.capacity_type == placement.CapacityType.TRAINING_PLAN}
    own = set(excluded) - plan
    excluded = tuple(i for i in excluded if i in own)
    other = req.excluded_nodes - own  # left out for other reasons: never forgiven here
    open_req = dataclasses.replace(req, excluded_nodes=frozenset(other))
    need = max(1, req.min_nodes or req.nodes)
    by_agent: dict[str, list[str]] = defaultdict(list)
    for n in nodes:
        if node_fits_job(n, open_req, draining):
            by_agent[n.agent_id].append(n.id)
    best: tuple[str, ...] | None = None
    age = {n: i for i, n in enumerate(excluded)}  # lower = avoided longer
    for ids in by_agent.values():
        if len(ids) < need:
            continue  # too small even with every exclusion forgiven
        free_of_exclusions = sum(1 for i in ids if i not in own)
        if free_of_exclusions >= need:
            return ()  # some cluster could hold it as it is: waiting is about occupancy
        here = set(ids)
        candidates = [i for i in excluded if i in here]  # oldest exclusion first
        pick = tuple(candidates[:need - free_of_exclusions])
        if best is None or (len(pick), max(age[i] for i in pick)) < (len(best), max(age[i] for i in best)):
            best = pick
    return best or ()
