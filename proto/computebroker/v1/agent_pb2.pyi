from computebroker.v1 import common_pb2 as _common_pb2
from computebroker.v1 import logs_pb2 as _logs_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AttemptState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ATTEMPT_STATE_UNSPECIFIED: _ClassVar[AttemptState]
    ATTEMPT_STATE_STARTING: _ClassVar[AttemptState]
    ATTEMPT_STATE_RUNNING: _ClassVar[AttemptState]
    ATTEMPT_STATE_CHECKPOINTING: _ClassVar[AttemptState]
    ATTEMPT_STATE_SUCCEEDED: _ClassVar[AttemptState]
    ATTEMPT_STATE_FAILED: _ClassVar[AttemptState]
    ATTEMPT_STATE_CHECKPOINTED: _ClassVar[AttemptState]
    ATTEMPT_STATE_STOPPED: _ClassVar[AttemptState]

class StopReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STOP_REASON_UNSPECIFIED: _ClassVar[StopReason]
    STOP_REASON_CANCEL: _ClassVar[StopReason]
    STOP_REASON_PREEMPT: _ClassVar[StopReason]
    STOP_REASON_MIGRATE: _ClassVar[StopReason]
    STOP_REASON_STALE_ATTEMPT: _ClassVar[StopReason]
    STOP_REASON_DRAIN: _ClassVar[StopReason]
ATTEMPT_STATE_UNSPECIFIED: AttemptState
ATTEMPT_STATE_STARTING: AttemptState
ATTEMPT_STATE_RUNNING: AttemptState
ATTEMPT_STATE_CHECKPOINTING: AttemptState
ATTEMPT_STATE_SUCCEEDED: AttemptState
ATTEMPT_STATE_FAILED: AttemptState
ATTEMPT_STATE_CHECKPOINTED: AttemptState
ATTEMPT_STATE_STOPPED: AttemptState
STOP_REASON_UNSPECIFIED: StopReason
STOP_REASON_CANCEL: StopReason
STOP_REASON_PREEMPT: StopReason
STOP_REASON_MIGRATE: StopReason
STOP_REASON_STALE_ATTEMPT: StopReason
STOP_REASON_DRAIN: StopReason

class AgentMessage(_message.Message):
    __slots__ = ("register", "heartbeat", "job_update", "ack", "log_chunk")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    JOB_UPDATE_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    LOG_CHUNK_FIELD_NUMBER: _ClassVar[int]
    register: Register
    heartbeat: Heartbeat
    job_update: JobUpdate
    ack: CommandAck
    log_chunk: _logs_pb2.LogChunk
    def __init__(self, register: _Optional[_Union[Register, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., job_update: _Optional[_Union[JobUpdate, _Mapping]] = ..., ack: _Optional[_Union[CommandAck, _Mapping]] = ..., log_chunk: _Optional[_Union[_logs_pb2.LogChunk, _Mapping]] = ...) -> None: ...

class RunningAttempt(_message.Message):
    __slots__ = ("job_id", "attempt", "state", "progress")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    state: AttemptState
    progress: _common_pb2.Progress
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., state: _Optional[_Union[AttemptState, str]] = ..., progress: _Optional[_Union[_common_pb2.Progress, _Mapping]] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("agent_id", "region", "nodes", "running", "executor", "checkpoint_bucket", "version", "checkpoint_store_error", "checkpoint_roots", "checkpoint_store_error_since", "checkpoint_store_ok_since", "checkpoint_store_outage", "pool_spares")
    class PoolSparesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_BUCKET_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STORE_ERROR_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ROOTS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STORE_ERROR_SINCE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STORE_OK_SINCE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STORE_OUTAGE_FIELD_NUMBER: _ClassVar[int]
    POOL_SPARES_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    region: str
    nodes: _containers.RepeatedCompositeFieldContainer[_common_pb2.Node]
    running: _containers.RepeatedCompositeFieldContainer[RunningAttempt]
    executor: str
    checkpoint_bucket: str
    version: str
    checkpoint_store_error: str
    checkpoint_roots: _containers.RepeatedScalarFieldContainer[str]
    checkpoint_store_error_since: float
    checkpoint_store_ok_since: float
    checkpoint_store_outage: bool
    pool_spares: _containers.ScalarMap[str, int]
    def __init__(self, agent_id: _Optional[str] = ..., region: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[_common_pb2.Node, _Mapping]]] = ..., running: _Optional[_Iterable[_Union[RunningAttempt, _Mapping]]] = ..., executor: _Optional[str] = ..., checkpoint_bucket: _Optional[str] = ..., version: _Optional[str] = ..., checkpoint_store_error: _Optional[str] = ..., checkpoint_roots: _Optional[_Iterable[str]] = ..., checkpoint_store_error_since: _Optional[float] = ..., checkpoint_store_ok_since: _Optional[float] = ..., checkpoint_store_outage: _Optional[bool] = ..., pool_spares: _Optional[_Mapping[str, int]] = ...) -> None: ...

class StoreProbe(_message.Message):
    __slots__ = ("error", "since", "time", "outage")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    OUTAGE_FIELD_NUMBER: _ClassVar[int]
    error: str
    since: float
    time: float
    outage: bool
    def __init__(self, error: _Optional[str] = ..., since: _Optional[float] = ..., time: _Optional[float] = ..., outage: _Optional[bool] = ...) -> None: ...

class NodeHealth(_message.Message):
    __slots__ = ("node_id", "healthy", "reason")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    healthy: bool
    reason: str
    def __init__(self, node_id: _Optional[str] = ..., healthy: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class SpotNotice(_message.Message):
    __slots__ = ("node_id", "deadline_time")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_TIME_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    deadline_time: float
    def __init__(self, node_id: _Optional[str] = ..., deadline_time: _Optional[float] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("time", "node_health", "spot_notices", "running", "store_probe")
    TIME_FIELD_NUMBER: _ClassVar[int]
    NODE_HEALTH_FIELD_NUMBER: _ClassVar[int]
    SPOT_NOTICES_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    STORE_PROBE_FIELD_NUMBER: _ClassVar[int]
    time: float
    node_health: _containers.RepeatedCompositeFieldContainer[NodeHealth]
    spot_notices: _containers.RepeatedCompositeFieldContainer[SpotNotice]
    running: _containers.RepeatedCompositeFieldContainer[RunningAttempt]
    store_probe: StoreProbe
    def __init__(self, time: _Optional[float] = ..., node_health: _Optional[_Iterable[_Union[NodeHealth, _Mapping]]] = ..., spot_notices: _Optional[_Iterable[_Union[SpotNotice, _Mapping]]] = ..., running: _Optional[_Iterable[_Union[RunningAttempt, _Mapping]]] = ..., store_probe: _Optional[_Union[StoreProbe, _Mapping]] = ...) -> None: ...

class JobUpdate(_message.Message):
    __slots__ = ("job_id", "attempt", "state", "progress", "exit_code", "message", "failed_nodes", "time", "transfer", "timings", "ranks", "store_wait")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FAILED_NODES_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    STORE_WAIT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    state: AttemptState
    progress: _common_pb2.Progress
    exit_code: int
    message: str
    failed_nodes: _containers.RepeatedScalarFieldContainer[str]
    time: float
    transfer: _common_pb2.TransferStats
    timings: AttemptTimings
    ranks: int
    store_wait: RanksStoreWait
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., state: _Optional[_Union[AttemptState, str]] = ..., progress: _Optional[_Union[_common_pb2.Progress, _Mapping]] = ..., exit_code: _Optional[int] = ..., message: _Optional[str] = ..., failed_nodes: _Optional[_Iterable[str]] = ..., time: _Optional[float] = ..., transfer: _Optional[_Union[_common_pb2.TransferStats, _Mapping]] = ..., timings: _Optional[_Union[AttemptTimings, _Mapping]] = ..., ranks: _Optional[int] = ..., store_wait: _Optional[_Union[RanksStoreWait, _Mapping]] = ...) -> None: ...

class RanksStoreWait(_message.Message):
    __slots__ = ("since", "message")
    SINCE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    since: float
    message: str
    def __init__(self, since: _Optional[float] = ..., message: _Optional[str] = ...) -> None: ...

class AttemptTimings(_message.Message):
    __slots__ = ("launch_received_time", "spawn_time", "stop_signal_time", "exit_time")
    LAUNCH_RECEIVED_TIME_FIELD_NUMBER: _ClassVar[int]
    SPAWN_TIME_FIELD_NUMBER: _ClassVar[int]
    STOP_SIGNAL_TIME_FIELD_NUMBER: _ClassVar[int]
    EXIT_TIME_FIELD_NUMBER: _ClassVar[int]
    launch_received_time: float
    spawn_time: float
    stop_signal_time: float
    exit_time: float
    def __init__(self, launch_received_time: _Optional[float] = ..., spawn_time: _Optional[float] = ..., stop_signal_time: _Optional[float] = ..., exit_time: _Optional[float] = ...) -> None: ...

class CommandAck(_message.Message):
    __slots__ = ("command_id", "accepted", "message")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    accepted: bool
    message: str
    def __init__(self, command_id: _Optional[str] = ..., accepted: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class RegisterAck(_message.Message):
    __slots__ = ("agent_id", "heartbeat_interval_s", "stale_job_ids", "log_offsets", "agent_timeout_s")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    STALE_JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    LOG_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    AGENT_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    heartbeat_interval_s: float
    stale_job_ids: _containers.RepeatedScalarFieldContainer[str]
    log_offsets: _containers.RepeatedCompositeFieldContainer[_logs_pb2.LogOffset]
    agent_timeout_s: float
    def __init__(self, agent_id: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., stale_job_ids: _Optional[_Iterable[str]] = ..., log_offsets: _Optional[_Iterable[_Union[_logs_pb2.LogOffset, _Mapping]]] = ..., agent_timeout_s: _Optional[float] = ...) -> None: ...

class Launch(_message.Message):
    __slots__ = ("job_id", "attempt", "spec", "placement", "checkpoint_uri", "resume_from", "env", "transfer_mode", "standby", "precopy_from", "spare_nodes")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_URI_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_MODE_FIELD_NUMBER: _ClassVar[int]
    STANDBY_FIELD_NUMBER: _ClassVar[int]
    PRECOPY_FROM_FIELD_NUMBER: _ClassVar[int]
    SPARE_NODES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    spec: _common_pb2.JobSpec
    placement: _common_pb2.Placement
    checkpoint_uri: str
    resume_from: str
    env: _containers.ScalarMap[str, str]
    transfer_mode: str
    standby: bool
    precopy_from: str
    spare_nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., spec: _Optional[_Union[_common_pb2.JobSpec, _Mapping]] = ..., placement: _Optional[_Union[_common_pb2.Placement, _Mapping]] = ..., checkpoint_uri: _Optional[str] = ..., resume_from: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., transfer_mode: _Optional[str] = ..., standby: _Optional[bool] = ..., precopy_from: _Optional[str] = ..., spare_nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class Go(_message.Message):
    __slots__ = ("job_id", "attempt", "resume_from", "abort", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    resume_from: str
    abort: bool
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., resume_from: _Optional[str] = ..., abort: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class Stop(_message.Message):
    __slots__ = ("job_id", "attempt", "reason", "checkpoint_first", "grace_s")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIRST_FIELD_NUMBER: _ClassVar[int]
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    reason: StopReason
    checkpoint_first: bool
    grace_s: float
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., reason: _Optional[_Union[StopReason, str]] = ..., checkpoint_first: _Optional[bool] = ..., grace_s: _Optional[float] = ...) -> None: ...

class CheckpointNow(_message.Message):
    __slots__ = ("job_id", "attempt")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class DrainAgent(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class BrokerMessage(_message.Message):
    __slots__ = ("command_id", "registered", "launch", "stop", "checkpoint", "drain", "heartbeat_ack", "update_ack", "go")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_ACK_FIELD_NUMBER: _ClassVar[int]
    UPDATE_ACK_FIELD_NUMBER: _ClassVar[int]
    GO_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    registered: RegisterAck
    launch: Launch
    stop: Stop
    checkpoint: CheckpointNow
    drain: DrainAgent
    heartbeat_ack: HeartbeatAck
    update_ack: JobUpdateAck
    go: Go
    def __init__(self, command_id: _Optional[str] = ..., registered: _Optional[_Union[RegisterAck, _Mapping]] = ..., launch: _Optional[_Union[Launch, _Mapping]] = ..., stop: _Optional[_Union[Stop, _Mapping]] = ..., checkpoint: _Optional[_Union[CheckpointNow, _Mapping]] = ..., drain: _Optional[_Union[DrainAgent, _Mapping]] = ..., heartbeat_ack: _Optional[_Union[HeartbeatAck, _Mapping]] = ..., update_ack: _Optional[_Union[JobUpdateAck, _Mapping]] = ..., go: _Optional[_Union[Go, _Mapping]] = ...) -> None: ...

class HeartbeatAck(_message.Message):
    __slots__ = ("time", "broker_id")
    TIME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    time: float
    broker_id: str
    def __init__(self, time: _Optional[float] = ..., broker_id: _Optional[str] = ...) -> None: ...

class JobUpdateAck(_message.Message):
    __slots__ = ("job_id", "attempt", "state")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    state: AttemptState
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., state: _Optional[_Union[AttemptState, str]] = ...) -> None: ...
