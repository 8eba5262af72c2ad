"""Spare nodes per pool: which free nodes the scheduler keeps out of ordinary placements.

Why spares: a job that loses one node can be relaunched *in place* (the survivors keep
their nodes, a spare takes the lost node's place, the ranks restore from their peers'
memory: docs/recovery.md) only if a free node of the same pool is ready at that moment.
Operators reserve ``N`` per pool (the agent's inventory ``spares: N``,
``Register.pool_spares``).

Why computed, not fixed node names: the spares are "N free nodes of the pool", chosen
again on every pass from the same inputs. A spare that a replacement uses is then
replenished by itself from the pool's next free node (when there is one), and a spare
that breaks is replaced by a healthy one, with no bookkeeping to keep in sync or to
lose on a broker restart. The choice is deterministic and stable: highest node ids
first, nodes blamed for a failure (any live job's ``excluded_nodes``) last, so a free
spare stays the spare while it is free.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

import placement
from broker.agents.registry import AgentState


def block_of(node: placement.NodeInfo) -> str:
    """The node's block for same-block replacement: its UltraServer, else its layer-3
    network block ("" = none), as GetCapacity's by-block rows group them."""
    return node.ultraserver or node.layer3


def reserved(nodes: Iterable[placement.NodeInfo], spares_per_pool: Mapping[tuple[str, str], int],
             used: set[str] | frozenset[str], held: set[str] | frozenset[str] = frozenset(),
             blamed: set[str] | frozenset[str] = frozenset(),
             designated: set[str] | frozenset[str] = frozenset()) -> frozenset[str]:
    """The node ids reserved as spares now.

    ``spares_per_pool``: (agent id, pool) -> N. ``used``: nodes any running, stopping or
    reserved attempt holds. ``held``: nodes of jobs waiting for an in-place relaunch
    decision (their survivors and lost nodes), never spares (a spare must be a node
    another job's replacement can take). ``designated``: nodes the operator labelled
    spares (``Node.spare``): chosen first, so a labelled node is the spare whenever it
    is free and usable; while it is not (busy when labelled, or broken), another free
    node of its pool stands in. A pool with fewer free usable nodes than N has them all
    as spares."""
    if not spares_per_pool:
        return frozenset()
    candidates: dict[tuple[str, str], list[placement.NodeInfo]] = defaultdict(list)
    for n in nodes:
        key = (n.agent_id, n.pool)
        if spares_per_pool.get(key, 0) <= 0:
            continue
        if not n.healthy or n.cordoned or n.id in used or n.id in held:
            continue
        candidates[key].append(n)
    out: set[str] = set()
    for key, free in candidates.items():
        free.sort(key=lambda n: n.id, reverse=True)
        free.sort(key=lambda n: n.id in blamed)  # stable: unblamed first, each by id desc
        if designated:
            free.sort(key=lambda n: n.id not in designated)  # labelled spares before all
        out.update(n.id for n in free[:spares_per_pool[key]])
    return frozenset(out)


def designated(agents: Iterable[AgentState]) -> frozenset[str]:
    """The nodes the agents report as labelled spares (``Node.spare``)."""
    return frozenset(n.id for a in agents for n in a.record.nodes if n.spare)


def per_pool(agents: Iterable[AgentState]) -> dict[tuple[str, str], int]:
    """(agent id, pool) -> spares, from the agents' registrations."""
    return {(a.agent_id, pool): int(count) for a in agents
            for pool, count in a.record.pool_spares.items() if count > 0}
