"""Which spares a Launch names (``Launch.spare_nodes``): its pool's, as this pass sees them.

Why the agent is told: an in-place replacement is fast only if the spare that takes a
lost node's place is ready to start the job's rank at once (a warm rank starter that
has imported torch: docs/recovery.md). That must happen before the loss, so the agent
needs to know the job's likely replacement nodes when the attempt launches; only the
scheduler's snapshot knows them. A hint, not a reservation: spares are chosen again on
every pass (spares.py), and a starter on a node that is no longer the spare is unused.
"""

from __future__ import annotations

from collections.abc import Set

import placement

MAX_NAMED = 4  # a job prepares at most this many spares (each starter holds torch in memory)


def of_pool(snapshot: placement.Snapshot, agent_id: str, pool: str,
            among: Set[str] | None = None) -> tuple[str, ...]:
    """The spares of ``agent_id``'s ``pool`` in ``snapshot`` (within ``among`` when given),
    in the order spares are chosen (highest ids first), at most :data:`MAX_NAMED`."""
    spares = snapshot.spares if among is None else among
    if not spares:
        return ()
    ids = sorted((n.id for n in snapshot.nodes
                  if n.id in spares and n.agent_id == agent_id and n.pool == pool), reverse=True)
    return tuple(ids[:MAX_NAMED])
