"""One admission's quota test outside a scheduling pass (an in-place relaunch).

Why here and not in the broker: a job that lost a node and is relaunched in place on
its survivors plus a spare (docs/recovery.md) is admitted before the pass's placement,
with its nodes already chosen, so it never reaches :func:`placement.schedule`. Its
team must still stay within its quota and borrowing *exactly* as any admission does,
so this reads the same :class:`placement.quota.QuotaLedger` the pass builds from the
same snapshot, with the same three sources of room in the same order: the team's
guarantee headroom, what its cohort lends (demand-aware: a lender's own queued work is
not lent), and, where somebody may borrow, the surplus no guarantee covers (the
pass's last phase); plus the team's region ceiling (``region_caps``).

What the relaunching job itself counts for: nothing on the running side (its failed
attempt released its GPUs when it was requeued), and its whole size on the demand side
(it is a queued job). So a team that was within its limits when the node failed finds
room for the whole job again -- even at exactly its limit, since the job's own GPUs are
what freed -- and a team that was over its limits (its guarantee lowered under it, or
the GPUs it borrowed reclaimed by the lender's queued work) does not: it must not keep
capacity by losing a node that ordinary admission would not give it.
"""

from __future__ import annotations

from collections import defaultdict

from placement.model import Snapshot
from placement.quota import QuotaLedger
from placement.scheduler import usable_nodes


class QuotaCheck:
    """The quota side of admissions decided outside the pass, against one snapshot.

    Admissions it accepts are charged (:meth:`charge`), so two relaunches in the same
    pass cannot both use the same room."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.ledger = QuotaLedger(snap.teams, snap.running, snap.pending)
        self.caps = {t.team: dict(t.region_caps) for t in snap.teams if t.region_caps}
        self.region_used: dict[tuple[str, str], int] = defaultdict(int)
        if self.caps:
            region_of = {n.id: n.region for n in snap.nodes}
            for r in snap.running:
                if r.team in self.caps:
                    for node_id, g in r.allocations:
                        self.region_used[(r.team, region_of.get(node_id, ""))] += g
        self._capacity: int | None = None

    def _surplus_capacity(self) -> int:
        """Usable GPUs now, as the pass's last phase counts them for the surplus."""
        if self._capacity is None:
            now_nodes, _ = usable_nodes(list(self.snap.nodes), {}, self.snap.now,
                                        self.snap.draining_regions)
            self._capacity = sum(n.gpus for n, _ in now_nodes)
        return self._capacity

    def short(self, team: str, accelerator: str, gpus: int, region: str) -> str:
        """Why ``gpus`` more GPUs for ``team`` in ``region`` are not admissible now
        ("" = they are): the reason text ordinary admission gives (pending reasons)."""
        led = self.ledger
        if not led.enabled and team not in self.caps:
            return ""
        key = led.key(team, accelerator)
        if led.enabled and not led.within_guarantee(team, key, gpus) and led.room(team, key) < gpus:
            borrows = any(q.can_borrow and q.cohort and q.borrow_limit != 0 for q in led.quota.values())
            room = 0.0
            if borrows:  # the pass's last phase: the surplus no guarantee covers
                led.lend_surplus(self._surplus_capacity())
                room = led.room(team, key)
                led.lend_surplus(0)
            if room < gpus:
                return led.explain(team, key, gpus)
        cap = self.caps.get(team, {}).get(region)
        if cap is not None and self.region_used[(team, region)] + gpus > cap:
            return (f"team {team} is at its region cap in {region}"
                    f" ({self.region_used[(team, region)]}/{cap} GPUs) and needs {gpus} more")
        return ""

    def charge(self, team: str, accelerator: str, gpus: int, region: str) -> None:
        """An admission this check accepted now holds ``gpus`` (and stops asking)."""
        led = self.ledger
        if led.enabled:
            led.admit(team, led.key(team, accelerator), gpus, gpus)
        if team in self.caps:
            self.region_used[(team, region)] += gpus

