"""Broker settings: one pydantic model, so the CLI, tests and a YAML file all build
the same validated object (a typo in a field name is an error, not a silent default)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from broker.jobs.budgets import MAX_NODE_FAILURE_WINDOW_S, MAX_NODE_FAILURES

DEFAULT_PRIORITY_CLASSES: dict[str, int] = {
    "inference": 100,
    "experimentation": 80,
    "training": 70,
    "fine-tuning": 50,
}


def _known_policy(name: str) -> str:
    from broker.jobs.recovery import POLICIES  # recovery only type-imports this module

    if name not in POLICIES:
        raise ValueError(f"recovery_policy {name!r} is unknown; known: {', '.join(sorted(POLICIES))}")
    return name


def _loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")


class ApiWorkerServer(StrEnum):
    """How an API worker process serves its calls (broker/api/aio_server.py)."""

    THREADS = "threads"  # gRPC's synchronous server: one pool thread per running call
    AIO = "aio"  # grpc.aio: SubmitJob on the event loop, every other call on a pool


class BrokerConfig(BaseModel):
    """Everything the broker process needs; defaults suit a laptop demo."""

    model_config = ConfigDict(extra="forbid")

    listen: str = "127.0.0.1:50051"
    store: str = "sqlite:///var/broker.sqlite"  # sqlite:///PATH, redis://H:P/DB or redis+sentinel://H:P,H:P/SERVICE
    broker_id: str = ""  # "" = hostname-pid; names the lease holder (unique per replica)
    # High availability (broker/leadership.py): the replica holding the "leader" lease
    # serves; the others answer UNAVAILABLE naming it. It is renewed every third of this.
    leader_lease_s: float = Field(10.0, gt=0)
    # What standbys tell callers the leader's address is; "" = listen host + bound port.
    advertise_address: str = ""
    scheduler_interval_s: float = Field(1.0, gt=0)
    # Most of the broker's time scheduler passes may take while wake-ups keep coming
    # (a stream of submits): after a pass the loop pauses so that passes stay under
    # this share (the GIL is shared with the API threads). Wake-ups coalesce meanwhile.
    # Why 0.1: in a storm the passes take this share whatever one costs (the pause is
    # proportional to the pass), so the share, not the pass's cost, is what the API
    # loses. 0.25 -> 0.1 (with cheaper passes), in locked interleaved bench_api pairs:
    # SubmitJob p99 at 16 clients 48-59 -> 40-44 ms, 1 client +10-15%; the 16-client
    # rate did not move. The cost: an admission delay of ~10 passes in a storm
    # (~0.15-0.25 s at 5,000 pending; at most pass + scheduler_interval_s). A lone
    # event still gets its pass at once.
    scheduler_busy_share: float = Field(0.1, gt=0, le=1)
    # Rank output kept per job attempt (stdout+stderr of all ranks); the oldest lines
    # beyond it are dropped and counted (docs/contracts.md "Rank logs").
    log_max_bytes_per_attempt: int = Field(8 << 20, gt=0)
    heartbeat_interval_s: float = Field(2.0, gt=0)
    # Usage over time (broker/telemetry/series.py): the scheduler pass samples each
    # team's queue, GPUs and spend at most this often, and the leader saves the series
    # to the store this often (what a restart can lose).
    usage_sample_s: float = Field(5.0, gt=0)
    usage_save_s: float = Field(60.0, gt=0)
    # No message from an agent for this long -> it is lost and its jobs move.
    agent_timeout_s: float = Field(20.0, gt=0)
    # Agents known from the store get this long after a broker (re)start to reconnect
    # before their jobs are declared lost; None = agent_timeout_s.
    startup_grace_s: float | None = None
    # Checkpoint base for regions whose agent advertises no checkpoint bucket.
    checkpoint_root: str = "var/checkpoints"
    priority_classes: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_PRIORITY_CLASSES))
    default_priority_class: str = "training"
    # Off: a job for an unknown team is refused with a hint to create the team
    # (quotas are the point of teams; silently inventing one would bypass governance).
    auto_create_teams: bool = False
    max_restarts: int = Field(3, ge=0)  # auto-resume attempts after the job's own failures
    # Node losses (a failure laid on a node whose rank died by a signal: lost, unhealthy,
    # killed) spend this budget instead, never max_restarts: the job fails when more than
    # max_node_failures happened within node_failure_window_s seconds (0 = its whole life).
    # A job's spec may set its own. Why 10 per hour (docs/recovery.md "Restart budgets"):
    # at Meta's 1.8 h mean time to failure per 16k GPUs even a 100k-GPU job loses about 3
    # nodes an hour (more than 10 in one hour: about once in 1,300 hours), while ranks killed
    # at every start (the OOM killer looks the same) stop within minutes.
    max_node_failures: int = Field(10, ge=0, le=MAX_NODE_FAILURES)
    node_failure_window_s: float = Field(3600.0, ge=0, le=MAX_NODE_FAILURE_WINDOW_S)  # 0 = life
    # Launch refusal backoff (broker/jobs/backoff.py; like Kueue's requeuingStrategy
    # backoffBaseSeconds / backoffMaxSeconds / backoffLimitCount): an agent that refused a
    # job's Launch is left out for that job for base x 2^(n-1) seconds (n = refusals in a
    # row), at most the max; other agents may take it at once. After ``launch_refusal_limit``
    # refusals in a row with no attempt running in between the job FAILS (0 = never: it
    # stays PENDING with the refusal as its pending reason).
    launch_backoff_base_s: float = Field(10.0, gt=0)
    launch_backoff_max_s: float = Field(300.0, gt=0)
    launch_refusal_limit: int = Field(8, ge=0)
    # Checkpoint store outages (broker/jobs/store_wait.py): an attempt that exits
    # EXIT_STORE_UNAVAILABLE spends no restart; its region is left out for the job for
    # base x 2^(n-1) s (capped at the max) and the job fails only when the outage lasted
    # longer than store_outage_max_s (0 = wait for ever).
    store_outage_backoff_base_s: float = Field(5.0, gt=0)
    store_outage_backoff_max_s: float = Field(60.0, gt=0)
    store_outage_max_s: float = Field(6 * 3600.0, ge=0)
    # A started attempt whose store goes down while its ranks resume: the ranks wait for
    # it together this long (never past store_outage_max_s; the trainer's CB_STORE_WAIT_S)
    # before exiting EXIT_STORE_UNAVAILABLE into the wait above (0 = exit at once).
    store_outage_attempt_wait_s: float = Field(120.0, ge=0)
    # A job waiting that long for its region's store may resume in another region from
    # a durable checkpoint it made there (a move; 0 = never).
    store_outage_move_after_s: float = Field(600.0, ge=0)
    # A superseded attempt's checkpoint turns out newer than the one the running attempt
    # resumed from (broker/jobs/updates.py superseded_ended): an attempt running for at
    # most this long (or still launching) restarts from it; 0 = only launching ones.
    newer_checkpoint_restart_s: float = Field(120.0, ge=0)
    preempt_grace_s: float = Field(120.0, gt=0)  # SIGTERM -> SIGKILL for checkpoint-first stops
    # Bounds on preemption (broker/scheduling/preemption_rules.py); the fleet simulator's
    # scenarios set the same four settings.
    preempt_min_run_s: float = Field(0.0, ge=0)  # an attempt runs this long before it may be preempted (0 = off)
    preempt_budget: int = Field(0, ge=0)  # preemptions after which a job is never a victim again (0 = no limit)
    preempt_gain_factor: float = Field(0.0, ge=0)  # not a victim while its stated end is nearer than this x its cost (0 = off)
    preempt_requeue_s: float = Field(600.0, ge=0)  # a victim's restore and wait to run again, in its cost (with its move estimate)
    cancel_timeout_s: float = Field(30.0, gt=0)  # cancel of a running job completes anyway after this
    # A checkpoint-first stop with no answer after grace + this is treated as a plain stop.
    stop_timeout_s: float = Field(30.0, gt=0)
    progress_write_interval_s: float = Field(2.0, ge=0)  # throttle of progress writes to the store
    progress_event_every_steps: int = Field(50, ge=1)  # a "progress" event every N steps
    # Migration (broker/jobs/migration.py, broker/scheduling/plan_watch.py):
    # how a resumed attempt gets a checkpoint that lives in another region's store:
    # "copy" = the destination agent copies it into its own store first (fast loads, one
    # bulk transfer); "direct" = the trainer reads the other region's store.
    migration_transfer_mode: str = Field("copy", pattern="^(copy|direct)$")
    # Make-before-break (broker/jobs/standby.py): a drain or migrate stop also reserves and
    # starts the destination (standby) while the source saves; it goes once the source is
    # fenced and reads the checkpoint where the source wrote it (trainer/standby.py).
    make_before_break: bool = False
    # Pre-copy (broker/jobs/precopy.py; with make_before_break): a planned move (drain,
    # plan end, better capacity, defragmentation) of a job with a durable checkpoint holds
    # the source's Stop while the destination copies that checkpoint into its region, at
    # most this long; 0 = no pre-copy (the Stop goes at once). Spot notices never wait.
    precopy_wait_s: float = Field(600.0, ge=0)
    # A job on a training plan is moved this long before the plan ends at the least; more
    # when its own history (last checkpoint + last transfer time) x margin says so.
    plan_move_floor_s: float = Field(120.0, ge=0)
    plan_move_margin: float = Field(1.5, ge=1.0)
    # Proactive moves (broker/scheduling/proactive_watch.py): running jobs whose recovery
    # policy is "better-capacity" or "defragment" move, unforced, when the gain beats the
    # move cost. Looked for at most every proactive_interval_s (0 = never); a job is left
    # alone in its first proactive_min_dwell_s on its capacity (no back-and-forth); at most
    # proactive_max_moves such moves are in flight fleet-wide; defragmentation moves only
    # jobs of at most proactive_movable_gpus GPUs.
    proactive_interval_s: float = Field(30.0, ge=0)
    proactive_min_dwell_s: float = Field(600.0, ge=0)
    proactive_max_moves: int = Field(4, ge=1, le=1000)
    proactive_movable_gpus: int = Field(8, ge=1)
    # Growing back (broker/scheduling/grow_watch.py): a job shrunk in place after a node
    # loss is relaunched at its requested size once capacity for it has stayed free
    # grow_back_settle_s (hysteresis: a flapping node causes no churn), and at most once
    # per grow_back_min_interval_s after its shrink or its last grow back.
    grow_back_settle_s: float = Field(60.0, ge=0)
    grow_back_min_interval_s: float = Field(300.0, ge=0)
    # Recovery policy (broker/jobs/recovery.py POLICIES) for jobs without a
    # cb.recovery-policy label: "move-anywhere" (default), "stay-in-place",
    # "better-capacity", "defragment", ...
    recovery_policy: Annotated[str, AfterValidator(_known_policy)] = "move-anywhere"
    # Prometheus text endpoint ("host:port", port 0 = a free one); "" = no metrics
    # (broker/telemetry/metrics.py; docs/operator/observability.md).
    metrics_listen: str = Field("", pattern=r"^(|.+:\d+)$")
    # Users' code (broker/workdirs/): where uploaded workdir tarballs live, content-addressed:
    # a directory or s3://bucket/prefix; "" = workdirs/ next to the SQLite file.
    workdir_store: str = ""
    workdir_max_bytes: int = Field(100 * 1024 * 1024, gt=0)  # larger uploads are refused
    # gRPC threads for unary RPCs (reads, submits). Streams have their own budget on top
    # (max_streams), so idle WatchJob/Connect streams can never take these.
    max_workers: int = Field(64, ge=8)
    # API worker processes (broker/api/workers.py, docs/architecture.md "API worker
    # processes"): 0 = this process serves the public port itself. N > 0 = N processes
    # serve ``listen`` together (SO_REUSEPORT): gRPC, TLS, authentication, validation and
    # job creation then use more than one core; this process keeps the lease, the
    # scheduler and agent streams. Agents then connect on ``agent_listen`` only
    # (plaintext loopback under insecure_dev). Needs a store processes share: a SQLite
    # file or Redis.
    api_workers: int = Field(0, ge=0, le=32)
    # API front-end mode (`brokerctl serve --frontend`; broker/api/frontend.py,
    # docs/operator/frontends.md): this process never leads or schedules; it serves
    # SubmitJob, the job reads and WatchJob from the shared Redis store on another host
    # and wakes the leader over the store's pub/sub. Needs a redis:// store.
    frontend: bool = False
    # Distinct per front-end (0..191): its job ids come from their own stream.
    frontend_id: int = Field(0, ge=0, le=191)
    # The workers' server. "aio" serves SubmitJob on an event loop (no thread per call;
    # the group commit awaited) and every other method's code on a thread pool; measured
    # on the 2-core benchmark box it used no less CPU per submit than "threads" and more
    # per pooled call (docs/architecture.md "API worker processes"), so it is not the
    # default.
    api_worker_server: ApiWorkerServer = ApiWorkerServer.THREADS
    # Long-lived streams (WatchJob, StreamJobLogs, agent Connect, workdir transfers, health
    # Watch; broker/api/streams.py): each open one holds a server thread, so each kind of
    # caller draws from a pool of its own and nobody can fill another's. This one: all
    # users' streams. Beyond any stream cap: RESOURCE_EXHAUSTED naming it.
    max_streams: int = Field(512, ge=1, le=10_000)
    # Agents' streams (Connect, workdir fetches): users can never take these.
    max_agent_streams: int = Field(256, ge=1, le=10_000)
    # Streams opened with no credential at all (the public health Watch).
    max_public_streams: int = Field(32, ge=1, le=10_000)
    # Streams of one user or one agent.
    max_streams_per_identity: int = Field(128, ge=1)
    # Streams of one team's members together.
    max_streams_per_team: int = Field(256, ge=1)
    # Users' and anonymous streams from one peer address, whoever they authenticate as.
    max_streams_per_peer: int = Field(256, ge=1)
    # Unauthenticated streams (health Watch) from one peer address.
    max_public_streams_per_peer: int = Field(8, ge=1)
    # Connections from one peer address that hold streams (users and anonymous callers).
    max_connections_per_peer: int = Field(64, ge=1)
    # TCP connections one address may hold open on ``listen``, counted and refused before
    # the TLS handshake (broker/api/peer_gate.py); 0 = no gate (gRPC takes every
    # connection). Not with api_workers (they bind ``listen`` themselves).
    max_connections_per_address: int = Field(0, ge=0)
    # HTTP/2 streams one connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS):
    # a transport limit applied before any credential or thread; a client over it waits.
    max_streams_per_connection: int = Field(1024, ge=16)
    # A request stream (agent Connect, upload) silent this long is cancelled; agents
    # heartbeat every heartbeat_interval_s, so this only fires for half-open/dead peers.
    stream_idle_timeout_s: float = Field(60.0, gt=0)
    # Largest request message decoded (bytes); workdir chunks are 1 MiB.
    max_message_bytes: int = Field(4 * 1024 * 1024, ge=64 * 1024, le=64 * 1024 * 1024)
    # gRPC server reflection (grpcurl and friends): off unless asked for.
    reflection: bool = False
    # Operator-allowed roots for job-chosen checkpoint URIs (dirs or s3://bucket/prefix),
    # besides checkpoint_root and each region's advertised store and roots.
    checkpoint_allowed_roots: list[str] = Field(default_factory=list)
    max_page_size: int = 1000
    # Security (broker/auth/, docs/operator/security.md): TLS on every port, PEM files. ``tls_ca``
    # verifies client certificates (agents, certificate users) on ``agent_listen``, the
    # mutual-TLS port; ``listen`` is server-authenticated TLS where users send tokens.
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    agent_listen: str = Field("127.0.0.1:50052", pattern=r"^(|.+:\d+)$")
    # DEV ONLY, loudly labelled: no TLS, no authentication, loopback only; every caller
    # is the one local operator. The broker refuses to start without TLS otherwise.
    insecure_dev: bool = False
    # Bootstrap tokens (YAML written by `brokerctl dev-ca`: id, user, role, team, argon2
    # hash), valid besides the store's tokens; the first operator's way in. Static: edit
    # the file and restart to revoke one.
    static_tokens_file: str = ""
    default_page_size: int = 100
    # Users' tokens (broker/auth/tokens.py): the lifetime when `brokerctl users create`
    # gives no --ttl. Static bootstrap tokens never expire.
    token_default_ttl_s: float = Field(90 * 86_400.0, gt=0)
    # The longest lifetime `brokerctl users create --ttl` may ask for.
    token_max_ttl_s: float = Field(366 * 86_400.0, gt=0)
    # Client certificates (agents', users') no longer trusted (broker/auth/revocation.py):
    # a PEM CRL signed by tls_ca. Re-read when the file changes (looked at every 2 s).
    tls_crl: str = ""
    # The same as a text file: one serial (decimal or 0x-hex) or SHA-256 fingerprint a line.
    cert_deny_list: str = ""

    @field_validator("priority_classes")
    @classmethod
    def _classes_not_empty(cls, v: dict[str, int]) -> dict[str, int]:
        if not v:
            raise ValueError("priority_classes must name at least one class")
        return v

    @field_validator("workdir_store")
    @classmethod
    def _workdir_store_url(cls, v: str) -> str:
        if "://" in v and not v.startswith(("s3://", "file://")):
            raise ValueError(f"{v!r}: use a directory or s3://bucket/prefix")
        if v.startswith("s3://") and not v.removeprefix("s3://").split("/", 1)[0]:
            raise ValueError(f"{v!r} names no bucket: s3://bucket/prefix")
        return v

    @model_validator(mode="after")
    def _idle_outlasts_heartbeats(self) -> BrokerConfig:
        # Agents speak every heartbeat_interval_s; a shorter idle timeout would cancel
        # healthy agent streams over and over.
        if self.stream_idle_timeout_s < 3 * self.heartbeat_interval_s:
            raise ValueError(f"stream_idle_timeout_s ({self.stream_idle_timeout_s}) must be at"
                             f" least 3 x heartbeat_interval_s ({self.heartbeat_interval_s})")
        return self

    @model_validator(mode="after")
    def _tls_or_dev(self) -> BrokerConfig:
        if self.insecure_dev:
            for addr in (self.listen, self.metrics_listen):
                if addr and not _loopback(addr):
                    raise ValueError(f"insecure_dev binds loopback only; {addr!r} is not loopback")
        return self

    def tls_problem(self) -> str:
        """Why this config may not serve ("" = fine); checked when the broker starts
        (not at validation: tests build configs as plain settings too)."""
        if self.insecure_dev or all([self.tls_cert, self.tls_key, self.tls_ca]):
            return ""
        return ("TLS is required: set tls_cert, tls_key and tls_ca (`brokerctl dev-ca DIR` makes"
                " them), or insecure_dev: true (--insecure-dev) for a loopback-only dev broker")

    def frontend_problem(self) -> str:
        """Why this config cannot run as an API front-end ("" = fine or not one)."""
        if not self.frontend:
            return ""
        if not self.store.startswith(("redis://", "rediss://", "redis+sentinel://")):
            return ("an API front-end needs the leader's shared Redis store (redis:// or"
                    " redis+sentinel://); a SQLite file is one host's")
        if self.api_workers:
            return ("an API front-end is one process: set api_workers to 0 and run more"
                    " front-ends (each with its own frontend_id) for more cores")
        return ""

    def workers_problem(self) -> str:
        """Why ``api_workers`` cannot be used with this config ("" = fine)."""
        if not self.api_workers:
            return ""
        if self.max_connections_per_address:
            return ("max_connections_per_address is not available with api_workers yet (the"
                    " workers bind listen themselves): set one of them to 0, or cap"
                    " connections per address in front of the broker")
        if self.store.rstrip("/").endswith(":memory:"):
            return ("api_workers needs a store other processes can open (sqlite:///PATH or"
                    " redis://...); sqlite:///:memory: lives in one process")
        if not self.agent_listen:
            return ("api_workers needs agent_listen: agents' streams stay in the core process,"
                    " so agents connect there, not to the workers' public port")
        if self.insecure_dev and not _loopback(self.agent_listen):
            return f"insecure_dev binds loopback only; agent_listen {self.agent_listen!r} is not loopback"
        return ""

    @property
    def grace_s(self) -> float:
        return self.agent_timeout_s if self.startup_grace_s is None else self.startup_grace_s
