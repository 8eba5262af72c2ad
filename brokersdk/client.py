"""Python SDK for Compute Broker: a thin, friendly layer over the gRPC API.

Why this shape: ML engineers want to say "2 nodes x 8 GPUs of the tiny model,
spot is fine" and get a handle they can wait on, not build protobufs by hand. So
:class:`JobSpec` is a small pydantic model with sensible defaults that turns into
the wire ``computebroker.v1.JobSpec``; raw protobuf specs are accepted too.

Imports only the generated ``computebroker.v1`` stubs, grpc, pydantic, tenacity
and the standard library (the SDK uses only the stubs, docs/architecture.md), so it can be
shipped to users without the broker's internals.

Errors: every gRPC failure becomes a :class:`BrokerError` subclass that carries
the gRPC status code and the server's message, so callers can ``except
InvalidJobSpec`` instead of inspecting ``grpc.RpcError``.

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
from google.protobuf import json_format
from pydantic import BaseModel, ConfigDict, Field, ValidationError
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
from computebroker.v1 import (
    capacity_pb2,
    capacity_pb2_grpc,
    common_pb2,
    jobs_pb2,
    jobs_pb2_grpc,
    logs_pb2,
)

__all__ = [
    "AlreadyExists",
    "BrokerClient",
    "BrokerError",
    "BrokerUnavailable",
    "InvalidJobSpec",
    "JobHandle",
    "JobNotFound",
    "JobSpec",
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

TERMINAL_PHASES = frozenset(
    {
        common_pb2.JOB_PHASE_SUCCEEDED,
        common_pb2.JOB_PHASE_FAILED,
        common_pb2.JOB_PHASE_CANCELLED,
    }
)


# --------------------------------------------------------------------------- errors


class BrokerError(Exception):
    """A failed broker call: ``code`` is the gRPC status, ``message`` the server's text.

    ``hint`` is an optional one-line suggestion for people (the CLI prints it).
    """

    default_hint = ""

    def __init__(
        self,
        message: str,
        code: grpc.StatusCode | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.hint = self.default_hint if hint is None else hint

    def __str__(self) -> str:
        return self.message


class InvalidJobSpec(BrokerError):
    """INVALID_ARGUMENT: the request (usually the job spec) is malformed."""


class NotFound(BrokerError):
    """NOT_FOUND: the named object (job, team, plan, region, node) does not exist."""


class JobNotFound(NotFound):
    """NOT_FOUND for a job id."""

    default_hint = "list jobs with `brokerctl jobs`"


class AlreadyExists(BrokerError):
    """ALREADY_EXISTS."""


class PreconditionFailed(BrokerError):
    """FAILED_PRECONDITION: e.g. cancelling a job that already finished."""


class QuotaExceeded(BrokerError):
    """RESOURCE_EXHAUSTED: over quota and nothing can be borrowed."""

    default_hint = "see quotas with `brokerctl teams`"


class PermissionDenied(BrokerError):
    """PERMISSION_DENIED or UNAUTHENTICATED."""


class BrokerUnavailable(BrokerError):
    """UNAVAILABLE / DEADLINE_EXCEEDED: the broker could not be reached in time."""


_CODE_TO_ERROR: dict[grpc.StatusCode, type[BrokerError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidJobSpec,
    grpc.StatusCode.OUT_OF_RANGE: InvalidJobSpec,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: PreconditionFailed,
    grpc.StatusCode.RESOURCE_EXHAUSTED: QuotaExceeded,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: PermissionDenied,
    grpc.StatusCode.UNAVAILABLE: BrokerUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: BrokerUnavailable,
}


def _translate(err: grpc.RpcError, address: str, *, job_id: str | None = None) -> BrokerError:
    """Turn a grpc.RpcError into the matching BrokerError subclass."""
    code = err.code() if hasattr(err, "code") else None
    details = (err.details() if hasattr(err, "details") else None) or ""
    if code is grpc.StatusCode.UNAVAILABLE:
        return BrokerUnavailable(
            f"cannot reach the broker at {address}",
            code,
            hint="is it running? start one with `brokerctl serve` or set --broker / BROKER_ADDRESS"
            + (f" ({details})" if details and "connect" not in details.lower() else ""),
        )
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return BrokerUnavailable(
            f"the broker at {address} did not answer in time", code, hint=details or None
        )
    cls = _CODE_TO_ERROR.get(code, BrokerError) if code is not None else BrokerError
    if cls is NotFound and job_id is not None:
        cls = JobNotFound
    name = code.name if code is not None else "UNKNOWN"
    return cls(details or f"broker call failed ({name})", code)


# --------------------------------------------------------------------------- enum helpers


def logs_request(job_id: str, follow: bool = False, rank: int | None = None,
                 attempt: int | None = None, tail: int | None = None) -> jobs_pb2.StreamJobLogsRequest:
    """StreamJobLogs request; None = no filter (the broker validates the values)."""
    req = jobs_pb2.StreamJobLogsRequest(job_id=job_id, follow=follow, attempt=attempt or 0,
                                        tail=tail or 0)
    if rank is not None:
        req.rank = rank
    return req


def _enum_parser(prefix: str, enum: Any, aliases: Mapping[str, str] | None = None):
    def parse(value: str | int) -> int:
        if isinstance(value, int):
            return value
        key = str(value).strip().lower().replace("-", "_")
        key = (aliases or {}).get(key, key)
        full = key.upper() if key.upper().startswith(prefix) else prefix + key.upper()
        try:
            return enum.Value(full)
        except ValueError:
            choices = ", ".join(
                v.name[len(prefix) :].lower().replace("_", "-")
                for v in enum.DESCRIPTOR.values
                if not v.name.endswith("UNSPECIFIED")
            )
            raise InvalidJobSpec(
                f"unknown value {value!r}; expected one of: {choices}",
                grpc.StatusCode.INVALID_ARGUMENT,
            ) from None

    def name(value: int) -> str:
        try:
            n = enum.Name(value)
        except ValueError:
            return str(value)
        if n.endswith("UNSPECIFIED"):
            return ""
        return n[len(prefix) :].lower().replace("_", "-")

    return parse, name


parse_phase, phase_name = _enum_parser("JOB_PHASE_", common_pb2.JobPhase)
parse_capacity_type, capacity_type_name = _enum_parser(
    "CAPACITY_TYPE_", common_pb2.CapacityType, {"ondemand": "on_demand", "plan": "training_plan"}
)
parse_topology, topology_name = _enum_parser(
    "TOPOLOGY_LEVEL_",
    common_pb2.TopologyLevel,
    {"l1": "layer_1", "l2": "layer_2", "l3": "layer_3", "spine": "layer_1", "block": "layer_3"},
)
parse_strategy, strategy_name = _enum_parser("LENDING_STRATEGY_", capacity_pb2.LendingStrategy)
parse_plan_state, plan_state_name = _enum_parser("PLAN_STATE_", capacity_pb2.PlanState)


# --------------------------------------------------------------------------- job spec


class TrainerSpec(BaseModel):
    """What our trainer (``python -m trainer``) should do (docs/contracts.md)."""

    model_config = ConfigDict(extra="forbid")

    total_steps: int = 100
    checkpoint_every: int = 10
    global_batch_size: int = 8  # samples per global step, whatever the world size
    seed: int = 0
    model: str = "tiny"
    step_sleep_s: float = 0.0
    options: dict[str, str] = Field(default_factory=dict)

    def to_proto(self) -> common_pb2.TrainerSpec:
        return common_pb2.TrainerSpec(
            total_steps=self.total_steps,
            checkpoint_every=self.checkpoint_every,
            global_batch_size=self.global_batch_size,
            seed=self.seed,
            model=self.model,
            step_sleep_s=self.step_sleep_s,
            options={k: str(v) for k, v in self.options.items()},
        )


class JobSpec(BaseModel):
    """A friendly job spec. Defaults: 1 node x 1 GPU, priority "training", tiny model.

    Semantic checks (GPU counts, teams, URIs) are the broker's job: it is the one
    place that validates every input, so the SDK and CLI report its messages.
    Topology levels, capacity types and regions are given by name, e.g.
    ``topology_required="ultraserver"``, ``capacity_types=["spot", "on-demand"]``.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = ""
    team: str = "default"
    priority_class: str = "training"
    nodes: int = 1
    gpus_per_node: int = 1
    accelerator: str = ""
    topology_required: str = ""
    topology_preferred: str = ""
    allowed_regions: list[str] = Field(default_factory=list)
    denied_regions: list[str] = Field(default_factory=list)
    preferred_regions: list[str] = Field(default_factory=list)
    dataset_uri: str = ""
    dataset_region: str = ""
    checkpoint_uri: str = ""
    spot_ok: bool = False
    capacity_types: list[str] = Field(default_factory=list)
    max_price_per_gpu_hour: float = 0.0
    min_nodes: int = 0
    max_nodes: int = 0
    expected_duration_s: float = 0.0
    command: list[str] = Field(default_factory=list)
    image: str = ""
    env: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    trainer: TrainerSpec = Field(default_factory=TrainerSpec)

    def to_proto(self) -> common_pb2.JobSpec:
        """The wire spec. ``spot_ok`` means: any capacity type, spot included."""
        ctypes = [parse_capacity_type(c) for c in self.capacity_types]
        if self.spot_ok and not ctypes:
            ctypes = [
                common_pb2.CAPACITY_TYPE_ON_DEMAND,
                common_pb2.CAPACITY_TYPE_SPOT,
                common_pb2.CAPACITY_TYPE_TRAINING_PLAN,
                common_pb2.CAPACITY_TYPE_RESERVED,
            ]
        elif self.spot_ok and common_pb2.CAPACITY_TYPE_SPOT not in ctypes:
            ctypes.append(common_pb2.CAPACITY_TYPE_SPOT)
        return common_pb2.JobSpec(
            name=self.name,
            team=self.team,
            priority_class=self.priority_class,
            command=list(self.command),
            image=self.image,
            resources=common_pb2.Resources(
                nodes=self.nodes, gpus_per_node=self.gpus_per_node, accelerator=self.accelerator
            ),
            topology=common_pb2.TopologyConstraint(
                required=parse_topology(self.topology_required) if self.topology_required else 0,
                preferred=parse_topology(self.topology_preferred)
                if self.topology_preferred
                else 0,
            ),
            allowed_regions=list(self.allowed_regions),
            denied_regions=list(self.denied_regions),
            preferred_regions=list(self.preferred_regions),
            dataset_uri=self.dataset_uri,
            dataset_region=self.dataset_region,
            checkpoint_uri=self.checkpoint_uri,
            capacity_types=ctypes,
            max_price_per_gpu_hour=self.max_price_per_gpu_hour,
            elasticity=common_pb2.Elasticity(min_nodes=self.min_nodes, max_nodes=self.max_nodes),
            expected_duration_s=self.expected_duration_s,
            env={k: str(v) for k, v in self.env.items()},
            trainer=self.trainer.to_proto(),
            labels={k: str(v) for k, v in self.labels.items()},
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec | common_pb2.JobSpec:
        """Build a spec from a YAML/JSON mapping.

        Two forms are accepted: this class's flat fields (``nodes``, ``gpus_per_node``,
        ...), or the API's own JSON form (``resources: {nodes: ...}``), which is
        returned as a protobuf. Errors become :class:`InvalidJobSpec`.
        """
        if not isinstance(data, Mapping):
            raise InvalidJobSpec("a job spec must be a mapping of fields")
        data = dict(data)
        if "spec" in data and isinstance(data["spec"], Mapping) and len(data) == 1:
            data = dict(data["spec"])
        if "resources" in data or "topology" in data or "elasticity" in data:
            try:
                return json_format.ParseDict(data, common_pb2.JobSpec())
            except json_format.ParseError as e:
                raise InvalidJobSpec(f"bad job spec: {e}") from None
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise InvalidJobSpec(f"bad job spec: {_pydantic_message(e)}") from None


def _pydantic_message(err: ValidationError) -> str:
    parts = []
    for item in err.errors():
        loc = ".".join(str(p) for p in item.get("loc", ()))
        parts.append(f"{loc}: {item.get('msg', 'invalid')}" if loc else item.get("msg", ""))
    return "; ".join(parts)


def _spec_to_proto(spec: JobSpec | common_pb2.JobSpec | Mapping[str, Any]) -> common_pb2.JobSpec:
    if isinstance(spec, common_pb2.JobSpec):
        return spec
    if isinstance(spec, JobSpec):
        return spec.to_proto()
    if isinstance(spec, Mapping):
        built = JobSpec.from_dict(spec)
        return built if isinstance(built, common_pb2.JobSpec) else built.to_proto()
    raise TypeError(f"spec must be a JobSpec, a computebroker.v1.JobSpec or a dict, not {spec!r}")


# --------------------------------------------------------------------------- client

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
    ) -> None:
        self.address = address
        self.timeout = timeout
        self.retries = max(0, retries)
        self.metadata = list(metadata or [])
        self.addresses = [a.strip() for a in address.split(",") if a.strip()] or [address]
        self._current = 0
        self._channels = [
            grpc.insecure_channel(
                a,
                options=[
                    ("grpc.keepalive_time_ms", 30_000),
                    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                ],
            )
            for a in self.addresses
        ]
        self._stubs = [
            (jobs_pb2_grpc.JobServiceStub(c), capacity_pb2_grpc.CapacityServiceStub(c))
            for c in self._channels
        ]

    @property
    def _channel(self) -> grpc.Channel:
        return self._channels[self._current]

    @property
    def _jobs(self) -> jobs_pb2_grpc.JobServiceStub:
        return self._stubs[self._current][0]

    @property
    def _capacity(self) -> capacity_pb2_grpc.CapacityServiceStub:
        return self._stubs[self._current][1]

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
                err = _translate(e, address, job_id=job_id)
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
    ) -> JobHandle:
        """Submit a job; returns its handle. Idempotent on ``client_request_id``.

        A UUID is generated when none is given, so the SDK's own retries on a lost
        response never create a second job. ``handle.created`` is False when the
        broker already had a job for this request id.
        """
        request = jobs_pb2.SubmitJobRequest(
            spec=_spec_to_proto(spec), client_request_id=client_request_id or str(uuid.uuid4())
        )
        # A "submit_job" span when the application traces; its traceparent travels in the
        # metadata and becomes the parent of the job's whole trace (broker/telemetry/__init__.py).
        with telemetry.client_span("submit_job", **{"cb.team": request.spec.team}) as trace_md:
            resp = self._call(self._jobs.SubmitJob, request, idempotent=True,
                              extra_metadata=trace_md)
            telemetry.set_attributes(**{"cb.job.id": resp.job.id, "cb.created": resp.created})
        return JobHandle(self, resp.job.id, job=resp.job, created=resp.created)

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
                raise _translate(e, self.address, job_id=job_id) from None
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
                raise _translate(e, self.address, job_id=job_id) from None
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


class JobHandle:
    """A submitted job. Cheap: holds only the id and the last known state."""

    def __init__(
        self,
        client: BrokerClient,
        job_id: str,
        job: common_pb2.Job | None = None,
        created: bool | None = None,
    ) -> None:
        self.client = client
        self.id = job_id
        self.job = job
        self.created = created

    def __repr__(self) -> str:
        phase = phase_name(self.job.phase) if self.job is not None else "?"
        return f"JobHandle({self.id!r}, phase={phase!r})"

    def status(self) -> common_pb2.Job:
        """Fetch the job now (GetJob)."""
        self.job = self.client.get_job(self.id)
        return self.job

    @property
    def phase(self) -> str:
        """The phase name of the last fetched state (e.g. "running")."""
        return phase_name((self.job or self.status()).phase)

    def wait(self, timeout: float | None = None, poll: float = 1.0) -> common_pb2.Job:
        """Block until the job is terminal and return it; TimeoutError after ``timeout`` s.

        Follows the WatchJob stream (no polling load on the broker); falls back to
        polling GetJob every ``poll`` seconds if the broker does not offer WatchJob.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        job = self.status()
        if job.phase in TERMINAL_PHASES:
            return job
        try:
            remaining = None if deadline is None else max(0.001, deadline - time.monotonic())
            for event in self.client.watch(self.id, timeout=remaining):
                if event.to_phase in TERMINAL_PHASES:
                    break
        except BrokerError as e:
            if e.code is not grpc.StatusCode.UNIMPLEMENTED:
                raise
        # The stream ends at a terminal phase; confirm (and poll if it was unavailable).
        while True:
            job = self.status()
            if job.phase in TERMINAL_PHASES:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"job {self.id} still {phase_name(job.phase)} after {timeout:.0f}s"
                )
            time.sleep(poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic())))

    def events(
        self, follow: bool = True, include_progress: bool = False, after_seq: int = 0
    ) -> Iterator[common_pb2.JobEvent]:
        """The job's events: history then live ones until terminal (``follow``),
        or just the recorded history."""
        if follow:
            yield from self.client.watch(
                self.id, after_seq=after_seq, include_progress=include_progress
            )
        else:
            yield from self.client.events(self.id, after_seq=after_seq)

    def cancel(self, reason: str = "") -> common_pb2.Job:
        self.job = self.client.cancel(self.id, reason)
        return self.job

    def logs(
        self,
        follow: bool = False,
        rank: int | None = None,
        attempt: int | None = None,
        tail: int | None = None,
    ) -> Iterator[logs_pb2.LogRecord]:
        """The ranks' output, attempt by attempt (see :meth:`BrokerClient.logs`)."""
        return self.client.logs(self.id, follow=follow, rank=rank, attempt=attempt, tail=tail)
