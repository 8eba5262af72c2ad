"""Leave out of a pass the pending jobs the engine provably keeps pending for quota.

Why: under static per-team quotas (every team's ``borrow_limit`` is 0) the queues grow
long: on the Philly dev trace about 2,700 jobs wait per pass, and nearly all of them are
over their team's guarantee. ``placement.schedule`` visits each of them every pass only
to write "over quota" (about 60 % of the static-quota run's CPU time). The simulator
uses admissions and preemptions, not those reasons, so it hands the engine only the
jobs that might be admitted, preempt or reserve; the decisions are the same.

Why the decisions are the same (``placement/scheduler.py``, one pass), for a pending job
J of team T on quota line K when no team may borrow:

* T's room is ``guarantee - used`` (``QuotaLedger.borrow_room`` with a zero borrow
  limit); within a pass T's usage only grows (admissions stay inside the room, so no
  team ever borrows and no job of T is a *reclaim* victim), unless a job of T is a
  *priority* victim: a running job of T, preemptible or already stopping, with a lower
  priority than a pending job of T. Teams with such jobs are not filtered.
* So when J's smallest size (``min_nodes`` when elastic) exceeds T's room at the start,
  J is quota-blocked all pass: ``_try`` finds no quota, ``_preempt`` (quota-blocked)
  finds no lower-priority victim and returns before any search (it neither counts a
  search nor touches the capacity index), and J is left pending with a reason. Its only
  traces are caches keyed by job shape, and its memo entry could only answer "fail" for
  a job that would fail anyway (room only shrinks).
* Dropping J from the queue changes nothing for the others: the queue order is a sort,
  the borrowing phase serves teams by borrowed share (0 for all: nobody borrows), and
  J's demand only enters lending, which a zero borrow limit never uses.

The simulator's ``check`` mode runs the engine on the full queue as well and fails when
an admission, preemption or reservation differs (tests/simulator run with it).
"""

from __future__ import annotations

from operator import attrgetter

import placement
from placement.quota import QuotaLedger

_team_acc = attrgetter("team", "accelerator")


def applies(teams: tuple[placement.TeamQuota, ...]) -> bool:
    """Static quotas: some team has a quota and none may borrow."""
    return bool(teams) and all(t.borrow_limit == 0 or not t.can_borrow or not t.cohort for t in teams)


def placeable(snap: placement.Snapshot) -> tuple[placement.JobRequest, ...]:
    """``snap.pending`` without the jobs that stay quota-blocked for the whole pass."""
    if not snap.pending or not applies(snap.teams):
        return snap.pending
    led = QuotaLedger(snap.teams, snap.running, ())
    line: dict[tuple[str, str], tuple[str, str]] = {}  # (team, accelerator) -> (team, quota line)
    queue: dict[tuple[str, str], list[placement.JobRequest]] = {}  # per (team, line)
    top: dict[tuple[str, str], int] = {}  # (team, line) -> highest pending priority
    for j in snap.pending:
        ta = _team_acc(j)
        k = line.get(ta)
        if k is None:
            k = line[ta] = (ta[0], led.key(*ta))
            queue[k], top[k] = [], j.priority
        queue[k].append(j)
        if j.priority > top[k]:
            top[k] = j.priority
    unsafe: set[tuple[str, str]] = set()  # lines where a job of the team may be a victim
    for r in snap.running:
        if r.preemptible or r.stopping:
            k = (r.team, led.key(r.team, r.accelerator))
            if k in top and r.priority < top[k]:
                unsafe.add(k)
    keep: list[placement.JobRequest] = []
    for (team, key), jobs in queue.items():
        if (team, key) in unsafe or team not in led.quota or led.borrowed(team, key) > 0:
            keep += jobs
            continue
        r = led.room(team, key)
        keep += [j for j in jobs if j.gpus_per_node <= 0 or j.nodes <= 0
                 or (j.min_nodes if 0 < j.min_nodes < j.nodes else j.nodes) * j.gpus_per_node <= r]
    return tuple(keep) if len(keep) < len(snap.pending) else snap.pending
