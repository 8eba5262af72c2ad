"""Node failures in the simulated fleet: the rate, the memory tier and the spares.

Why a module of its own: the scenario's ``node_failures`` section (:class:`NodeFailures`)
sets how often nodes fail and what the fleet offers a job that lost a node (the memory
tier, spares per pool). What the job then does is **not** decided here: it is the live
broker's decision, the same code called the same way (``Simulation._relaunch_lost``):

1. the failed attempt is reported FAILED with the node blamed
   (``updates.attempt_ended``: ``Job.node_recovery`` records the lost node and the
   survivors, the job is queued again, waiting for its relaunch plan);
2. at the next scheduler pass, ``broker.scheduling.replacements.relaunch_lost`` builds
   each such job's view of its pool (``lost_view``: survivors still usable, the pool's
   ready spares in the lost node's block) from the pass's snapshot, asks the job's
   recovery policy (``RecoveryPolicy.relaunch``, whose ``RELAUNCH_RULES`` map each
   blocker to a plan) and applies the plan (``broker.jobs.node_recovery.decide``):
   REPLACE_IN_PLACE admits the job at once on its survivors plus the spares, FROM_STORE
   leaves it queued for ordinary placement, resumed from the store;
3. the spares are the live broker's (``broker.scheduling.spares.reserved``): the
   ``spares_per_pool`` free on-demand nodes of each pool (highest ids first), chosen again
   every pass and cordoned for ordinary placement.

What the simulator adds is only the time and the work: an in-place relaunch restores from
memory (the spare reads the lost node's shard from its buddy at ``peer_gbps`` after
``rejoin_s``; the job loses the work since its last in-memory snapshot, taken every
``memory_snapshot_s`` of running); a store relaunch reads the last periodic checkpoint
through the region's store (shared pipe) wherever the job is placed.

The memory tier is the job's trainer option ``memory_every`` (the live rule reads it):
``tier: memory`` sets it on every job, ``memory_snapshot_s`` steps of one second.

Running below the requested size (``elastic_jobs``): a job on fewer nodes than it asked
for trains at that fraction of its speed (linear scaling: the same GPU-seconds per unit
of work, so goodput is unchanged and the job takes longer). A shrink in place resumes
from memory like a replacement (``rejoin_s`` plus the lost node's shard at
``peer_gbps``). Growing back is the live broker's pass step as is
(``grow_watch.check`` after placement, ``grow_watch.relaunch_grown`` before it): a
checkpoint-first stop (its time charged to ``grow_back``) and a relaunch at full size
from that checkpoint, with the broker's settle time and rate limit.
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


@dataclass(frozen=True)
class NodeFailures:
    """The scenario's ``node_failures`` section (all optional)."""

    # fleet-scaled failure rate: per-node MTBF = this x 16,384 / GPUs per node (Meta's 1.8 h
    # gives 3,686 h for an 8-GPU node); 0 keeps each region's node_mtbf_h
    mttf_h_per_16k_gpus: float = 0.0
    tier: Tier = Tier.STORE  # memory: every job's trainer runs the memory tier (memory_every)
    spares_per_pool: int = 0  # free on-demand nodes per pool the broker reserves as spares
    memory_snapshot_s: float = 60.0  # K steps of running between in-memory snapshots
    peer_gbps: float = 12.5  # GB/s from the buddy's host memory to the replacement
    rejoin_s: float = 90.0  # a spare joins and the ranks re-initialise their collectives
    # multi-node jobs are elastic down to one node (``spec.elasticity``): with the memory
    # tier and no spare a node loss shrinks them in place, and placement may start them
    # (or a move place them) on fewer nodes when only part fits; False: fixed-size gangs
    elastic_jobs: bool = False
    # jobs below their requested size grow back when capacity returns (the live pass's
    # step, broker/scheduling/grow_watch.py, with the broker's settle time and rate
    # limit); False: they stay small until they end, as before growing back existed
    grow_back: bool = True

    @property
    def memory_every(self) -> int:
        """The trainer option the jobs get (steps of one second; 0 = tier off)."""
        return max(1, round(self.memory_snapshot_s)) if self.tier is Tier.MEMORY else 0

    def node_mtbf_h(self, gpus_per_node: int, region_mtbf_h: float) -> float:
        if self.mttf_h_per_16k_gpus <= 0:
            return region_mtbf_h
        return self.mttf_h_per_16k_gpus * META_GPUS / max(1, gpus_per_node)
