"""Checkpoints by owner: a job writes only under its own prefix and resumes only from its
own checkpoints or from a job that shared them with its team.

Why: per-team identities keep teams apart on an agent host, but two jobs of one team
share a uid, and the broker used to compare checkpoint URIs as strings only. Job B could
name job A's directory as its ``checkpoint_uri``: it resumed from A's checkpoints *and
wrote into them* (A's relaunch then picked up B's). The rule, applied at submit (here,
from the API), at launch (broker/jobs/ops.py) and by the agent (region_agents/
resume_views.py), is:

* **own prefix**: a job's checkpoint prefix is its ``spec.checkpoint_uri`` or the
  broker's ``<store>/jobs/<job id>``. A ``checkpoint_uri`` that equals, contains or lies
  inside another job's prefix, or inside a store's ``jobs/`` area (the broker's default
  prefixes), is refused;
* **resume from another job** only through ``spec.resume_from`` (never by sharing a
  prefix), and only when that job has a share in force for the reader's team. A share is
  granted by the job's owner (own team only) or a team admin of the job's team (any
  team), recorded on the job (``Job.checkpoint_shares``, an event, the audit log) and
  revocable; a revoked share refuses jobs that have not yet started from it;
* the reader only ever reads: its own checkpoints go under its own prefix, and the agent
  hands a local source to the ranks as a read-only copy.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterable, Sequence

from broker.api.errors import FailedPrecondition, InvalidArgument, NotFound
from broker.auth.identity import Principal, Role
from broker.auth.policy import PermissionDenied
from broker.jobs.outcome import Outcome, begin, seal
from broker.store.checkpoint_index import ancestor_keys, descendant_range
from checkpoint_layout.names import parse_step
from checkpoint_layout.roots import RootError, canonical
from computebroker.v1 import common_pb2 as pb

JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# The jobs whose chosen prefix has one of the keys, or a key in the range (the store's
# index, broker/store/checkpoint_index.py; JobsView.checkpoint_prefix_jobs).
PrefixJobs = Callable[[Sequence[str], "tuple[str, str] | None"], list[pb.Job]]

SHARE_HOW = ("the job's owner (or a team admin, for another team) can share it:"
             " `brokerctl share JOB_ID [--team TEAM]`")


def _key(uri: str) -> tuple[str, tuple[str, ...]]:
    """``(scheme, path components)`` of a canonical URI: a prefix test on the components
    is a containment test (no ``..``, no doubled slashes)."""
    scheme, loc = canonical(uri)
    return scheme, tuple(p for p in loc.split("/") if p)


def contains(outer: str, inner: str) -> bool:
    """True when ``inner`` is ``outer`` or lies inside it (segment-wise)."""
    (s1, a), (s2, b) = _key(outer), _key(inner)
    return s1 == s2 and b[: len(a)] == a


def overlaps(a: str, b: str) -> bool:
    return contains(a, b) or contains(b, a)


def default_prefix(base: str, job_id: str) -> str:
    """The broker's prefix for a job that chose none (transitions.checkpoint_uri_for)."""
    return f"{base.rstrip('/')}/jobs/{job_id}"


def job_prefixes(job: pb.Job, bases: Iterable[str]) -> list[str]:
    """Every prefix ``job`` may have written under: its own choice, else its default
    prefix in each store (a job moved between regions wrote in several)."""
    if job.spec.checkpoint_uri:
        return [job.spec.checkpoint_uri.rstrip("/")]
    return [default_prefix(b, job.id) for b in bases]


def usable_bases(bases: Iterable[str]) -> list[str]:
    """The stores whose ``jobs/`` area holds default prefixes (canonical ones only)."""
    out = []
    for b in bases:
        try:
            canonical(b)
        except RootError:
            continue
        out.append(b.rstrip("/"))
    return out


def check_write_prefix(spec: pb.JobSpec, prefix_jobs: PrefixJobs, bases: Iterable[str]) -> None:
    """Refuse a ``checkpoint_uri`` that is (or holds, or lies in) another job's prefix:
    the candidates are read from the store's index (the prefixes above ``uri`` by key,
    those below it by one key range), never by reading every job."""
    uri = spec.checkpoint_uri
    if not uri:
        return
    for base in usable_bases(bases):
        if overlaps(f"{base}/jobs", uri):
            raise FailedPrecondition(
                f"spec.checkpoint_uri {uri!r} overlaps {base}/jobs, where the broker keeps"
                " each job's own checkpoints: a job writes only under its own prefix. Leave"
                " checkpoint_uri empty, or choose a directory no other job uses; to start"
                " from another job's checkpoints use resume_from")
    for job in prefix_jobs(ancestor_keys(uri), descendant_range(uri)):
        if job.spec.checkpoint_uri and overlaps(job.spec.checkpoint_uri, uri):
            raise FailedPrecondition(
                f"spec.checkpoint_uri {uri!r} overlaps {job.spec.checkpoint_uri!r}, the"
                f" checkpoints of job {job.id}: a job writes only under its own prefix."
                " Choose a directory no other job uses; to start from that job's"
                " checkpoints use resume_from (it must be shared with your team)")


def active_share(source: pb.Job, team: str) -> pb.CheckpointShare | None:
    """The share in force that lets ``team``'s jobs read ``source``'s checkpoints."""
    for s in source.checkpoint_shares:
        if s.grantee_team == team and not s.revoked_time:
            return s
    return None


def owner_of(uri: str, prefix_jobs: PrefixJobs | None, bases: Iterable[str],
             find: Callable[[str], pb.Job | None]) -> tuple[pb.Job, str] | None:
    """(the job whose prefix holds ``uri``, that prefix), or None. A default prefix is
    recognised by its shape (``<store>/jobs/<id>/...``, one lookup); a chosen one by the
    store's prefix index (one exact key per leading run of ``uri``'s segments)."""
    scheme, parts = _key(uri)
    for base in usable_bases(bases):
        bscheme, bparts = _key(base)
        n = len(bparts)
        if (bscheme == scheme and parts[:n] == bparts and len(parts) > n + 1
                and parts[n] == "jobs"):
            job = find(parts[n + 1])
            if job is not None and not job.spec.checkpoint_uri:
                return job, default_prefix(base, job.id)
    for job in prefix_jobs(ancestor_keys(uri), None) if prefix_jobs is not None else ():
        if job.spec.checkpoint_uri and contains(job.spec.checkpoint_uri, uri):
            return job, job.spec.checkpoint_uri.rstrip("/")
    return None


def resolve_resume(spec: pb.JobSpec, prefix_jobs: PrefixJobs, bases: Iterable[str],
                   find: Callable[[str], pb.Job | None]) -> None:
    """Check ``spec.resume_from`` and fill ``spec.resume_source`` (or clear it): the
    source job, its prefix, the exact checkpoint and the share in force for the team.
    Raises a BrokerError naming the rule and how to share."""
    spec.ClearField("resume_source")
    want = spec.resume_from.strip()
    if not want:
        return
    if "://" not in want and not want.startswith("/"):
        if not JOB_ID_RE.match(want):
            raise InvalidArgument(f"spec.resume_from {want!r} is neither a job id nor a"
                                  " checkpoint URI (/path, file:///path, s3://bucket/prefix)")
        source = find(want)
        if source is None or _hidden(source, spec.team):
            raise NotFound(f"spec.resume_from names job {want}, which does not exist{UNSEEN}")
        uri = source.progress.last_checkpoint_uri
        if not uri:
            raise FailedPrecondition(f"spec.resume_from: job {want} has no durable checkpoint"
                                     " yet; wait for one (brokerctl job shows it)")
        prefix = job_prefixes(source, bases)[0] if source.spec.checkpoint_uri else ""
        if not prefix:
            found = owner_of(uri, None, bases, find)
            prefix = found[1] if found else uri.rsplit("/", 2)[0]
    else:
        try:
            canonical(want)
        except RootError as e:
            raise InvalidArgument(f"spec.resume_from: {e}") from None
        if parse_step(want.rstrip("/").rsplit("/", 1)[-1]) is None:
            raise InvalidArgument(f"spec.resume_from {want!r} names no checkpoint step"
                                  " directory (.../step-000000100); or give the job id to"
                                  " start from its last durable checkpoint")
        found = owner_of(want, prefix_jobs, bases, find)
        if found is None or _hidden(found[0], spec.team):
            raise FailedPrecondition(
                f"spec.resume_from {want!r} is not inside any job's checkpoints: a job"
                f" resumes only from checkpoints a job wrote (its own, or one shared with"
                f" its team){UNSEEN}")
        source, prefix = found
        uri = want.rstrip("/")
    if spec.checkpoint_uri and overlaps(prefix, spec.checkpoint_uri):
        raise FailedPrecondition(f"spec.checkpoint_uri {spec.checkpoint_uri!r} is job"
                                 f" {source.id}'s prefix: a job never writes where it reads")
    share = active_share(source, spec.team)
    if share is None:
        raise PermissionDenied(
            f"spec.resume_from: the checkpoints of job {source.id} are not shared with team"
            f" {spec.team!r}. A job resumes only from its own checkpoints or from ones"
            f" shared with its team; {SHARE_HOW}")
    spec.resume_source.CopyFrom(pb.ResumeSource(job_id=source.id, team=source.spec.team,
                                                prefix=prefix, uri=uri, share_id=share.id))


UNSEEN = ("; another team's job is named only once that team shared its checkpoints with"
          " yours (ask a team admin of that team)")


def _hidden(source: pb.Job, team: str) -> bool:
    """Another team's job that shared nothing with ``team``: answered exactly as a job
    that does not exist (no id of another team is ever confirmed)."""
    return source.spec.team != team and active_share(source, team) is None


def launch_refusal(job: pb.Job, source: pb.Job | None) -> str:
    """Why ``job`` may not start from its ``resume_source`` now ("" = it may): checked at
    every launch before the job has a checkpoint of its own."""
    src = job.spec.resume_source
    if not src.job_id or job.progress.last_checkpoint_uri:
        return ""
    if source is None:
        return f"job {src.job_id}, whose checkpoints it starts from, no longer exists"
    share = active_share(source, job.spec.team)
    if share is None:
        gone = next((s for s in source.checkpoint_shares if s.id == src.share_id), None)
        who = f" by {gone.revoked_by}" if gone is not None and gone.revoked_by else ""
        return (f"the share of job {src.job_id}'s checkpoints with team {job.spec.team!r}"
                f" was revoked{who}; it cannot start from them. {SHARE_HOW}")
    return ""


# ---- grant and revoke: who may, and the writes ---------------------------------------------
def check_may_grant(who: Principal, job: pb.Job, grantee_team: str) -> None:
    """The job's owner shares with the own team; another team needs a team admin of the
    job's team (or an operator). PermissionDenied says which."""
    if who.role is Role.OPERATOR:
        return
    admin = who.role is Role.TEAM_ADMIN and who.team == job.spec.team
    if grantee_team != job.spec.team and not admin:
        raise PermissionDenied(
            f"sharing job {job.id}'s checkpoints with another team ({grantee_team!r}) needs"
            f" a team admin of {job.spec.team!r}")
    if not admin and job.owner != who.actor:
        raise PermissionDenied(
            f"only job {job.id}'s owner ({job.owner or 'unknown'}) or a team admin of"
            f" {job.spec.team!r} may share its checkpoints")


def grant(job: pb.Job, grantee_team: str, actor: str, now: float) -> Outcome | None:
    """Record a share on the job (an event says who and for whom); an existing share in
    force for the team is kept as it is (granting twice changes nothing)."""
    if active_share(job, grantee_team) is not None:
        return None
    tx = begin(job, now)
    s = tx.job.checkpoint_shares.add(id=f"share-{secrets.token_hex(6)}", job_id=job.id,
                                     grantee_team=grantee_team, granted_by=actor,
                                     granted_time=now)
    tx.note("checkpoints_shared", reason="share", actor=actor,
            message=f"checkpoints shared with team {grantee_team} ({s.id}) by {actor}",
            details={"share_id": s.id, "grantee_team": grantee_team})
    return seal(tx)


def revoke(job: pb.Job, share_id: str, actor: str, now: float) -> Outcome | None:
    """Mark the share revoked (it stays on the record); NotFound for an unknown id."""
    idx = next((i for i, s in enumerate(job.checkpoint_shares) if s.id == share_id), None)
    if idx is None:
        raise NotFound(f"job {job.id} has no checkpoint share {share_id!r}")
    if job.checkpoint_shares[idx].revoked_time:
        return None
    tx = begin(job, now)
    s = tx.job.checkpoint_shares[idx]
    s.revoked_by, s.revoked_time = actor, now
    tx.note("checkpoint_share_revoked", reason="share", actor=actor,
            message=f"checkpoint share {share_id} with team {s.grantee_team} revoked by {actor}",
            details={"share_id": share_id, "grantee_team": s.grantee_team})
    return seal(tx)
