"""Launch refusal backoff: what the broker does when a region agent refuses a Launch.

Why: an agent refuses a Launch it can never run (the job's ``checkpoint_uri`` is
outside its ``--checkpoint-root``, the job's user cannot run there, the workdir
cannot be fetched). Treated as a plain loss, the job was requeued and re-admitted
onto the same agent at once: hundreds of launches a second, an event storm, and no
word to the user. Now a refusal is data on the job (``Job.refusals``,
``Job.launch_refusals``) and the decision is this module's pure functions:

* the refusing agent is left out *for this job* for ``base x 2^(n-1)`` seconds
  (``n`` = refusals in a row, capped at ``launch_backoff_max_s``), like Kubernetes'
  CrashLoopBackOff and Kueue's ``requeuingStrategy`` (``backoffBaseSeconds``,
  ``backoffMaxSeconds``, ``requeueState.count``/``requeueAt``); other agents and
  regions may take the job at once, so a region-specific refusal costs one launch;
* the refusal is the job's pending reason (a stable text: it names an absolute
  retry time, so it is not rewritten every scheduler pass) and one
  ``launch_refused`` event per *distinct* refusal (a new agent or a new reason),
  not one per retry;
* after ``launch_refusal_limit`` refusals in a row with no attempt running in
  between, the job FAILS with the last reason (Kueue's ``backoffLimitCount``
  deactivates the workload likewise): a user would rather read "refused: fix X and
  resubmit" than find a job pending forever. ``launch_refusal_limit: 0`` keeps it
  PENDING instead, retrying at the capped interval.

The count is reset when an attempt reaches RUNNING (:meth:`broker.jobs.lifecycle.Tx.move`).
"""

from __future__ import annotations

import enum
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from computebroker.v1 import agent_pb2 as apb
    from computebroker.v1 import common_pb2 as pb


class RefusalAction(enum.Enum):
    """What a refused launch does to the job."""

    REQUEUE = "requeue"  # back to PENDING; the refusing agent is left out until `until`
    GIVE_UP = "give_up"  # too many refusals in a row: the job fails


@dataclass(frozen=True)
class RefusalDecision:
    action: RefusalAction
    refusals: int  # refusals in a row, this one included
    delay_s: float  # how long the refusing agent is left out for this job
    until: float  # now + delay_s
    distinct: bool  # a new agent or a new reason: worth a "launch_refused" event


def backoff_delay(n: int, base_s: float, max_s: float) -> float:
    """Seconds the refusing agent is avoided after the ``n``-th refusal in a row:
    ``base_s x 2^(n-1)``, at most ``max_s`` (0 for n < 1)."""
    if n < 1:
        return 0.0
    return min(max_s, base_s * 2.0 ** min(n - 1, 62))


_ATTEMPT = re.compile(r"attempt[-_ #]?\d+")


def same_reason(a: str, b: str) -> bool:
    """Two refusals say the same thing, whichever attempt they name (an agent quotes the
    attempt's checkpoint URI, ``.../attempt-3``, which changes on every retry)."""
    return _ATTEMPT.sub("attempt-N", a) == _ATTEMPT.sub("attempt-N", b)


def _entry(job: pb.Job, agent_id: str) -> pb.LaunchRefusal | None:
    return next((r for r in job.refusals if r.agent_id == agent_id), None)


def decide(job: pb.Job, agent_id: str, reason: str, now: float, config: BrokerConfig) -> RefusalDecision:
    """The decision for one more refusal of ``job``'s launch by ``agent_id``."""
    n = job.launch_refusals + 1
    delay = backoff_delay(n, config.launch_backoff_base_s, config.launch_backoff_max_s)
    old = _entry(job, agent_id)
    distinct = old is None or not same_reason(old.message, reason)
    limit = config.launch_refusal_limit
    action = RefusalAction.GIVE_UP if limit and n >= limit else RefusalAction.REQUEUE
    return RefusalDecision(action=action, refusals=n, delay_s=delay, until=now + delay,
                           distinct=distinct)


def record(job: pb.Job, agent_id: str, region: str, reason: str, d: RefusalDecision,
           now: float) -> None:
    """Write ``d`` into ``job`` (a transaction's private copy)."""
    job.launch_refusals = d.refusals
    e = _entry(job, agent_id)
    if e is None:
        e = job.refusals.add(agent_id=agent_id)
    e.region = region or e.region
    e.message = reason
    e.count += 1
    e.time = now
    e.until = d.until


def reset(job: pb.Job) -> None:
    """An attempt runs: refusals no longer come in a row (the per-agent entries stay,
    and keep their agent out until they expire)."""
    job.launch_refusals = 0


def avoided_agents(job: pb.Job, now: float) -> frozenset[str]:
    """Agents the scheduler must not place ``job`` on now."""
    if not job.refusals:  # nearly every job, every pass: no generator, one shared set
        return _NONE
    return frozenset(r.agent_id for r in job.refusals if r.until > now)


_NONE: frozenset[str] = frozenset()


def seconds(d: float) -> str:
    """A backoff for people: ``0.3s``, ``40s``, ``5m``."""
    if d < 10:
        return f"{d:.1f}s"
    return f"{d:.0f}s" if d < 600 else f"{d / 60:.0f}m"


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(t))


def pending_note(job: pb.Job, now: float) -> str:
    """The pending reason while any refusal keeps an agent out ("" = none): stable
    between scheduler passes (absolute retry times), so it is written once."""
    if not job.refusals:
        return ""
    active = sorted((r for r in job.refusals if r.until > now), key=lambda r: r.until)
    if not active:
        return ""
    parts = [f"{r.agent_id} ({r.region or '?'}) refused the launch: {r.message or 'no reason given'};"
             f" not placed there again before {_clock(r.until)}" for r in active]
    return (f"launch refused {job.launch_refusals} time(s) in a row: " if job.launch_refusals > 1
            else "") + " | ".join(parts)


def give_up_message(job: pb.Job, agent_id: str, reason: str) -> str:
    """The FAILED message: what refused, how often, and what to do."""
    others = sorted({r.agent_id for r in job.refusals} - {agent_id})
    return (f"gave up after {job.launch_refusals} refused launches in a row (no attempt started"
            f" in between); last refusal by agent {agent_id}: {reason or 'no reason given'}"
            + (f"; also refused by {', '.join(others)}" if others else "")
            + ". Fix the cause (e.g. a checkpoint_uri under the region's allowed roots, a user"
              " the agents may run as) and resubmit")


def fingerprint(reg: apb.Register) -> tuple:
    """What of an agent's Register decides whether it may now accept what it refused:
    its checkpoint roots and store (and executor, version). A re-registration that
    changes it (an operator fixed ``--checkpoint-root`` and restarted the agent) ends
    that agent's avoidances at once; a plain reconnect does not."""
    return (tuple(reg.checkpoint_roots), reg.checkpoint_bucket, reg.checkpoint_store_error,
            reg.executor, reg.version)


def forget(job: pb.Job, agent_id: str, now: float) -> bool:
    """End ``agent_id``'s avoidance of ``job`` now (its entry stays, as history; the
    count of refusals in a row is kept, so a fix that did not work still ends in
    giving up). False if it was not avoided."""
    hit = False
    for r in job.refusals:
        if r.agent_id == agent_id and r.until > now:
            r.until = now
            hit = True
    return hit
