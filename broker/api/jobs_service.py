"""JobService: what ML engineers call (SDK, ``brokerctl submit/jobs/job/cancel/logs``)."""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Callable

import grpc

from broker.agents.registry import AgentRegistry
from broker.api.errors import InvalidArgument, NotFound, rpc
from broker.api.validation import TEAM_RE, checkpoint_roots_of, validate_checkpoint_uri
from broker.auth.identity import Principal, Role
from broker.auth.interceptor import principal_of
from broker.auth.policy import Permission, PermissionDenied, allowed, authorize, sees_secrets
from broker.config import BrokerConfig
from broker.jobs import checkpoint_shares
from broker.jobs.lifecycle import TERMINAL
from broker.jobs.ops import JobOps
from broker.jobs.views import JobsView, job_not_found
from broker.logs.service import LogQuery
from broker.workdirs.blobstore import BlobStore
from broker.workdirs.checks import check_submit
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import jobs_pb2 as jpb
from computebroker.v1 import jobs_pb2_grpc

WATCH_POLL_S = 0.5  # safety-net re-read interval of a watcher (writes by another replica)


REDACTED = "<redacted>"


def actor_of(context: grpc.ServicerContext) -> str:
    """Who is calling, for event history: the authenticated principal, never a header."""
    return principal_of(context).actor


def visible(job: pb.Job, principal: Principal) -> pb.Job:
    """The job as ``principal`` may see it: env values only for the owning team
    (operators see the keys, values redacted: docs/architecture.md, "Authentication and authorization")."""
    if not job.spec.env or sees_secrets(principal, job.spec.team):
        return job
    out = pb.Job()
    out.CopyFrom(job)
    for key in out.spec.env:
        out.spec.env[key] = REDACTED
    return out


def without_series(job: pb.Job) -> pb.Job:
    """A list answer leaves out each job's loss curve (up to ~8 KB each: a page of jobs
    would carry thousands of points nobody asked for); GetJob carries it."""
    if not job.loss_series:
        return job
    out = pb.Job()
    out.CopyFrom(job)
    out.ClearField("loss_series")
    return out


def encode_token(last_id: str) -> str:
    return base64.urlsafe_b64encode(last_id.encode()).decode()


def decode_token(token: str) -> str:
    try:
        value = base64.urlsafe_b64decode(token.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError) as e:
        raise InvalidArgument(f"page_token {token!r} is not a token this server issued") from e
    if not value.startswith("j-"):
        raise InvalidArgument(f"page_token {token!r} is not a token this server issued")
    return value


def submit_checks(config: BrokerConfig, agents: AgentRegistry, blobs: BlobStore,
                  jobs: JobsView | None = None) -> Callable[[pb.JobSpec, Principal | None], None]:
    """SubmitJob's checks beyond the spec itself (the core's and each API worker's): a
    job-chosen checkpoint URI only under roots an operator allowed, and
    not another job's (checkpoint_shares.py); ``resume_from`` only from a job that shared
    its checkpoints with the team (fills ``resume_source``); then the users'-code checks
    (broker/workdirs/checks.py: command, workdir, checkpoint stores)."""
    def check(spec: pb.JobSpec, who: Principal | None = None) -> None:
        records = [a.record for a in agents.all()]
        if spec.checkpoint_uri:
            validate_checkpoint_uri(spec.checkpoint_uri, "spec.checkpoint_uri", checkpoint_roots_of(
                config.checkpoint_allowed_roots, config.checkpoint_root, records))
        if jobs is not None:
            bases = checkpoint_bases(config, records)
            # the jobs that chose a prefix near this one: the store's index, never a scan
            checkpoint_shares.check_write_prefix(spec, jobs.checkpoint_prefix_jobs, bases)
            checkpoint_shares.resolve_resume(spec, jobs.checkpoint_prefix_jobs, bases, jobs.find)
        else:
            spec.ClearField("resume_source")
        check_submit(spec, blobs, records, who)
    return check


def checkpoint_bases(config: BrokerConfig, records: list[apb.Register]) -> list[str]:
    """The stores whose ``jobs/<id>`` are the broker's default per-job prefixes."""
    bases = [os.path.abspath(config.checkpoint_root)]
    bases += [r.checkpoint_bucket for r in records if r.checkpoint_bucket.startswith(("s3://", "file://", "/"))]
    return bases


class JobService(jobs_pb2_grpc.JobServiceServicer):
    def __init__(self, ops: JobOps, jobs: JobsView, config: BrokerConfig,
                 submit_check: Callable[[pb.JobSpec, Principal | None], None] | None = None,
                 ) -> None:
        self.ops = ops
        self.jobs = jobs
        self.config = config
        # Extra submit-time checks (users' code: broker/workdirs/checks.py); raise BrokerError.
        self.submit_check = submit_check

    @rpc
    def SubmitJob(self, request: jpb.SubmitJobRequest, context: grpc.ServicerContext) -> jpb.SubmitJobResponse:
        if not request.HasField("spec"):
            raise InvalidArgument("spec is missing")
        if len(request.client_request_id) > 200:
            raise InvalidArgument("client_request_id is longer than 200 characters")
        who = principal_of(context)
        authorize(who, Permission.JOBS_SUBMIT, request.spec.team)
        if self.submit_check is not None:
            self.submit_check(request.spec, who)
        # The job's span (child of the SDK's, from the metadata); submit stores its traceparent.
        with self.ops.telemetry.job_span(context.invocation_metadata()):
            job, created = self.ops.submit(request.spec, request.client_request_id, who.actor)
        # CopyFrom, not the job= keyword: the keyword path copies a 3.5 KB job field by
        # field through Python (~2x the CPU of one C-level copy).
        out = jpb.SubmitJobResponse(created=created)
        out.job.CopyFrom(visible(job, who))
        return out

    def _readable(self, job_id: str, context: grpc.ServicerContext,
                  permission: Permission = Permission.JOBS_READ) -> pb.Job:
        """The job, if the caller may act on it (its own team, or an operator).

        Another team's job is NOT_FOUND with the very words of a job that does not
        exist: a PERMISSION_DENIED would confirm to a member that the id is real."""
        job = self.jobs.find(job_id)
        who = principal_of(context)
        if job is None or not allowed(who, permission, job.spec.team):
            if job is not None and not allowed(who, permission):
                authorize(who, permission)  # the role itself lacks it: say so
            raise NotFound(job_not_found(job_id))
        return job

    @rpc
    def GetJob(self, request: jpb.GetJobRequest, context: grpc.ServicerContext) -> pb.Job:
        if not request.job_id:
            raise InvalidArgument("job_id is empty")
        return visible(self._readable(request.job_id, context), principal_of(context))

    @rpc
    def ListJobs(self, request: jpb.ListJobsRequest, context: grpc.ServicerContext) -> jpb.ListJobsResponse:
        cfg = self.config
        size = request.page_size or cfg.default_page_size
        if size < 0 or size > cfg.max_page_size:
            raise InvalidArgument(f"page_size must be between 1 and {cfg.max_page_size} (got {request.page_size})")
        for ph in request.phases:
            if ph not in pb.JobPhase.values() or ph == pb.JOB_PHASE_UNSPECIFIED:
                raise InvalidArgument(f"phases contains {ph}, which is not a job phase")
        after = decode_token(request.page_token) if request.page_token else ""
        who = principal_of(context)
        team = request.team
        if who.role is not Role.OPERATOR and not team:
            team = who.team  # members and team admins list their own team's jobs
        authorize(who, Permission.JOBS_READ, team or who.team)
        jobs = self.jobs.list(team=team, phases=request.phases,
                              region=request.region, after_id=after, limit=size + 1)
        more = len(jobs) > size
        jobs = jobs[:size]
        return jpb.ListJobsResponse(
            jobs=[visible(without_series(j), who) for j in jobs], next_page_token=encode_token(jobs[-1].id) if more and jobs else "")

    @rpc
    def CancelJob(self, request: jpb.CancelJobRequest, context: grpc.ServicerContext) -> pb.Job:
        if not request.job_id:
            raise InvalidArgument("job_id is empty")
        self._readable(request.job_id, context, Permission.JOBS_CANCEL)
        return visible(self.ops.cancel(request.job_id, request.reason, actor_of(context)),
                       principal_of(context))

    @rpc
    def ShareCheckpoints(self, request: jpb.ShareCheckpointsRequest,
                         context: grpc.ServicerContext) -> pb.CheckpointShare:
        if not request.job_id:
            raise InvalidArgument("job_id is empty")
        job = self._readable(request.job_id, context, Permission.JOBS_SUBMIT)
        team = request.grantee_team or job.spec.team
        if not TEAM_RE.match(team):
            raise InvalidArgument(f"grantee_team {team!r} is not a team name")
        who = principal_of(context)
        checkpoint_shares.check_may_grant(who, job, team)
        return self.ops.share_checkpoints(job.id, team, who.actor)

    @rpc
    def RevokeCheckpointShare(self, request: jpb.RevokeCheckpointShareRequest,
                              context: grpc.ServicerContext) -> pb.CheckpointShare:
        if not request.job_id or not request.share_id:
            raise InvalidArgument("job_id and share_id are both needed")
        job = self._readable(request.job_id, context, Permission.JOBS_SUBMIT)
        share = next((s for s in job.checkpoint_shares if s.id == request.share_id), None)
        if share is None:
            raise NotFound(f"job {job.id} has no checkpoint share {request.share_id!r}")
        who = principal_of(context)
        # whoever may grant this share may end it
        checkpoint_shares.check_may_grant(who, job, share.grantee_team)
        return self.ops.revoke_checkpoint_share(job.id, share.id, who.actor)

    @rpc
    def WatchJob(self, request: jpb.WatchJobRequest, context: grpc.ServicerContext):
        """History after ``after_seq``, then live events; ends after the terminal event."""
        if not request.job_id:
            raise InvalidArgument("job_id is empty")
        jobs = self.jobs
        self._readable(request.job_id, context)  # NOT_FOUND / PERMISSION_DENIED first
        seq = max(0, request.after_seq)
        seen = jobs.hub.counter(request.job_id)
        while context.is_active():
            events = jobs.watch_events(request.job_id, seq, seen)  # one read for all watchers
            for ev in events:
                seq = ev.seq
                if ev.type == "progress" and not request.include_progress:
                    continue
                yield ev
            if any(ev.to_phase in TERMINAL for ev in events):
                return
            if not events and jobs.watch_get(request.job_id, seen).phase in TERMINAL:
                return
            if jobs.hub.closed:
                return
            seen = jobs.hub.wait(request.job_id, seen, WATCH_POLL_S)

    @rpc
    def GetJobEvents(self, request: jpb.GetJobEventsRequest, context: grpc.ServicerContext) -> jpb.GetJobEventsResponse:
        if not request.job_id:
            raise InvalidArgument("job_id is empty")
        if request.limit < 0:
            raise InvalidArgument("limit must be >= 0")
        self._readable(request.job_id, context)
        events = self.jobs.events(request.job_id, after_seq=request.after_seq, limit=request.limit)
        return jpb.GetJobEventsResponse(events=events)

    @rpc
    def GetJobLogs(self, request: jpb.GetJobLogsRequest, context: grpc.ServicerContext) -> jpb.GetJobLogsResponse:
        """Deprecated (one release, for old clients): the event history as text. The
        history is GetJobEvents; the ranks' output is StreamJobLogs."""
        if not request.job_id:
            raise InvalidArgument("job_id is empty")
        if request.tail_lines < 0:
            raise InvalidArgument("tail_lines must be >= 0")
        self._readable(request.job_id, context)
        tail = request.tail_lines or 100
        lines = [
            f"{ev.time:.3f} #{ev.seq} attempt={ev.attempt} {ev.type}"
            f"{' ' + ev.region if ev.region else ''}: {ev.message}"
            for ev in self.jobs.events(request.job_id)
            if ev.type != "progress"
        ]
        return jpb.GetJobLogsResponse(lines=lines[-tail:])

    @rpc
    def StreamJobLogs(self, request: jpb.StreamJobLogsRequest, context: grpc.ServicerContext):
        """Rank output: a header per attempt, then its lines (broker/logs/service.py)."""
        q = LogQuery.parse(request.job_id, request.follow,
                           request.rank if request.HasField("rank") else None,
                           request.attempt, request.tail)
        self._readable(q.job_id, context)
        yield from self.ops.job_logs.stream(q, context.is_active, lambda: self.jobs.hub.closed)

    @rpc
    def ListMigrations(self, request: jpb.ListMigrationsRequest,
                       context: grpc.ServicerContext) -> jpb.ListMigrationsResponse:
        """Recent moves, newest first. Why scan jobs: each job carries its own last
        moves (written with the phase change that caused them); a dedicated index is
        not worth it at the tens of thousands of jobs one broker holds."""
        limit = request.limit or 50
        if limit < 0 or limit > self.config.max_page_size:
            raise InvalidArgument(f"limit must be between 1 and {self.config.max_page_size}")
        who = principal_of(context)
        team = request.team
        if who.role is not Role.OPERATOR:
            if team and team != who.team:
                raise PermissionDenied(f"{who.actor} may see only team {who.team}'s migrations")
            team = who.team
        if request.job_id:
            jobs = [self._readable(request.job_id, context)]
        else:
            jobs = [j for j in self.jobs.iter() if j.migrations
                    and (not team or j.spec.team == team)]
        found = [m for j in jobs for m in j.migrations]
        found.sort(key=lambda m: (-m.started_time, m.job_id, -m.seq))
        return jpb.ListMigrationsResponse(migrations=found[:limit])
