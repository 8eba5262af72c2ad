"""Python SDK for Compute Broker: :class:`BrokerClient`, a thin layer over the gRPC API.

Why this shape: ML engineers want to say "2 nodes x 8 GPUs of the tiny model,
spot is fine" and get a handle they can wait on, not build protobufs by hand. The
package is split by job: ``spec.py`` (the pydantic :class:`JobSpec` and its wire
form), ``errors.py`` (typed errors), ``enums.py`` (enum names), ``handle.py``
(:class:`JobHandle`) and this module, the connection. Every public name is
re-exported here, so ``from brokersdk.client import X`` keeps working. This module
stays over 400 lines on purpose: it is one class, a thin wrapper per RPC (and the two
reconnecting streams, watch and logs) around one connection, failover and retry path.

Imports only the generated ``computebroker.v1`` stubs, grpc, pydantic, tenacity
and the standard library (the SDK uses only the stubs, docs/architecture.md), so it can be
shipped to users without the broker's internals.

Retries: calls that are safe to repeat (reads, SubmitJob with its client request
id, quota puts, drain/cordon) are retried on UNAVAILABLE with bounded exponential
backoff; the rest (cancel, plan creation) are not, because a retry after a lost
response would report a misleading error or do the thing twice.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import grpc
from tenacity import (
    Retrying as _Retrying,
)
from tenacity import (
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from brokersdk import tracing as telemetry
from brokersdk.credentials import ClientCredentials, make_channel, resolve
from brokersdk.enums import (
    TERMINAL_PHASES,
    CapacityType,
    MigrationCause,
    MigrationState,
    Phase,
    capacity_type_name,
    cause_name,
    parse_capacity_type,
    parse_phase,
    parse_plan_state,  # noqa: F401  (re-exported: the old import path)
    parse_strategy,
    parse_topology,
    phase_name,
    plan_state_name,  # noqa: F401  (re-exported: the old import path)
    strategy_name,  # noqa: F401  (re-exported: the old import path)
    topology_name,
)
from brokersdk.errors import (
    AlreadyExists,
    BrokerError,
    BrokerUnavailable,
    InvalidJobSpec,
    JobNotFound,
    NotAuthenticated,
    NotFound,
    PermissionDenied,
    PreconditionFailed,
    QuotaExceeded,
    translate_rpc_error,
)
from brokersdk.handle import JobHandle
from brokersdk.spec import JobSpec, TrainerSpec, _pydantic_message, spec_to_proto  # noqa: F401
from brokersdk.workdir import DEFAULT_MAX_BYTES, pack
from computebroker.v1 import (
    auth_pb2,
    auth_pb2_grpc,
    capacity_pb2,
    capacity_pb2_grpc,
    common_pb2,
    jobs_pb2,
    jobs_pb2_grpc,
    logs_pb2,
    workdir_pb2,
    workdir_pb2_grpc,
)

__all__ = [
    "AlreadyExists",
    "BrokerClient",
    "CapacityType",
    "MigrationCause",
    "MigrationState",
    "Phase",
    "cause_name",
    "BrokerError",
    "BrokerUnavailable",
    "InvalidJobSpec",
    "JobHandle",
    "JobNotFound",
    "JobSpec",
    "NotAuthenticated",
    "NotFound",
    "PermissionDenied",
    "PreconditionFailed",
    "QuotaExceeded",
    "TERMINAL_PHASES",
    "TrainerSpec",
    "capacity_type_name",
    "parse_capacity_type",
    "parse_phase",
    "parse_strategy",
    "parse_topology",
    "phase_name",
    "topology_name",
]

DEFAULT_ADDRESS = "127.0.0.1:50051"
_NO_DIGEST = "sha256:" + "0" * 64  # asks HasWorkdir for the broker's size limit only


def logs_request(job_id: str, follow: bool = False, rank: int | None = None,
                 attempt: int | None = None, tail: int | None = None) -> jobs_pb2.StreamJobLogsRequest:
    """StreamJobLogs request; None = no filter (the broker validates the values)."""
    req = jobs_pb2.StreamJobLogsRequest(job_id=job_id, follow=follow, attempt=attempt or 0,
                                        tail=tail or 0)
    if rank is not None:
        req.rank = rank
    return req


T = TypeVar("T")


class BrokerClient:
    """A connection to one broker, or to HA replicas given as ``"a:1,b:2"``.

    ``timeout`` is the deadline of each unary call in seconds; ``retries`` bounds
    how many extra tries an idempotent call gets when the broker is UNAVAILABLE.
    With several addresses, an UNAVAILABLE answer (a replica down, or a standby:
    broker/leadership.py) moves the client to the next address; idempotent calls
    retry there. Use as a context manager (or call :meth:`close`).
    """

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        timeout: float = 10.0,
        retries: int = 3,
        metadata: Sequence[tuple[str, str]] | None = None,
        credentials: ClientCredentials | None = None,
    ) -> None:
        # Credentials: given, else CB_* environment / the config file's context
        # (brokersdk/credentials.py); an address given here wins over the context's.
        self.credentials = credentials or resolve()
        if not address:
            address = self.credentials.server or DEFAULT_ADDRESS
        self.address = address
        self.timeout = timeout
        self.retries = max(0, retries)
        self.metadata = list(metadata or [])
        self.addresses = [a.strip() for a in address.split(",") if a.strip()] or [address]
        self._current = 0
        self._channels = [
            make_channel(
                a,
                self.credentials,
                options=[
                    ("grpc.keepalive_time_ms", 30_000),
                    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                ],
            )
            for a in self.addresses
        ]
        self._stubs = [
            (jobs_pb2_grpc.JobServiceStub(c), capacity_pb2_grpc.CapacityServiceStub(c),
             workdir_pb2_grpc.WorkdirServiceStub(c), auth_pb2_grpc.AuthServiceStub(c))
            for c in self._channels
        ]

    @property
    def _channel(self) -> grpc.Channel:
        return self._channels[self._current]

    @property
    def _auth(self) -> auth_pb2_grpc.AuthServiceStub:
        return self._stubs[self._current][3]

    @property
    def _jobs(self) -> jobs_pb2_grpc.JobServiceStub:
        return self._stubs[self._current][0]

    @property
    def _capacity(self) -> capacity_pb2_grpc.CapacityServiceStub:
        return self._stubs[self._current][1]

    @property
    def _workdirs(self) -> workdir_pb2_grpc.WorkdirServiceStub:
        return self._stubs[self._current][2]

    @property
    def current_address(self) -> str:
        return self.addresses[self._current]

    def _next_address(self) -> None:
        """After UNAVAILABLE: try the next replica (no-op with one address)."""
        self._current = (self._current + 1) % len(self.addresses)

    def _rebind(self, method: Callable[..., T]) -> Callable[..., T]:
        """The same RPC on the current address's stub (callers captured another's)."""
        for stubs in self._stubs:
            for k, stub in enumerate(stubs):
                for name, value in vars(stub).items():
                    if value is method:
                        return getattr(self._stubs[self._current][k], name)
        return method

    # -- plumbing

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def __repr__(self) -> str:
        return f"BrokerClient({self.address!r})"

    def _call(
        self,
        method: Callable[..., T],
        request: Any,
        *,
        idempotent: bool,
        job_id: str | None = None,
        timeout: float | None = None,
        extra_metadata: Sequence[tuple[str, str]] = (),
    ) -> T:
        metadata = [*self.metadata, *extra_metadata] or None

        def once() -> T:
            address = self.current_address
            try:
                return self._rebind(method)(request, timeout=timeout or self.timeout,
                                            metadata=metadata)
            except grpc.RpcError as e:
                err = translate_rpc_error(e, address, job_id=job_id)
                if isinstance(err, BrokerUnavailable):
                    self._next_address()
                raise err from None

        if not idempotent or self.retries == 0:
            return once()
        retrying = _Retrying(
            retry=retry_if_exception_type(BrokerUnavailable),
            stop=stop_after_attempt(self.retries + len(self.addresses))
            | stop_after_delay(self.timeout * 3),
            wait=wait_exponential(multiplier=0.2, max=2.0),
            reraise=True,
        )
        return retrying(once)

    # -- jobs

    def submit(
        self,
        spec: JobSpec | common_pb2.JobSpec | Mapping[str, Any],
        client_request_id: str | None = None,
        workdir_progress: Callable[[int, int], None] | None = None,
    ) -> JobHandle:
        """Submit a job; returns its handle. Idempotent on ``client_request_id``.

        A ``workdir`` that is a local directory is packaged and uploaded first
        (:meth:`upload_workdir`; ``workdir_progress(done, total)`` sees the bytes).

        A UUID is generated when none is given, so the SDK's own retries on a lost
        response never create a second job. ``handle.created`` is False when the
        broker already had a job for this request id.
        """
        if isinstance(spec, Mapping):
            built = JobSpec.from_dict(spec)
            spec = built
        if isinstance(spec, JobSpec) and spec.workdir and not spec.workdir.startswith("sha256:"):
            ref = self.upload_workdir(spec.workdir, progress=workdir_progress)
            wire = spec.to_proto(workdir=ref)
        else:
            wire = spec_to_proto(spec)
        request = jobs_pb2.SubmitJobRequest(
            spec=wire, client_request_id=client_request_id or str(uuid.uuid4())
        )
        # A "submit_job" span when the application traces; its traceparent travels in the
        # metadata and becomes the parent of the job's whole trace (broker/telemetry/metrics.py).
        with telemetry.client_span("submit_job", **{"cb.team": request.spec.team}) as trace_md:
            resp = self._call(self._jobs.SubmitJob, request, idempotent=True,
                              extra_metadata=trace_md)
            telemetry.set_attributes(**{"cb.job.id": resp.job.id, "cb.created": resp.created})
        return JobHandle(self, resp.job.id, job=resp.job, created=resp.created)

    # -- workdirs

    def has_workdir(self, digest: str) -> workdir_pb2.HasWorkdirResponse:
        """Whether the broker holds this workdir digest (and its size limit)."""
        return self._call(self._workdirs.HasWorkdir, workdir_pb2.HasWorkdirRequest(digest=digest),
                          idempotent=True)

    def upload_workdir(
        self,
        directory: str,
        progress: Callable[[int, int], None] | None = None,
        max_bytes: int | None = None,
        chunk_size: int = 1024 * 1024,  # measured fastest (benchmarks/bench_workdir.py)
    ) -> common_pb2.WorkdirRef:
        """Package ``directory`` (brokersdk/workdir.py) and upload it unless the broker
        already holds the same bytes; returns the ref to put in a spec.

        Raises :class:`InvalidJobSpec` when the directory is missing or over the limit
        (``max_bytes``, default the broker's ``workdir_max_bytes``), before sending data."""
        limit = max_bytes
        if limit is None:  # the broker's own limit (HasWorkdir answers it for any digest)
            limit = self.has_workdir(_NO_DIGEST).max_bytes or DEFAULT_MAX_BYTES
        try:
            packed = pack(directory, limit)
        except ValueError as e:
            raise InvalidJobSpec(str(e)) from None
        try:
            has = self.has_workdir(packed.digest)
            ref = common_pb2.WorkdirRef(digest=packed.digest, size_bytes=packed.size_bytes)
            if has.exists:
                if progress:
                    progress(packed.size_bytes, packed.size_bytes)
                return ref

            def chunks() -> Iterator[workdir_pb2.WorkdirChunk]:
                done = 0
                for i, data in enumerate(packed.chunks(chunk_size)):
                    yield workdir_pb2.WorkdirChunk(
                        digest=packed.digest if i == 0 else "",
                        size_bytes=packed.size_bytes if i == 0 else 0, data=data)
                    done += len(data)
                    if progress:
                        progress(done, packed.size_bytes)

            # Streams are not retried: a failed upload is cheap to repeat (same digest).
            timeout = max(self.timeout, 60.0 + packed.size_bytes / 1e6)
            return self._call(self._workdirs.UploadWorkdir, chunks(), idempotent=False,
                              timeout=timeout)
        except InvalidJobSpec as e:
            if "hash to" in e.message:  # files changed between hashing and sending
                raise InvalidJobSpec(f"files in {directory} changed during the upload;"
                                     " submit again") from None
            raise

    def job(self, job_id: str) -> JobHandle:
        """A handle on an existing job (raises JobNotFound if it does not exist)."""
        handle = JobHandle(self, job_id)
        handle.status()
        return handle

    def get_job(self, job_id: str) -> common_pb2.Job:
        return self._call(
            self._jobs.GetJob, jobs_pb2.GetJobRequest(job_id=job_id), idempotent=True, job_id=job_id
        )

    def jobs(
        self,
        team: str = "",
        phases: Iterable[str | int] = (),
        region: str = "",
        page_size: int = 0,
        limit: int | None = None,
    ) -> Iterator[common_pb2.Job]:
        """All matching jobs, fetching pages lazily (ListJobs pagination)."""
        token = ""
        seen = 0
        phase_values = [parse_phase(p) for p in phases]
        while True:
            resp = self._call(
                self._jobs.ListJobs,
                jobs_pb2.ListJobsRequest(
                    team=team,
                    phases=phase_values,
                    region=region,
                    page_size=page_size,
                    page_token=token,
                ),
                idempotent=True,
            )
            for job in resp.jobs:
                yield job
                seen += 1
                if limit is not None and seen >= limit:
                    return
            token = resp.next_page_token
            if not token:
                return

    def cancel(self, job_id: str, reason: str = "") -> common_pb2.Job:
        """Cancel a job (PreconditionFailed when it already finished). Not retried."""
        return self._call(
            self._jobs.CancelJob,
            jobs_pb2.CancelJobRequest(job_id=job_id, reason=reason),
            idempotent=False,
            job_id=job_id,
        )

    def share_checkpoints(self, job_id: str, team: str = "") -> common_pb2.CheckpointShare:
        """Let jobs of ``team`` (default: the job's own team) start from ``job_id``'s
        checkpoints (``resume_from``). The job's owner shares with the own team; another
        team needs a team admin of the job's team. Granting twice keeps the first share."""
        return self._call(
            self._jobs.ShareCheckpoints,
            jobs_pb2.ShareCheckpointsRequest(job_id=job_id, grantee_team=team),
            idempotent=True,
            job_id=job_id,
        )

    def revoke_checkpoint_share(self, job_id: str, share_id: str) -> common_pb2.CheckpointShare:
        """End a share: jobs that have not started from it yet are refused at launch."""
        return self._call(
            self._jobs.RevokeCheckpointShare,
            jobs_pb2.RevokeCheckpointShareRequest(job_id=job_id, share_id=share_id),
            idempotent=True,
            job_id=job_id,
        )

    def events(self, job_id: str, after_seq: int = 0, limit: int = 0) -> list[common_pb2.JobEvent]:
        """The job's recorded history (no live follow; see JobHandle.events)."""
        resp = self._call(
            self._jobs.GetJobEvents,
            jobs_pb2.GetJobEventsRequest(job_id=job_id, after_seq=after_seq, limit=limit),
            idempotent=True,
            job_id=job_id,
        )
        return list(resp.events)

    def watch(
        self,
        job_id: str,
        after_seq: int = 0,
        include_progress: bool = False,
        timeout: float | None = None,
    ) -> Iterator[common_pb2.JobEvent]:
        """Live events of a job until it is terminal (WatchJob server stream).

        Reconnects after a broken stream (resuming after the last seen seq) a
        bounded number of times. ``timeout`` bounds the whole watch: TimeoutError.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        last = after_seq
        reconnects = 0
        while True:
            remaining = None if deadline is None else max(0.001, deadline - time.monotonic())
            stream = self._jobs.WatchJob(
                jobs_pb2.WatchJobRequest(
                    job_id=job_id, after_seq=last, include_progress=include_progress
                ),
                timeout=remaining,
                metadata=self.metadata or None,
            )
            try:
                for event in stream:
                    if event.seq and event.seq <= last and event.type != "progress":
                        continue
                    if event.seq:
                        last = max(last, event.seq)
                    reconnects = 0
                    yield event
                return
            except grpc.RpcError as e:
                code = e.code()
                if code is grpc.StatusCode.DEADLINE_EXCEEDED and deadline is not None:
                    raise TimeoutError(
                        f"job {job_id} still not finished after {timeout:.0f}s"
                    ) from None
                if code is grpc.StatusCode.CANCELLED:
                    return
                if code is grpc.StatusCode.UNAVAILABLE and reconnects < self.retries:
                    reconnects += 1
                    self._next_address()
                    time.sleep(min(2.0, 0.2 * 2**reconnects))
                    continue
                raise translate_rpc_error(e, self.address, job_id=job_id) from None
            finally:
                stream.cancel()

    def logs(
        self,
        job_id: str,
        follow: bool = False,
        rank: int | None = None,
        attempt: int | None = None,
        tail: int | None = None,
    ) -> Iterator[logs_pb2.LogRecord]:
        """The ranks' stdout/stderr (StreamJobLogs): per attempt a header record
        (``.attempt``: region, world size, start), then its lines (``.line``), and
        ``.dropped_lines`` when the broker's size bound dropped the oldest ones.

        ``follow`` keeps streaming across relaunches and migrations until the job is
        terminal; after a broken stream it reconnects a bounded number of times and
        skips what it already yielded (lines are numbered per attempt), so nothing is
        shown twice.
        """
        req = logs_request(job_id, follow, rank, attempt, tail)
        seen: dict[int, int] = {}  # attempt -> last seq yielded
        current = 0  # attempt whose header was yielded last
        reconnects = 0
        while True:
            stream = self._jobs.StreamJobLogs(req, metadata=self.metadata or None)
            pending: logs_pb2.LogRecord | None = None  # a header waits for news of its attempt
            try:
                for rec in stream:
                    kind = rec.WhichOneof("kind")
                    if kind == "attempt":
                        if rec.attempt.attempt != current:
                            pending = rec
                        continue
                    if kind == "line":
                        if rec.line.seq <= seen.get(rec.line.attempt, 0):
                            continue
                        seen[rec.line.attempt] = rec.line.seq
                    if pending is not None:
                        current = pending.attempt.attempt
                        yield pending
                        pending = None
                    reconnects = 0
                    yield rec
                if pending is not None:
                    yield pending
                if not follow or reconnects >= self.retries or self._job_over(job_id):
                    return
                # The stream ended but the job goes on: the broker stopped (restart,
                # failover). Follow on from a replica or the restarted broker.
                reconnects += 1
                time.sleep(min(2.0, 0.2 * 2**reconnects))
                req.tail = 0
                continue
            except grpc.RpcError as e:
                code = e.code()
                if code is grpc.StatusCode.CANCELLED:
                    return
                if follow and code is grpc.StatusCode.UNAVAILABLE and reconnects < self.retries:
                    reconnects += 1
                    self._next_address()
                    time.sleep(min(2.0, 0.2 * 2**reconnects))
                    req.tail = 0  # resume: everything, minus what was already yielded
                    continue
                raise translate_rpc_error(e, self.address, job_id=job_id) from None
            finally:
                stream.cancel()

    def _job_over(self, job_id: str) -> bool:
        """Is the job terminal? (Unknown because the broker is away counts as not.)"""
        try:
            return self.get_job(job_id).phase in TERMINAL_PHASES
        except BrokerUnavailable:
            return False

    def migrations(self, job_id: str = "", team: str = "", limit: int = 0) -> list[common_pb2.Migration]:
        """Recent moves between capacity (newest first), optionally of one job or team."""
        resp = self._call(
            self._jobs.ListMigrations,
            jobs_pb2.ListMigrationsRequest(job_id=job_id, team=team, limit=limit),
            idempotent=True,
            job_id=job_id or None,
        )
        return list(resp.migrations)

    # -- capacity / operators

    def regions(self) -> list[capacity_pb2.RegionInfo]:
        resp = self._call(
            self._capacity.ListRegions, capacity_pb2.ListRegionsRequest(), idempotent=True
        )
        return list(resp.regions)

    def capacity(
        self, region: str = "", by_block: bool = False, include_nodes: bool = False
    ) -> capacity_pb2.GetCapacityResponse:
        return self._call(
            self._capacity.GetCapacity,
            capacity_pb2.GetCapacityRequest(
                region=region, by_block=by_block, include_nodes=include_nodes
            ),
            idempotent=True,
        )

    def teams(self) -> list[capacity_pb2.TeamQuota]:
        resp = self._call(self._capacity.ListTeams, capacity_pb2.ListTeamsRequest(), idempotent=True)
        return list(resp.teams)

    def usage_series(self, window_s: float = 3600.0, team: str = "") -> capacity_pb2.UsageSeries:
        """Per-team usage over the last ``window_s`` seconds (at most 24 h): queued jobs,
        admissions, GPUs held and spend rate per bucket (``step_s`` wide). Members get
        their own team's lines; operators every team's, or ``team``'s."""
        return self._call(
            self._capacity.GetUsageSeries,
            capacity_pb2.GetUsageSeriesRequest(window_s=window_s, team=team),
            idempotent=True,
        )

    def team(self, team: str) -> capacity_pb2.TeamQuota:
        return self._call(
            self._capacity.GetTeamQuota, capacity_pb2.GetTeamQuotaRequest(team=team), idempotent=True
        )

    def set_team_quota(
        self,
        team: str | capacity_pb2.TeamQuota,
        *,
        cohort: str = "",
        guaranteed: int | Mapping[str, int] | None = None,
        guaranteed_gpus: int | None = None,
        accelerator: str = "",
        borrow_limit: int | None = None,
        lend_limit: int | None = None,
        strategy: str | int = 0,
        fair_share_weight: float = 0.0,
        region_caps: Mapping[str, int] | None = None,
    ) -> capacity_pb2.TeamQuota:
        """Create or replace a team's quota (a put: safe to retry).

        ``guaranteed`` is a GPU count for any accelerator, or a mapping
        ``{"h100": 16, "": 4}`` of accelerator -> guaranteed GPUs (global across regions).
        ``guaranteed_gpus`` (+ ``accelerator``) is the single-entry spelling of the same.
        """
        if isinstance(team, capacity_pb2.TeamQuota):
            quota = team
        else:
            if guaranteed is None:
                guaranteed = guaranteed_gpus or 0
            per_accel = (
                {accelerator: guaranteed} if isinstance(guaranteed, int) else dict(guaranteed)
            )
            entries = []
            for accel, gpus in per_accel.items():
                entry = capacity_pb2.QuotaEntry(accelerator=accel, guaranteed_gpus=int(gpus))
                if borrow_limit is not None:
                    entry.borrow_limit_gpus = borrow_limit
                if lend_limit is not None:
                    entry.lend_limit_gpus = lend_limit
                for region, cap in (region_caps or {}).items():
                    entry.region_caps[region] = int(cap)
                entries.append(entry)
            quota = capacity_pb2.TeamQuota(
                team=team,
                cohort=cohort,
                strategy=parse_strategy(strategy) if strategy else 0,
                quotas=entries,
                fair_share_weight=fair_share_weight,
            )
        return self._call(
            self._capacity.SetTeamQuota,
            capacity_pb2.SetTeamQuotaRequest(quota=quota),
            idempotent=True,
        )

    def plans(self, region: str = "", include_ended: bool = False) -> list[capacity_pb2.TrainingPlan]:
        resp = self._call(
            self._capacity.ListTrainingPlans,
            capacity_pb2.ListTrainingPlansRequest(region=region, include_ended=include_ended),
            idempotent=True,
        )
        return list(resp.plans)

    def create_plan(
        self, plan: capacity_pb2.TrainingPlan | None = None, **fields: Any
    ) -> capacity_pb2.TrainingPlan:
        """Register a training plan: a pb TrainingPlan or its fields as keywords
        (name, region, zone, instance_type, accelerator, instance_count,
        gpus_per_instance, start_time, end_time, team, price_per_gpu_hour)."""
        if plan is None:
            try:
                plan = capacity_pb2.TrainingPlan(**fields)
            except (ValueError, TypeError) as e:
                raise InvalidJobSpec(f"bad training plan: {e}") from None
        return self._call(
            self._capacity.CreateTrainingPlan,
            capacity_pb2.CreateTrainingPlanRequest(plan=plan),
            idempotent=False,
        )

    def cancel_plan(self, plan_id: str) -> capacity_pb2.TrainingPlan:
        return self._call(
            self._capacity.CancelTrainingPlan,
            capacity_pb2.CancelTrainingPlanRequest(plan_id=plan_id),
            idempotent=False,
        )

    # -- priority classes (operators set/delete; everyone reads)

    def priority_classes(self) -> list[capacity_pb2.PriorityClass]:
        """The broker's live priority classes, highest value first (``is_default`` marks
        the class of jobs that name none)."""
        resp = self._call(self._capacity.ListPriorityClasses,
                          capacity_pb2.ListPriorityClassesRequest(), idempotent=True)
        return list(resp.priority_classes)

    def set_priority_class(self, name: str | capacity_pb2.PriorityClass, value: int = 0,
                           description: str = "") -> capacity_pb2.PriorityClass:
        """Create or update a class (a put: safe to retry). Higher values are admitted
        first and may preempt lower ones."""
        pc = name if isinstance(name, capacity_pb2.PriorityClass) else capacity_pb2.PriorityClass(
            name=name, value=int(value), description=description)
        return self._call(self._capacity.SetPriorityClass,
                          capacity_pb2.SetPriorityClassRequest(priority_class=pc), idempotent=True)

    def delete_priority_class(self, name: str) -> capacity_pb2.DeletePriorityClassResponse:
        """Delete a class no live job uses (FAILED_PRECONDITION otherwise)."""
        return self._call(self._capacity.DeletePriorityClass,
                          capacity_pb2.DeletePriorityClassRequest(name=name), idempotent=False)

    def drain(
        self, region: str, undrain: bool = False, reason: str = ""
    ) -> capacity_pb2.DrainRegionResponse:
        return self._call(
            self._capacity.DrainRegion,
            capacity_pb2.DrainRegionRequest(region=region, undrain=undrain, reason=reason),
            idempotent=True,
        )

    def cordon(self, node: str, uncordon: bool = False) -> capacity_pb2.CordonNodeResponse:
        return self._call(
            self._capacity.CordonNode,
            capacity_pb2.CordonNodeRequest(node_id=node, uncordon=uncordon),
            idempotent=True,
        )

    # -- identity, tokens, audit (operators; docs/contracts.md "Authentication")

    def whoami(self) -> auth_pb2.Principal:
        return self._call(self._auth.WhoAmI, auth_pb2.WhoAmIRequest(), idempotent=True)

    def create_token(self, user: str, team: str = "", role: str = "member",
                     ttl_s: float = 0.0) -> auth_pb2.IssuedToken:
        """A token for ``user``; ``ttl_s`` 0 = the broker's default lifetime."""
        return self._call(self._auth.CreateToken,
                          auth_pb2.CreateTokenRequest(user=user, team=team, role=role, ttl_s=ttl_s),
                          idempotent=False)

    def list_tokens(self, user: str = "", include_revoked: bool = False) -> list[auth_pb2.ApiToken]:
        resp = self._call(self._auth.ListTokens, auth_pb2.ListTokensRequest(
            user=user, include_revoked=include_revoked), idempotent=True)
        return list(resp.tokens)

    def revoke_token(self, token_id: str) -> auth_pb2.ApiToken:
        return self._call(self._auth.RevokeToken, auth_pb2.RevokeTokenRequest(token_id=token_id),
                          idempotent=True)

    def rotate_token(self, token_id: str) -> auth_pb2.IssuedToken:
        return self._call(self._auth.RotateToken, auth_pb2.RotateTokenRequest(token_id=token_id),
                          idempotent=False)

    def audit(self, actor: str = "", since: float = 0.0, limit: int = 100) -> list[auth_pb2.AuditRecord]:
        resp = self._call(self._auth.ListAuditRecords, auth_pb2.ListAuditRecordsRequest(
            actor=actor, since=since, limit=limit), idempotent=True)
        return list(resp.records)
