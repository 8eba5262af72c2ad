"""Address a job the way people remember it: its id, a unique prefix of the id, or its name.

Why in the CLI and not the broker: the broker's API takes exact ids (what scripts and the
SDK must use, so a rename can never retarget them); people type ``brokerctl logs j-66a``
or ``brokerctl job my-sweep``. One lookup, in this order, decides:

1. the exact id (one GetJob; nothing is listed when it exists);
2. a unique id prefix among the jobs the caller can list;
3. a job name: the newest live job of that name, else the newest of that name.

Ambiguity is an error that lists the candidates; nothing is guessed.
"""

from __future__ import annotations

from brokerctl.common import UsageError
from brokersdk.client import TERMINAL_PHASES, BrokerClient, JobNotFound, NotFound

MIN_PREFIX = 3  # "j-" and one character: anything shorter matches everything


def resolve_job_id(client: BrokerClient, ref: str) -> str:
    """The job id ``ref`` names (see the module docstring), or UsageError / JobNotFound."""
    ref = ref.strip()
    if not ref:
        raise UsageError("a job id, id prefix or name is required")
    try:
        return client.get_job(ref).id
    except NotFound:
        pass
    jobs = list(client.jobs())
    if len(ref) >= MIN_PREFIX:
        by_prefix = [j for j in jobs if j.id.startswith(ref)]
        if len(by_prefix) == 1:
            return by_prefix[0].id
        if len(by_prefix) > 1:
            shown = ", ".join(sorted(j.id for j in by_prefix)[:5])
            raise UsageError(f"{ref!r} matches {len(by_prefix)} jobs ({shown}"
                             f"{', ...' if len(by_prefix) > 5 else ''}): give more of the id")
    named = sorted((j for j in jobs if j.spec.name == ref), key=lambda j: j.created_time)
    if named:
        live = [j for j in named if j.phase not in TERMINAL_PHASES]
        if len(live) > 1:
            shown = ", ".join(j.id for j in live[-5:])
            raise UsageError(f"{len(live)} live jobs are named {ref!r} ({shown}): use an id")
        return (live or named)[-1].id
    raise JobNotFound(f"no job with id, id prefix or name {ref!r}",
                      hint="list jobs with `brokerctl jobs`")
