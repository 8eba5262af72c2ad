"""Team quotas, cohorts, lending and borrowing (HyperPod task governance / Kueue parity).

Model (per team and accelerator, *global across regions*):

* ``guaranteed`` (Kueue's nominal quota): always reclaimable by the team.
* ``used``: GPUs its running jobs hold.  ``borrowed = max(0, used - guaranteed)``.
* A team in a cohort with ``can_lend`` lends idle guarantee:
  ``lendable = min(lend_limit, guaranteed - used - pending_demand)``.
  *Demand-aware lending*: quota the team's own queued jobs are waiting for is not
  idle, so it is not lent. Lending it would only buy an immediate reclaim next pass
  (work thrown away on both sides); Kueue lends it and then reclaims.
* A borrower may hold ``borrowed <= borrow_limit`` and the cohort's total borrowing
  may not exceed the sum of its members' lendable quota, plus, in the scheduler's last
  phase only, the *surplus*: usable capacity that no team's guarantee covers
  (``capacity - sum of all guarantees``, e.g. a training plan's nodes while it runs when
  the guarantees were sized for the standing fleet). Nobody is entitled to those GPUs,
  so lending them can never cost an owner its guarantee; without it they stayed idle
  while a bursting team queued (:meth:`QuotaLedger.lend_surplus`).
* Resource key: a job's accelerator when its team has a quota line for it, else
  ``""`` (the team's "any accelerator" line).

Snapshot with no TeamQuota at all = quotas off (every job is admissible, as in a
single-team demo). Once any team has a quota, a team without one has nothing
guaranteed and no cohort, so its jobs stay pending with a reason saying so.

:func:`team_usage` is the read-only view the broker shows (``brokerctl teams``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from operator import attrgetter

from placement.model import JobRequest, RunningJob, Snapshot, TeamQuota

INF = math.inf
_team_acc = attrgetter("team", "accelerator")  # (team, accelerator) of a job, built in C


@dataclass(frozen=True, slots=True)
class ResourceUsage:
    """One team's usage of one quota line (accelerator; "" = any)."""

    accelerator: str
    guaranteed: int
    used: int
    lent: int  # of its idle guarantee, currently used by cohort members
    borrowed: int  # above its guarantee, from the cohort
    pending: int  # GPUs its pending jobs ask for


@dataclass(frozen=True, slots=True)
class TeamUsage:
    """Totals over accelerators, plus the per-accelerator lines."""

    team: str
    cohort: str
    guaranteed: int
    used: int
    lent: int
    borrowed: int
    pending: int
    resources: tuple[ResourceUsage, ...] = field(default_factory=tuple)


class QuotaLedger:
    """Mutable quota accounting for one scheduling pass."""

    def __init__(self, teams: tuple[TeamQuota, ...], running: tuple[RunningJob, ...], pending: tuple[JobRequest, ...],
                 running_by_acc: dict[tuple[str, str], int] | None = None) -> None:
        """``running_by_acc``: GPUs running per (team, accelerator), when the caller
        keeps them up to date across passes (then ``running`` is not read)."""
        self.enabled = bool(teams)
        self.quota: dict[str, TeamQuota] = {t.team: t for t in sorted(teams, key=lambda t: t.team)}
        self.nominal: dict[tuple[str, str], int] = {}
        for t in self.quota.values():
            for acc, gpus in t.guaranteed:
                self.nominal[(t.team, acc)] = self.nominal.get((t.team, acc), 0) + gpus
        self.cohorts: dict[str, list[str]] = {}
        for t in self.quota.values():
            if t.cohort:
                self.cohorts.setdefault(t.cohort, []).append(t.team)
        self.used: dict[tuple[str, str], int] = {}
        self.demand: dict[tuple[str, str], int] = {}
        # room() results, valid until usage or demand changes (most jobs of a busy
        # pass change nothing, so this turns the cohort walk into a dict hit).
        self._room: dict[tuple[str, str], float] = {}
        self._cohort: dict[tuple[str, str], tuple[int, int]] = {}
        self._keys: dict[tuple[str, str], str] = {}
        self._share: dict[tuple[str, str], float] = {}  # like _room
        self.surplus = 0  # usable GPUs no guarantee covers, lendable once set (lend_surplus)
        # Totals per (team, accelerator) first, then per quota line: thousands of
        # pending jobs share a few dozen (team, accelerator) pairs.
        by_acc: dict[tuple[str, str], int] = {}
        if running_by_acc is not None:
            by_acc = running_by_acc
        else:
            for r in running:
                k = _team_acc(r)
                by_acc[k] = by_acc.get(k, 0) + r.gpus
        for (team, acc), gpus in by_acc.items():
            k = (team, self.key(team, acc))
            self.used[k] = self.used.get(k, 0) + gpus
        by_acc = {}
        for j in pending:
            k = _team_acc(j)
            by_acc[k] = by_acc.get(k, 0) + j.nodes * j.gpus_per_node
        for (team, acc), gpus in by_acc.items():
            k = (team, self.key(team, acc))
            self.demand[k] = self.demand.get(k, 0) + gpus

    def key(self, team: str, accelerator: str) -> str:
        """The quota line a job of ``team`` asking for ``accelerator`` is charged to (cached)."""
        ta = (team, accelerator)
        k = self._keys.get(ta)
        if k is None:
            k = self._keys[ta] = accelerator if accelerator and ta in self.nominal else ""
        return k

    def job_key(self, job: JobRequest) -> str:
        """``key(job.team, job.accelerator)``, with the pair built in C (once per
        pending job per pass)."""
        k = self._keys.get(_team_acc(job))
        return k if k is not None else self.key(job.team, job.accelerator)

    def guaranteed(self, team: str, key: str) -> int:
        return self.nominal.get((team, key), 0)

    def usage(self, team: str, key: str) -> int:
        return self.used.get((team, key), 0)

    def borrowed(self, team: str, key: str) -> int:
        k = (team, key)
        return max(0, self.used.get(k, 0) - self.nominal.get(k, 0))

    def lendable(self, team: str, key: str) -> int:
        q = self.quota.get(team)
        if q is None or not q.can_lend or not q.cohort:
            return 0
        k = (team, key)
        idle = self.nominal.get(k, 0) - self.used.get(k, 0) - self.demand.get(k, 0)
        limit = INF if q.lend_limit is None else q.lend_limit
        return int(max(0, min(limit, idle)))

    def lend_surplus(self, capacity: int) -> None:
        """From now on the cohorts may also borrow the usable capacity no guarantee
        covers: ``capacity`` (GPUs usable now) minus the sum of every team's guarantee.
        The scheduler calls it for its last phase, after every queued job had its turn
        with the guarantees alone."""
        self.surplus = max(0, capacity - sum(self.nominal.values()))
        self._room.clear()

    def surplus_left(self) -> int:
        """The surplus not yet borrowed: every cohort's borrowing beyond its members'
        lendable quota draws on it."""
        if not self.surplus:
            return 0
        keys = {k for _, k in self.nominal} | {k for _, k in self.used}
        taken = 0
        for cohort in sorted(self.cohorts):
            for key in sorted(keys):
                lendable, borrowed = self._cohort_totals(cohort, key)
                taken += max(0, borrowed - lendable)
        return max(0, self.surplus - taken)

    def within_guarantee(self, team: str, key: str, gpus: int) -> bool:
        if not self.enabled:
            return True
        k = (team, key)
        return self.used.get(k, 0) + gpus <= self.nominal.get(k, 0)

    def _cohort_totals(self, cohort: str, key: str) -> tuple[int, int]:
        """(sum of lendable, sum of borrowed) over a cohort's members on one line.
        Computed once, then kept up to date by ``_change`` in O(1)."""
        ck = (cohort, key)
        agg = self._cohort.get(ck)
        if agg is None:
            members = self.cohorts.get(cohort, ())
            agg = self._cohort[ck] = (
                sum(self.lendable(m, key) for m in members),
                sum(self.borrowed(m, key) for m in members),
            )
        return agg

    def borrow_room(self, team: str, key: str) -> int:
        """GPUs the team may still use above its current usage (headroom + borrowable)."""
        q = self.quota.get(team)
        k = (team, key)
        g, u = self.nominal.get(k, 0), self.used.get(k, 0)
        headroom = max(0, g - u)
        if q is None or not q.can_borrow or not q.cohort:
            return headroom
        limit = INF if q.borrow_limit is None else q.borrow_limit
        agg = self._cohort_totals(q.cohort, key)
        pool = agg[0] - self.lendable(team, key)  # what the others lend
        mine = max(0, u - g)
        left = pool - agg[1]
        if self.surplus:
            left = max(0, left) + self.surplus_left()
        new_borrow = max(0, min(limit - mine, left))
        return int(headroom + new_borrow)

    def room(self, team: str, key: str) -> float:
        """Most GPUs the team may add now (guarantee headroom + borrowable)."""
        if not self.enabled:
            return INF
        k = (team, key)
        r = self._room.get(k)
        if r is None:
            r = self._room[k] = self.borrow_room(team, key)
        return r

    def _change(self, team: str, key: str, used: int, demand: int) -> None:
        """Apply a usage/demand delta, keeping the cohort aggregate up to date in O(1).

        Runs once per admission, so lendable() and borrowed() are inlined here for
        the values before and after the change (same formulas)."""
        k = (team, key)
        u0, d0 = self.used.get(k, 0), self.demand.get(k, 0)
        u1 = u0 + used
        d1 = max(0, d0 + demand) if demand else d0
        if used:
            self.used[k] = u1
        if demand:
            self.demand[k] = d1
        self._room.clear()
        self._share.clear()
        q = self.quota.get(team)
        if q is None or not q.cohort:
            return
        ck = (q.cohort, key)
        agg = self._cohort.get(ck)
        if agg is None:
            return
        g = self.nominal.get(k, 0)
        l0 = l1 = 0
        if q.can_lend:
            limit = INF if q.lend_limit is None else q.lend_limit
            l0 = int(max(0, min(limit, g - u0 - d0)))
            l1 = int(max(0, min(limit, g - u1 - d1)))
        self._cohort[ck] = (agg[0] + l1 - l0, agg[1] + max(0, u1 - g) - max(0, u0 - g))

    def admit(self, team: str, key: str, gpus: int, requested: int) -> None:
        """A pending job of ``requested`` GPUs now holds ``gpus`` (elastic: fewer)."""
        self._change(team, key, gpus, -requested)

    def add(self, team: str, key: str, gpus: int) -> None:
        self._change(team, key, gpus, 0)

    def settle_demand(self, team: str, key: str, gpus: int) -> None:
        """A pending job stopped asking (admitted or given up on this pass)."""
        self._change(team, key, 0, -gpus)

    def share(self, team: str, key: str) -> float:
        """Fair-sharing order among borrowers: borrowed GPUs / weight (lower first)."""
        k = (team, key)
        s = self._share.get(k)
        if s is None:
            q = self.quota.get(team)
            w = q.weight if q is not None and q.weight > 0 else 1.0
            s = self._share[k] = max(0, self.used.get(k, 0) - self.nominal.get(k, 0)) / w
        return s

    def explain(self, team: str, key: str, gpus: int) -> str:
        if team not in self.quota:
            return f"team {team} has no quota (an operator sets one with `brokerctl teams`)"
        q = self.quota[team]
        acc = key or "any accelerator"
        g, u = self.guaranteed(team, key), self.usage(team, key)
        msg = f"team {team} over quota for {acc}: uses {u} of {g} guaranteed GPUs and needs {gpus} more"
        if not q.cohort or not q.can_borrow:
            return msg + " (borrowing disabled)"
        # The cohort totals, minus this team's own lending (same numbers as summing
        # over the other members, without the walk).
        lendable, taken = self._cohort_totals(q.cohort, key)
        pool = lendable - self.lendable(team, key)
        lim = "unlimited" if q.borrow_limit is None else str(q.borrow_limit)
        return msg + f"; cohort {q.cohort} has {max(0, pool - taken)} idle GPUs to lend (borrow limit {lim})"


def team_usage(snapshot: Snapshot) -> dict[str, TeamUsage]:
    """Per-team guaranteed / used / lent / borrowed / pending, for operators.

    ``lent`` attributes the cohort's borrowing to members with idle guarantee,
    in proportion to their idle GPUs (integers; remainder to the first teams by
    name), so the lent column of a cohort adds up to its borrowed column.
    """
    ledger = QuotaLedger(snapshot.teams, snapshot.running, snapshot.pending)
    teams = set(ledger.quota) | {r.team for r in snapshot.running} | {j.team for j in snapshot.pending}
    keys_by_team: dict[str, set[str]] = {t: set() for t in teams}
    for team, key in list(ledger.nominal) + list(ledger.used) + list(ledger.demand):
        keys_by_team[team].add(key)
    lent: dict[tuple[str, str], int] = {}
    for _cohort, members in sorted(ledger.cohorts.items()):
        for key in sorted({k for m in members for k in keys_by_team.get(m, ())}):
            borrowed = sum(ledger.borrowed(m, key) for m in members)
            idle = {
                m: max(0, ledger.guaranteed(m, key) - ledger.usage(m, key))
                for m in members
                if ledger.quota[m].can_lend
            }
            total_idle = sum(idle.values())
            if borrowed <= 0 or total_idle <= 0:
                continue
            give = min(borrowed, total_idle)
            shares = {m: give * v // total_idle for m, v in idle.items()}
            rest = give - sum(shares.values())
            for m in sorted(idle):
                if rest <= 0:
                    break
                if shares[m] < idle[m]:
                    shares[m] += 1
                    rest -= 1
            for m, v in shares.items():
                lent[(m, key)] = v
    out: dict[str, TeamUsage] = {}
    for team in sorted(teams):
        lines = []
        for key in sorted(keys_by_team[team]):
            lines.append(
                ResourceUsage(
                    accelerator=key,
                    guaranteed=ledger.guaranteed(team, key),
                    used=ledger.usage(team, key),
                    lent=lent.get((team, key), 0),
                    borrowed=ledger.borrowed(team, key) if ledger.enabled else 0,
                    pending=ledger.demand.get((team, key), 0),
                )
            )
        q = ledger.quota.get(team)
        out[team] = TeamUsage(
            team=team,
            cohort=q.cohort if q else "",
            guaranteed=sum(r.guaranteed for r in lines),
            used=sum(r.used for r in lines),
            lent=sum(r.lent for r in lines),
            borrowed=sum(r.borrowed for r in lines),
            pending=sum(r.pending for r in lines),
            resources=tuple(lines),
        )
    return out
