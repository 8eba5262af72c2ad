from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_PHASE_UNSPECIFIED: _ClassVar[JobPhase]
    JOB_PHASE_PENDING: _ClassVar[JobPhase]
    JOB_PHASE_ADMITTED: _ClassVar[JobPhase]
    JOB_PHASE_LAUNCHING: _ClassVar[JobPhase]
    JOB_PHASE_RUNNING: _ClassVar[JobPhase]
    JOB_PHASE_CHECKPOINTING: _ClassVar[JobPhase]
    JOB_PHASE_SUSPENDED: _ClassVar[JobPhase]
    JOB_PHASE_MIGRATING: _ClassVar[JobPhase]
    JOB_PHASE_SUCCEEDED: _ClassVar[JobPhase]
    JOB_PHASE_FAILED: _ClassVar[JobPhase]
    JOB_PHASE_CANCELLED: _ClassVar[JobPhase]

class CapacityType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CAPACITY_TYPE_UNSPECIFIED: _ClassVar[CapacityType]
    CAPACITY_TYPE_ON_DEMAND: _ClassVar[CapacityType]
    CAPACITY_TYPE_SPOT: _ClassVar[CapacityType]
    CAPACITY_TYPE_TRAINING_PLAN: _ClassVar[CapacityType]
    CAPACITY_TYPE_RESERVED: _ClassVar[CapacityType]

class TopologyLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOPOLOGY_LEVEL_UNSPECIFIED: _ClassVar[TopologyLevel]
    TOPOLOGY_LEVEL_ULTRASERVER: _ClassVar[TopologyLevel]
    TOPOLOGY_LEVEL_LAYER_3: _ClassVar[TopologyLevel]
    TOPOLOGY_LEVEL_LAYER_2: _ClassVar[TopologyLevel]
    TOPOLOGY_LEVEL_LAYER_1: _ClassVar[TopologyLevel]
    TOPOLOGY_LEVEL_ZONE: _ClassVar[TopologyLevel]
    TOPOLOGY_LEVEL_REGION: _ClassVar[TopologyLevel]

class MigrationCause(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MIGRATION_CAUSE_UNSPECIFIED: _ClassVar[MigrationCause]
    MIGRATION_CAUSE_OTHER: _ClassVar[MigrationCause]
    MIGRATION_CAUSE_SPOT_INTERRUPTION: _ClassVar[MigrationCause]
    MIGRATION_CAUSE_REGION_DRAIN: _ClassVar[MigrationCause]
    MIGRATION_CAUSE_PLAN_ENDING: _ClassVar[MigrationCause]
    MIGRATION_CAUSE_PREEMPTED: _ClassVar[MigrationCause]
    MIGRATION_CAUSE_AGENT_LOST: _ClassVar[MigrationCause]
    MIGRATION_CAUSE_ATTEMPT_MISSING: _ClassVar[MigrationCause]
    MIGRATION_CAUSE_LAUNCH_REFUSED: _ClassVar[MigrationCause]
    MIGRATION_CAUSE_NODE_UNHEALTHY: _ClassVar[MigrationCause]
    MIGRATION_CAUSE_BETTER_CAPACITY: _ClassVar[MigrationCause]

class MigrationState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MIGRATION_STATE_UNSPECIFIED: _ClassVar[MigrationState]
    MIGRATION_STATE_CHECKPOINTING: _ClassVar[MigrationState]
    MIGRATION_STATE_QUEUED: _ClassVar[MigrationState]
    MIGRATION_STATE_LAUNCHING: _ClassVar[MigrationState]
    MIGRATION_STATE_TRANSFERRING: _ClassVar[MigrationState]
    MIGRATION_STATE_STARTING: _ClassVar[MigrationState]
    MIGRATION_STATE_DONE: _ClassVar[MigrationState]
    MIGRATION_STATE_FAILED: _ClassVar[MigrationState]
    MIGRATION_STATE_CANCELLED: _ClassVar[MigrationState]
JOB_PHASE_UNSPECIFIED: JobPhase
JOB_PHASE_PENDING: JobPhase
JOB_PHASE_ADMITTED: JobPhase
JOB_PHASE_LAUNCHING: JobPhase
JOB_PHASE_RUNNING: JobPhase
JOB_PHASE_CHECKPOINTING: JobPhase
JOB_PHASE_SUSPENDED: JobPhase
JOB_PHASE_MIGRATING: JobPhase
JOB_PHASE_SUCCEEDED: JobPhase
JOB_PHASE_FAILED: JobPhase
JOB_PHASE_CANCELLED: JobPhase
CAPACITY_TYPE_UNSPECIFIED: CapacityType
CAPACITY_TYPE_ON_DEMAND: CapacityType
CAPACITY_TYPE_SPOT: CapacityType
CAPACITY_TYPE_TRAINING_PLAN: CapacityType
CAPACITY_TYPE_RESERVED: CapacityType
TOPOLOGY_LEVEL_UNSPECIFIED: TopologyLevel
TOPOLOGY_LEVEL_ULTRASERVER: TopologyLevel
TOPOLOGY_LEVEL_LAYER_3: TopologyLevel
TOPOLOGY_LEVEL_LAYER_2: TopologyLevel
TOPOLOGY_LEVEL_LAYER_1: TopologyLevel
TOPOLOGY_LEVEL_ZONE: TopologyLevel
TOPOLOGY_LEVEL_REGION: TopologyLevel
MIGRATION_CAUSE_UNSPECIFIED: MigrationCause
MIGRATION_CAUSE_OTHER: MigrationCause
MIGRATION_CAUSE_SPOT_INTERRUPTION: MigrationCause
MIGRATION_CAUSE_REGION_DRAIN: MigrationCause
MIGRATION_CAUSE_PLAN_ENDING: MigrationCause
MIGRATION_CAUSE_PREEMPTED: MigrationCause
MIGRATION_CAUSE_AGENT_LOST: MigrationCause
MIGRATION_CAUSE_ATTEMPT_MISSING: MigrationCause
MIGRATION_CAUSE_LAUNCH_REFUSED: MigrationCause
MIGRATION_CAUSE_NODE_UNHEALTHY: MigrationCause
MIGRATION_CAUSE_BETTER_CAPACITY: MigrationCause
MIGRATION_STATE_UNSPECIFIED: MigrationState
MIGRATION_STATE_CHECKPOINTING: MigrationState
MIGRATION_STATE_QUEUED: MigrationState
MIGRATION_STATE_LAUNCHING: MigrationState
MIGRATION_STATE_TRANSFERRING: MigrationState
MIGRATION_STATE_STARTING: MigrationState
MIGRATION_STATE_DONE: MigrationState
MIGRATION_STATE_FAILED: MigrationState
MIGRATION_STATE_CANCELLED: MigrationState

class Node(_message.Message):
    __slots__ = ("id", "region", "zone", "instance_type", "accelerator", "gpus", "efa", "network_layer_1", "network_layer_2", "network_layer_3", "ultraserver_id", "capacity_type", "pool", "price_per_gpu_hour", "interruption_risk", "healthy", "cordoned", "labels", "spare")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    EFA_FIELD_NUMBER: _ClassVar[int]
    NETWORK_LAYER_1_FIELD_NUMBER: _ClassVar[int]
    NETWORK_LAYER_2_FIELD_NUMBER: _ClassVar[int]
    NETWORK_LAYER_3_FIELD_NUMBER: _ClassVar[int]
    ULTRASERVER_ID_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_TYPE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    PRICE_PER_GPU_HOUR_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTION_RISK_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    CORDONED_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SPARE_FIELD_NUMBER: _ClassVar[int]
    id: str
    region: str
    zone: str
    instance_type: str
    accelerator: str
    gpus: int
    efa: int
    network_layer_1: str
    network_layer_2: str
    network_layer_3: str
    ultraserver_id: str
    capacity_type: CapacityType
    pool: str
    price_per_gpu_hour: float
    interruption_risk: float
    healthy: bool
    cordoned: bool
    labels: _containers.ScalarMap[str, str]
    spare: bool
    def __init__(self, id: _Optional[str] = ..., region: _Optional[str] = ..., zone: _Optional[str] = ..., instance_type: _Optional[str] = ..., accelerator: _Optional[str] = ..., gpus: _Optional[int] = ..., efa: _Optional[int] = ..., network_layer_1: _Optional[str] = ..., network_layer_2: _Optional[str] = ..., network_layer_3: _Optional[str] = ..., ultraserver_id: _Optional[str] = ..., capacity_type: _Optional[_Union[CapacityType, str]] = ..., pool: _Optional[str] = ..., price_per_gpu_hour: _Optional[float] = ..., interruption_risk: _Optional[float] = ..., healthy: _Optional[bool] = ..., cordoned: _Optional[bool] = ..., labels: _Optional[_Mapping[str, str]] = ..., spare: _Optional[bool] = ...) -> None: ...

class Resources(_message.Message):
    __slots__ = ("nodes", "gpus_per_node", "accelerator")
    NODES_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_FIELD_NUMBER: _ClassVar[int]
    nodes: int
    gpus_per_node: int
    accelerator: str
    def __init__(self, nodes: _Optional[int] = ..., gpus_per_node: _Optional[int] = ..., accelerator: _Optional[str] = ...) -> None: ...

class TopologyConstraint(_message.Message):
    __slots__ = ("required", "preferred")
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_FIELD_NUMBER: _ClassVar[int]
    required: TopologyLevel
    preferred: TopologyLevel
    def __init__(self, required: _Optional[_Union[TopologyLevel, str]] = ..., preferred: _Optional[_Union[TopologyLevel, str]] = ...) -> None: ...

class Elasticity(_message.Message):
    __slots__ = ("min_nodes", "max_nodes")
    MIN_NODES_FIELD_NUMBER: _ClassVar[int]
    MAX_NODES_FIELD_NUMBER: _ClassVar[int]
    min_nodes: int
    max_nodes: int
    def __init__(self, min_nodes: _Optional[int] = ..., max_nodes: _Optional[int] = ...) -> None: ...

class TrainerSpec(_message.Message):
    __slots__ = ("total_steps", "checkpoint_every", "global_batch_size", "seed", "model", "step_sleep_s", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_EVERY_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STEP_SLEEP_S_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    total_steps: int
    checkpoint_every: int
    global_batch_size: int
    seed: int
    model: str
    step_sleep_s: float
    options: _containers.ScalarMap[str, str]
    def __init__(self, total_steps: _Optional[int] = ..., checkpoint_every: _Optional[int] = ..., global_batch_size: _Optional[int] = ..., seed: _Optional[int] = ..., model: _Optional[str] = ..., step_sleep_s: _Optional[float] = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("name", "team", "priority_class", "command", "image", "resources", "topology", "allowed_regions", "denied_regions", "preferred_regions", "dataset_uri", "dataset_region", "checkpoint_uri", "capacity_types", "max_price_per_gpu_hour", "elasticity", "expected_duration_s", "env", "trainer", "labels", "workdir", "resume_from", "resume_source", "max_node_failures", "node_failure_window_s")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_CLASS_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_REGIONS_FIELD_NUMBER: _ClassVar[int]
    DENIED_REGIONS_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_REGIONS_FIELD_NUMBER: _ClassVar[int]
    DATASET_URI_FIELD_NUMBER: _ClassVar[int]
    DATASET_REGION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_URI_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_TYPES_FIELD_NUMBER: _ClassVar[int]
    MAX_PRICE_PER_GPU_HOUR_FIELD_NUMBER: _ClassVar[int]
    ELASTICITY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_DURATION_S_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    TRAINER_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_FIELD_NUMBER: _ClassVar[int]
    RESUME_SOURCE_FIELD_NUMBER: _ClassVar[int]
    MAX_NODE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    NODE_FAILURE_WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    team: str
    priority_class: str
    command: _containers.RepeatedScalarFieldContainer[str]
    image: str
    resources: Resources
    topology: TopologyConstraint
    allowed_regions: _containers.RepeatedScalarFieldContainer[str]
    denied_regions: _containers.RepeatedScalarFieldContainer[str]
    preferred_regions: _containers.RepeatedScalarFieldContainer[str]
    dataset_uri: str
    dataset_region: str
    checkpoint_uri: str
    capacity_types: _containers.RepeatedScalarFieldContainer[CapacityType]
    max_price_per_gpu_hour: float
    elasticity: Elasticity
    expected_duration_s: float
    env: _containers.ScalarMap[str, str]
    trainer: TrainerSpec
    labels: _containers.ScalarMap[str, str]
    workdir: WorkdirRef
    resume_from: str
    resume_source: ResumeSource
    max_node_failures: int
    node_failure_window_s: float
    def __init__(self, name: _Optional[str] = ..., team: _Optional[str] = ..., priority_class: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., image: _Optional[str] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., topology: _Optional[_Union[TopologyConstraint, _Mapping]] = ..., allowed_regions: _Optional[_Iterable[str]] = ..., denied_regions: _Optional[_Iterable[str]] = ..., preferred_regions: _Optional[_Iterable[str]] = ..., dataset_uri: _Optional[str] = ..., dataset_region: _Optional[str] = ..., checkpoint_uri: _Optional[str] = ..., capacity_types: _Optional[_Iterable[_Union[CapacityType, str]]] = ..., max_price_per_gpu_hour: _Optional[float] = ..., elasticity: _Optional[_Union[Elasticity, _Mapping]] = ..., expected_duration_s: _Optional[float] = ..., env: _Optional[_Mapping[str, str]] = ..., trainer: _Optional[_Union[TrainerSpec, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., workdir: _Optional[_Union[WorkdirRef, _Mapping]] = ..., resume_from: _Optional[str] = ..., resume_source: _Optional[_Union[ResumeSource, _Mapping]] = ..., max_node_failures: _Optional[int] = ..., node_failure_window_s: _Optional[float] = ...) -> None: ...

class ResumeSource(_message.Message):
    __slots__ = ("job_id", "team", "prefix", "uri", "share_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    SHARE_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    team: str
    prefix: str
    uri: str
    share_id: str
    def __init__(self, job_id: _Optional[str] = ..., team: _Optional[str] = ..., prefix: _Optional[str] = ..., uri: _Optional[str] = ..., share_id: _Optional[str] = ...) -> None: ...

class CheckpointShare(_message.Message):
    __slots__ = ("id", "job_id", "grantee_team", "granted_by", "granted_time", "revoked_by", "revoked_time")
    ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GRANTEE_TEAM_FIELD_NUMBER: _ClassVar[int]
    GRANTED_BY_FIELD_NUMBER: _ClassVar[int]
    GRANTED_TIME_FIELD_NUMBER: _ClassVar[int]
    REVOKED_BY_FIELD_NUMBER: _ClassVar[int]
    REVOKED_TIME_FIELD_NUMBER: _ClassVar[int]
    id: str
    job_id: str
    grantee_team: str
    granted_by: str
    granted_time: float
    revoked_by: str
    revoked_time: float
    def __init__(self, id: _Optional[str] = ..., job_id: _Optional[str] = ..., grantee_team: _Optional[str] = ..., granted_by: _Optional[str] = ..., granted_time: _Optional[float] = ..., revoked_by: _Optional[str] = ..., revoked_time: _Optional[float] = ...) -> None: ...

class WorkdirRef(_message.Message):
    __slots__ = ("digest", "size_bytes")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    digest: str
    size_bytes: int
    def __init__(self, digest: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class NodeAssignment(_message.Message):
    __slots__ = ("node_id", "gpus", "zone", "network_layer_3", "ultraserver_id")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    NETWORK_LAYER_3_FIELD_NUMBER: _ClassVar[int]
    ULTRASERVER_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    gpus: int
    zone: str
    network_layer_3: str
    ultraserver_id: str
    def __init__(self, node_id: _Optional[str] = ..., gpus: _Optional[int] = ..., zone: _Optional[str] = ..., network_layer_3: _Optional[str] = ..., ultraserver_id: _Optional[str] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("region", "agent_id", "nodes", "capacity_type", "pool", "world_size", "price_per_gpu_hour", "explanation", "ranks")
    REGION_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_TYPE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    PRICE_PER_GPU_HOUR_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    region: str
    agent_id: str
    nodes: _containers.RepeatedCompositeFieldContainer[NodeAssignment]
    capacity_type: CapacityType
    pool: str
    world_size: int
    price_per_gpu_hour: float
    explanation: str
    ranks: int
    def __init__(self, region: _Optional[str] = ..., agent_id: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[NodeAssignment, _Mapping]]] = ..., capacity_type: _Optional[_Union[CapacityType, str]] = ..., pool: _Optional[str] = ..., world_size: _Optional[int] = ..., price_per_gpu_hour: _Optional[float] = ..., explanation: _Optional[str] = ..., ranks: _Optional[int] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("step", "total_steps", "samples_seen", "loss", "tokens_per_s", "last_checkpoint_step", "last_checkpoint_uri", "updated_time", "step_time", "resumed_time", "resume", "startup", "resumed_from_world_size", "world_size")
    class StartupEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_SEEN_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    LAST_CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    LAST_CHECKPOINT_URI_FIELD_NUMBER: _ClassVar[int]
    UPDATED_TIME_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_FIELD_NUMBER: _ClassVar[int]
    RESUMED_TIME_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    STARTUP_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FROM_WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    step: int
    total_steps: int
    samples_seen: int
    loss: float
    tokens_per_s: float
    last_checkpoint_step: int
    last_checkpoint_uri: str
    updated_time: float
    step_time: float
    resumed_time: float
    resume: ResumeInfo
    startup: _containers.ScalarMap[str, float]
    resumed_from_world_size: int
    world_size: int
    def __init__(self, step: _Optional[int] = ..., total_steps: _Optional[int] = ..., samples_seen: _Optional[int] = ..., loss: _Optional[float] = ..., tokens_per_s: _Optional[float] = ..., last_checkpoint_step: _Optional[int] = ..., last_checkpoint_uri: _Optional[str] = ..., updated_time: _Optional[float] = ..., step_time: _Optional[float] = ..., resumed_time: _Optional[float] = ..., resume: _Optional[_Union[ResumeInfo, _Mapping]] = ..., startup: _Optional[_Mapping[str, float]] = ..., resumed_from_world_size: _Optional[int] = ..., world_size: _Optional[int] = ...) -> None: ...

class ResumeInfo(_message.Message):
    __slots__ = ("tier", "step", "restored_from_peer")
    TIER_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FROM_PEER_FIELD_NUMBER: _ClassVar[int]
    tier: str
    step: int
    restored_from_peer: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tier: _Optional[str] = ..., step: _Optional[int] = ..., restored_from_peer: _Optional[_Iterable[int]] = ...) -> None: ...

class Goodput(_message.Message):
    __slots__ = ("productive_s", "queued_s", "lost_failure_s", "lost_preemption_s", "lost_migration_s", "wall_s", "starting_s", "cost_usd", "cost_by_capacity", "cost_by_region", "saved_usd")
    class CostByCapacityEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class CostByRegionEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    PRODUCTIVE_S_FIELD_NUMBER: _ClassVar[int]
    QUEUED_S_FIELD_NUMBER: _ClassVar[int]
    LOST_FAILURE_S_FIELD_NUMBER: _ClassVar[int]
    LOST_PREEMPTION_S_FIELD_NUMBER: _ClassVar[int]
    LOST_MIGRATION_S_FIELD_NUMBER: _ClassVar[int]
    WALL_S_FIELD_NUMBER: _ClassVar[int]
    STARTING_S_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    COST_BY_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    COST_BY_REGION_FIELD_NUMBER: _ClassVar[int]
    SAVED_USD_FIELD_NUMBER: _ClassVar[int]
    productive_s: float
    queued_s: float
    lost_failure_s: float
    lost_preemption_s: float
    lost_migration_s: float
    wall_s: float
    starting_s: float
    cost_usd: float
    cost_by_capacity: _containers.ScalarMap[str, float]
    cost_by_region: _containers.ScalarMap[str, float]
    saved_usd: float
    def __init__(self, productive_s: _Optional[float] = ..., queued_s: _Optional[float] = ..., lost_failure_s: _Optional[float] = ..., lost_preemption_s: _Optional[float] = ..., lost_migration_s: _Optional[float] = ..., wall_s: _Optional[float] = ..., starting_s: _Optional[float] = ..., cost_usd: _Optional[float] = ..., cost_by_capacity: _Optional[_Mapping[str, float]] = ..., cost_by_region: _Optional[_Mapping[str, float]] = ..., saved_usd: _Optional[float] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "spec", "phase", "version", "attempt", "client_request_id", "created_time", "updated_time", "started_time", "finished_time", "placement", "progress", "message", "pending_reason", "excluded_nodes", "goodput", "restarts", "stop_reason", "stop_requested_time", "phase_time", "last_checkpoint_time", "requeue_cause", "attempt_started_time", "relaunches", "migrations", "trace_parent", "standby", "launch_refusals", "refusals", "loss_series", "owner", "store_wait", "region_checkpoints", "preemptions", "checkpoint_shares", "node_recovery", "node_failures", "node_failure_times", "shrunk")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CLIENT_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATED_TIME_FIELD_NUMBER: _ClassVar[int]
    STARTED_TIME_FIELD_NUMBER: _ClassVar[int]
    FINISHED_TIME_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PENDING_REASON_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_NODES_FIELD_NUMBER: _ClassVar[int]
    GOODPUT_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_REQUESTED_TIME_FIELD_NUMBER: _ClassVar[int]
    PHASE_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_CHECKPOINT_TIME_FIELD_NUMBER: _ClassVar[int]
    REQUEUE_CAUSE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_STARTED_TIME_FIELD_NUMBER: _ClassVar[int]
    RELAUNCHES_FIELD_NUMBER: _ClassVar[int]
    MIGRATIONS_FIELD_NUMBER: _ClassVar[int]
    TRACE_PARENT_FIELD_NUMBER: _ClassVar[int]
    STANDBY_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_REFUSALS_FIELD_NUMBER: _ClassVar[int]
    REFUSALS_FIELD_NUMBER: _ClassVar[int]
    LOSS_SERIES_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    STORE_WAIT_FIELD_NUMBER: _ClassVar[int]
    REGION_CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SHARES_FIELD_NUMBER: _ClassVar[int]
    NODE_RECOVERY_FIELD_NUMBER: _ClassVar[int]
    NODE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    NODE_FAILURE_TIMES_FIELD_NUMBER: _ClassVar[int]
    SHRUNK_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: JobSpec
    phase: JobPhase
    version: int
    attempt: int
    client_request_id: str
    created_time: float
    updated_time: float
    started_time: float
    finished_time: float
    placement: Placement
    progress: Progress
    message: str
    pending_reason: str
    excluded_nodes: _containers.RepeatedScalarFieldContainer[str]
    goodput: Goodput
    restarts: int
    stop_reason: str
    stop_requested_time: float
    phase_time: float
    last_checkpoint_time: float
    requeue_cause: str
    attempt_started_time: float
    relaunches: int
    migrations: _containers.RepeatedCompositeFieldContainer[Migration]
    trace_parent: str
    standby: Standby
    launch_refusals: int
    refusals: _containers.RepeatedCompositeFieldContainer[LaunchRefusal]
    loss_series: _containers.RepeatedCompositeFieldContainer[LossPoint]
    owner: str
    store_wait: StoreWait
    region_checkpoints: _containers.RepeatedCompositeFieldContainer[RegionCheckpoint]
    preemptions: int
    checkpoint_shares: _containers.RepeatedCompositeFieldContainer[CheckpointShare]
    node_recovery: NodeRecovery
    node_failures: int
    node_failure_times: _containers.RepeatedScalarFieldContainer[float]
    shrunk: Shrunk
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., phase: _Optional[_Union[JobPhase, str]] = ..., version: _Optional[int] = ..., attempt: _Optional[int] = ..., client_request_id: _Optional[str] = ..., created_time: _Optional[float] = ..., updated_time: _Optional[float] = ..., started_time: _Optional[float] = ..., finished_time: _Optional[float] = ..., placement: _Optional[_Union[Placement, _Mapping]] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., message: _Optional[str] = ..., pending_reason: _Optional[str] = ..., excluded_nodes: _Optional[_Iterable[str]] = ..., goodput: _Optional[_Union[Goodput, _Mapping]] = ..., restarts: _Optional[int] = ..., stop_reason: _Optional[str] = ..., stop_requested_time: _Optional[float] = ..., phase_time: _Optional[float] = ..., last_checkpoint_time: _Optional[float] = ..., requeue_cause: _Optional[str] = ..., attempt_started_time: _Optional[float] = ..., relaunches: _Optional[int] = ..., migrations: _Optional[_Iterable[_Union[Migration, _Mapping]]] = ..., trace_parent: _Optional[str] = ..., standby: _Optional[_Union[Standby, _Mapping]] = ..., launch_refusals: _Optional[int] = ..., refusals: _Optional[_Iterable[_Union[LaunchRefusal, _Mapping]]] = ..., loss_series: _Optional[_Iterable[_Union[LossPoint, _Mapping]]] = ..., owner: _Optional[str] = ..., store_wait: _Optional[_Union[StoreWait, _Mapping]] = ..., region_checkpoints: _Optional[_Iterable[_Union[RegionCheckpoint, _Mapping]]] = ..., preemptions: _Optional[int] = ..., checkpoint_shares: _Optional[_Iterable[_Union[CheckpointShare, _Mapping]]] = ..., node_recovery: _Optional[_Union[NodeRecovery, _Mapping]] = ..., node_failures: _Optional[int] = ..., node_failure_times: _Optional[_Iterable[float]] = ..., shrunk: _Optional[_Union[Shrunk, _Mapping]] = ...) -> None: ...

class Shrunk(_message.Message):
    __slots__ = ("requested_nodes", "running_nodes", "since", "why", "lost_nodes", "capacity_since", "waiting", "grow_time", "grow_backs", "grow_nodes", "route")
    REQUESTED_NODES_FIELD_NUMBER: _ClassVar[int]
    RUNNING_NODES_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    LOST_NODES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_SINCE_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    GROW_TIME_FIELD_NUMBER: _ClassVar[int]
    GROW_BACKS_FIELD_NUMBER: _ClassVar[int]
    GROW_NODES_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    requested_nodes: int
    running_nodes: int
    since: float
    why: str
    lost_nodes: _containers.RepeatedScalarFieldContainer[str]
    capacity_since: float
    waiting: str
    grow_time: float
    grow_backs: int
    grow_nodes: _containers.RepeatedScalarFieldContainer[str]
    route: str
    def __init__(self, requested_nodes: _Optional[int] = ..., running_nodes: _Optional[int] = ..., since: _Optional[float] = ..., why: _Optional[str] = ..., lost_nodes: _Optional[_Iterable[str]] = ..., capacity_since: _Optional[float] = ..., waiting: _Optional[str] = ..., grow_time: _Optional[float] = ..., grow_backs: _Optional[int] = ..., grow_nodes: _Optional[_Iterable[str]] = ..., route: _Optional[str] = ...) -> None: ...

class NodeRecovery(_message.Message):
    __slots__ = ("failed_attempt", "lost_nodes", "survivors", "step_at_failure", "plan", "why", "relaunch_attempt", "replaced", "tier")
    class ReplacedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    FAILED_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    LOST_NODES_FIELD_NUMBER: _ClassVar[int]
    SURVIVORS_FIELD_NUMBER: _ClassVar[int]
    STEP_AT_FAILURE_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    RELAUNCH_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REPLACED_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    failed_attempt: int
    lost_nodes: _containers.RepeatedScalarFieldContainer[str]
    survivors: _containers.RepeatedScalarFieldContainer[str]
    step_at_failure: int
    plan: str
    why: str
    relaunch_attempt: int
    replaced: _containers.ScalarMap[str, str]
    tier: str
    def __init__(self, failed_attempt: _Optional[int] = ..., lost_nodes: _Optional[_Iterable[str]] = ..., survivors: _Optional[_Iterable[str]] = ..., step_at_failure: _Optional[int] = ..., plan: _Optional[str] = ..., why: _Optional[str] = ..., relaunch_attempt: _Optional[int] = ..., replaced: _Optional[_Mapping[str, str]] = ..., tier: _Optional[str] = ...) -> None: ...

class RegionCheckpoint(_message.Message):
    __slots__ = ("region", "step", "uri")
    REGION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    region: str
    step: int
    uri: str
    def __init__(self, region: _Optional[str] = ..., step: _Optional[int] = ..., uri: _Optional[str] = ...) -> None: ...

class StoreWait(_message.Message):
    __slots__ = ("region", "since", "until", "count", "message", "move_time", "last_time", "ranks_since", "ranks_message")
    REGION_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MOVE_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_TIME_FIELD_NUMBER: _ClassVar[int]
    RANKS_SINCE_FIELD_NUMBER: _ClassVar[int]
    RANKS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    region: str
    since: float
    until: float
    count: int
    message: str
    move_time: float
    last_time: float
    ranks_since: float
    ranks_message: str
    def __init__(self, region: _Optional[str] = ..., since: _Optional[float] = ..., until: _Optional[float] = ..., count: _Optional[int] = ..., message: _Optional[str] = ..., move_time: _Optional[float] = ..., last_time: _Optional[float] = ..., ranks_since: _Optional[float] = ..., ranks_message: _Optional[str] = ...) -> None: ...

class LossPoint(_message.Message):
    __slots__ = ("step", "loss")
    STEP_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    step: int
    loss: float
    def __init__(self, step: _Optional[int] = ..., loss: _Optional[float] = ...) -> None: ...

class LaunchRefusal(_message.Message):
    __slots__ = ("agent_id", "region", "message", "count", "time", "until")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    region: str
    message: str
    count: int
    time: float
    until: float
    def __init__(self, agent_id: _Optional[str] = ..., region: _Optional[str] = ..., message: _Optional[str] = ..., count: _Optional[int] = ..., time: _Optional[float] = ..., until: _Optional[float] = ...) -> None: ...

class Standby(_message.Message):
    __slots__ = ("attempt", "source_attempt", "placement", "checkpoint_uri", "launched_time", "go_time", "resume_from")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_URI_FIELD_NUMBER: _ClassVar[int]
    LAUNCHED_TIME_FIELD_NUMBER: _ClassVar[int]
    GO_TIME_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    source_attempt: int
    placement: Placement
    checkpoint_uri: str
    launched_time: float
    go_time: float
    resume_from: str
    def __init__(self, attempt: _Optional[int] = ..., source_attempt: _Optional[int] = ..., placement: _Optional[_Union[Placement, _Mapping]] = ..., checkpoint_uri: _Optional[str] = ..., launched_time: _Optional[float] = ..., go_time: _Optional[float] = ..., resume_from: _Optional[str] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("job_id", "seq", "time", "from_phase", "to_phase", "type", "reason", "actor", "region", "attempt", "message", "details")
    class DetailsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    FROM_PHASE_FIELD_NUMBER: _ClassVar[int]
    TO_PHASE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    seq: int
    time: float
    from_phase: JobPhase
    to_phase: JobPhase
    type: str
    reason: str
    actor: str
    region: str
    attempt: int
    message: str
    details: _containers.ScalarMap[str, str]
    def __init__(self, job_id: _Optional[str] = ..., seq: _Optional[int] = ..., time: _Optional[float] = ..., from_phase: _Optional[_Union[JobPhase, str]] = ..., to_phase: _Optional[_Union[JobPhase, str]] = ..., type: _Optional[str] = ..., reason: _Optional[str] = ..., actor: _Optional[str] = ..., region: _Optional[str] = ..., attempt: _Optional[int] = ..., message: _Optional[str] = ..., details: _Optional[_Mapping[str, str]] = ...) -> None: ...

class TransferStats(_message.Message):
    __slots__ = ("src_uri", "dst_uri", "bytes_total", "bytes_done", "seconds", "mb_per_s", "method", "done", "error", "start_time", "end_time", "retries")
    SRC_URI_FIELD_NUMBER: _ClassVar[int]
    DST_URI_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_DONE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    MB_PER_S_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    src_uri: str
    dst_uri: str
    bytes_total: int
    bytes_done: int
    seconds: float
    mb_per_s: float
    method: str
    done: bool
    error: str
    start_time: float
    end_time: float
    retries: int
    def __init__(self, src_uri: _Optional[str] = ..., dst_uri: _Optional[str] = ..., bytes_total: _Optional[int] = ..., bytes_done: _Optional[int] = ..., seconds: _Optional[float] = ..., mb_per_s: _Optional[float] = ..., method: _Optional[str] = ..., done: _Optional[bool] = ..., error: _Optional[str] = ..., start_time: _Optional[float] = ..., end_time: _Optional[float] = ..., retries: _Optional[int] = ...) -> None: ...

class Migration(_message.Message):
    __slots__ = ("job_id", "job_name", "seq", "cause", "state", "emergency", "from_region", "from_agent", "from_attempt", "from_world_size", "to_region", "to_agent", "to_attempt", "to_world_size", "checkpoint_step", "checkpoint_uri", "resume_from", "started_time", "checkpointed_time", "launched_time", "running_time", "first_step_time", "stop_signal_time", "exit_time", "spawn_time", "transfer", "checkpoint_s", "queue_s", "transfer_s", "launch_s", "first_step_s", "total_s", "orchestration_s", "work_lost_s", "message", "finished_time", "cause_code", "state_code", "make_before_break", "standby_launched_time", "go_time", "last_source_step_time", "downtime_s", "stop_held_until", "held_stop_grace_s", "precopy_from", "precopy_uri", "precopy_done_time", "precopy", "stop_sent_time", "from_ranks", "to_ranks", "from_price_per_gpu_hour", "to_price_per_gpu_hour")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EMERGENCY_FIELD_NUMBER: _ClassVar[int]
    FROM_REGION_FIELD_NUMBER: _ClassVar[int]
    FROM_AGENT_FIELD_NUMBER: _ClassVar[int]
    FROM_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FROM_WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    TO_REGION_FIELD_NUMBER: _ClassVar[int]
    TO_AGENT_FIELD_NUMBER: _ClassVar[int]
    TO_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TO_WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_URI_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_FIELD_NUMBER: _ClassVar[int]
    STARTED_TIME_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTED_TIME_FIELD_NUMBER: _ClassVar[int]
    LAUNCHED_TIME_FIELD_NUMBER: _ClassVar[int]
    RUNNING_TIME_FIELD_NUMBER: _ClassVar[int]
    FIRST_STEP_TIME_FIELD_NUMBER: _ClassVar[int]
    STOP_SIGNAL_TIME_FIELD_NUMBER: _ClassVar[int]
    EXIT_TIME_FIELD_NUMBER: _ClassVar[int]
    SPAWN_TIME_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_S_FIELD_NUMBER: _ClassVar[int]
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_S_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_S_FIELD_NUMBER: _ClassVar[int]
    FIRST_STEP_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    ORCHESTRATION_S_FIELD_NUMBER: _ClassVar[int]
    WORK_LOST_S_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FINISHED_TIME_FIELD_NUMBER: _ClassVar[int]
    CAUSE_CODE_FIELD_NUMBER: _ClassVar[int]
    STATE_CODE_FIELD_NUMBER: _ClassVar[int]
    MAKE_BEFORE_BREAK_FIELD_NUMBER: _ClassVar[int]
    STANDBY_LAUNCHED_TIME_FIELD_NUMBER: _ClassVar[int]
    GO_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_SOURCE_STEP_TIME_FIELD_NUMBER: _ClassVar[int]
    DOWNTIME_S_FIELD_NUMBER: _ClassVar[int]
    STOP_HELD_UNTIL_FIELD_NUMBER: _ClassVar[int]
    HELD_STOP_GRACE_S_FIELD_NUMBER: _ClassVar[int]
    PRECOPY_FROM_FIELD_NUMBER: _ClassVar[int]
    PRECOPY_URI_FIELD_NUMBER: _ClassVar[int]
    PRECOPY_DONE_TIME_FIELD_NUMBER: _ClassVar[int]
    PRECOPY_FIELD_NUMBER: _ClassVar[int]
    STOP_SENT_TIME_FIELD_NUMBER: _ClassVar[int]
    FROM_RANKS_FIELD_NUMBER: _ClassVar[int]
    TO_RANKS_FIELD_NUMBER: _ClassVar[int]
    FROM_PRICE_PER_GPU_HOUR_FIELD_NUMBER: _ClassVar[int]
    TO_PRICE_PER_GPU_HOUR_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    job_name: str
    seq: int
    cause: str
    state: str
    emergency: bool
    from_region: str
    from_agent: str
    from_attempt: int
    from_world_size: int
    to_region: str
    to_agent: str
    to_attempt: int
    to_world_size: int
    checkpoint_step: int
    checkpoint_uri: str
    resume_from: str
    started_time: float
    checkpointed_time: float
    launched_time: float
    running_time: float
    first_step_time: float
    stop_signal_time: float
    exit_time: float
    spawn_time: float
    transfer: TransferStats
    checkpoint_s: float
    queue_s: float
    transfer_s: float
    launch_s: float
    first_step_s: float
    total_s: float
    orchestration_s: float
    work_lost_s: float
    message: str
    finished_time: float
    cause_code: MigrationCause
    state_code: MigrationState
    make_before_break: bool
    standby_launched_time: float
    go_time: float
    last_source_step_time: float
    downtime_s: float
    stop_held_until: float
    held_stop_grace_s: float
    precopy_from: str
    precopy_uri: str
    precopy_done_time: float
    precopy: TransferStats
    stop_sent_time: float
    from_ranks: int
    to_ranks: int
    from_price_per_gpu_hour: float
    to_price_per_gpu_hour: float
    def __init__(self, job_id: _Optional[str] = ..., job_name: _Optional[str] = ..., seq: _Optional[int] = ..., cause: _Optional[str] = ..., state: _Optional[str] = ..., emergency: _Optional[bool] = ..., from_region: _Optional[str] = ..., from_agent: _Optional[str] = ..., from_attempt: _Optional[int] = ..., from_world_size: _Optional[int] = ..., to_region: _Optional[str] = ..., to_agent: _Optional[str] = ..., to_attempt: _Optional[int] = ..., to_world_size: _Optional[int] = ..., checkpoint_step: _Optional[int] = ..., checkpoint_uri: _Optional[str] = ..., resume_from: _Optional[str] = ..., started_time: _Optional[float] = ..., checkpointed_time: _Optional[float] = ..., launched_time: _Optional[float] = ..., running_time: _Optional[float] = ..., first_step_time: _Optional[float] = ..., stop_signal_time: _Optional[float] = ..., exit_time: _Optional[float] = ..., spawn_time: _Optional[float] = ..., transfer: _Optional[_Union[TransferStats, _Mapping]] = ..., checkpoint_s: _Optional[float] = ..., queue_s: _Optional[float] = ..., transfer_s: _Optional[float] = ..., launch_s: _Optional[float] = ..., first_step_s: _Optional[float] = ..., total_s: _Optional[float] = ..., orchestration_s: _Optional[float] = ..., work_lost_s: _Optional[float] = ..., message: _Optional[str] = ..., finished_time: _Optional[float] = ..., cause_code: _Optional[_Union[MigrationCause, str]] = ..., state_code: _Optional[_Union[MigrationState, str]] = ..., make_before_break: _Optional[bool] = ..., standby_launched_time: _Optional[float] = ..., go_time: _Optional[float] = ..., last_source_step_time: _Optional[float] = ..., downtime_s: _Optional[float] = ..., stop_held_until: _Optional[float] = ..., held_stop_grace_s: _Optional[float] = ..., precopy_from: _Optional[str] = ..., precopy_uri: _Optional[str] = ..., precopy_done_time: _Optional[float] = ..., precopy: _Optional[_Union[TransferStats, _Mapping]] = ..., stop_sent_time: _Optional[float] = ..., from_ranks: _Optional[int] = ..., to_ranks: _Optional[int] = ..., from_price_per_gpu_hour: _Optional[float] = ..., to_price_per_gpu_hour: _Optional[float] = ...) -> None: ...
