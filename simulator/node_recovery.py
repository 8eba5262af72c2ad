"""What a node failure under a running job costs: the recovery tiers and in-place replacement.

Why a module of its own: the choice (replace in place or go back through the queue; restore
from the buddies' memory or from the store) is one decision, taken as data here and applied
in one place by the engine (``Simulation._node_fail``). The scenario's ``node_failures``
section sets it (:class:`NodeFailures`).

The two tiers (issue: recover in seconds, lose at most one step):

- **store** (the durable tier, what the broker does today): the job loses everything since
  its last periodic checkpoint and every rank re-reads the whole checkpoint from the
  region's store (through the shared store pipe);
- **memory**: every ``memory_snapshot_s`` of running each rank's shard is copied to host
  memory and to a buddy node; after a failure the job loses at most that much work, and the
  replacement node reads the failed node's shard from its buddy at ``peer_gbps``. The buddy
  of a gang's node is the next node of the gang (a ring); a single-node job's buddy is the
  next node of its layer-3 block (host memory of a neighbour). When the buddy is down too,
  both copies are gone and the job falls back to the store.

In-place replacement: the survivors stay, a spare joins (``rejoin_s``: the node joins and
the ranks re-initialise their collectives), the job keeps its GPUs and its queue place. The
spare is one of the pool's reserved spares (``spares_per_pool``, withheld from the
scheduler) or, failing that, an idle node of the same pool, always inside the job's
required topology domain (a gang that needs one layer-3 block gets a spare of that block).
Without a spare the job fails and goes back through the queue as before (the broker's
recovery policy), and restores from the store: its memory copies were on the nodes it
gave back.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# Meta's reliability study (Llama 3 training): one failure every 1.8 h on 16,384 GPUs.
META_MTTF_H_PER_16K_GPUS = 1.8
META_GPUS = 16384


class Tier(enum.StrEnum):
    STORE = "store"
    MEMORY = "memory"


class Kind(enum.StrEnum):
    """How one failed job recovers (the plan, applied by the engine)."""

    REPLACE_MEMORY = "replace_memory"  # spare joins, shard from the buddy's memory
    REPLACE_STORE = "replace_store"  # spare joins, every rank re-reads the store checkpoint
    REQUEUE = "requeue"  # no spare: the attempt fails, the job queues again (store tier)


@dataclass(frozen=True)
class NodeFailures:
    """The scenario's ``node_failures`` section (all optional)."""

    # fleet-scaled failure rate: per-node MTBF = this x 16,384 / GPUs per node (Meta's 1.8 h
    # gives 3,686 h for an 8-GPU node); 0 keeps each region's node_mtbf_h
    mttf_h_per_16k_gpus: float = 0.0
    tier: Tier = Tier.STORE
    replace_in_place: bool = False
    spares_per_pool: int = 0  # on-demand nodes per pool held back as spares
    memory_snapshot_s: float = 60.0  # K steps of running between in-memory snapshots
    peer_gbps: float = 12.5  # GB/s from the buddy's host memory to the replacement
    rejoin_s: float = 90.0  # a spare joins and the ranks re-initialise their collectives

    def node_mtbf_h(self, gpus_per_node: int, region_mtbf_h: float) -> float:
        if self.mttf_h_per_16k_gpus <= 0:
            return region_mtbf_h
        return self.mttf_h_per_16k_gpus * META_GPUS / max(1, gpus_per_node)


@dataclass(frozen=True)
class Plan:
    kind: Kind
    restore_bytes: float  # read by the replacement (memory) or by every rank (store)
    downtime_s: float  # GPUs held, no progress: rejoin + restore (store reads: + the pipe's wait)


def plan(cfg: NodeFailures, *, spare: bool, buddy_alive: bool, ckpt_bytes: float, nodes: int) -> Plan:
    """The recovery of a running job whose node failed (pure: the engine applies it)."""
    if not (cfg.replace_in_place and spare):
        return Plan(Kind.REQUEUE, ckpt_bytes, 0.0)
    if cfg.tier is Tier.MEMORY and buddy_alive:
        shard = ckpt_bytes / max(1, nodes)
        return Plan(Kind.REPLACE_MEMORY, shard, cfg.rejoin_s + shard / (cfg.peer_gbps * 1e9))
    return Plan(Kind.REPLACE_STORE, ckpt_bytes, cfg.rejoin_s)
