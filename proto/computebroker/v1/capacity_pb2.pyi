from computebroker.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PlanState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLAN_STATE_UNSPECIFIED: _ClassVar[PlanState]
    PLAN_STATE_SCHEDULED: _ClassVar[PlanState]
    PLAN_STATE_ACTIVE: _ClassVar[PlanState]
    PLAN_STATE_EXPIRED: _ClassVar[PlanState]
    PLAN_STATE_CANCELLED: _ClassVar[PlanState]

class LendingStrategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LENDING_STRATEGY_UNSPECIFIED: _ClassVar[LendingStrategy]
    LENDING_STRATEGY_LEND_AND_BORROW: _ClassVar[LendingStrategy]
    LENDING_STRATEGY_LEND: _ClassVar[LendingStrategy]
    LENDING_STRATEGY_DONT_LEND: _ClassVar[LendingStrategy]
PLAN_STATE_UNSPECIFIED: PlanState
PLAN_STATE_SCHEDULED: PlanState
PLAN_STATE_ACTIVE: PlanState
PLAN_STATE_EXPIRED: PlanState
PLAN_STATE_CANCELLED: PlanState
LENDING_STRATEGY_UNSPECIFIED: LendingStrategy
LENDING_STRATEGY_LEND_AND_BORROW: LendingStrategy
LENDING_STRATEGY_LEND: LendingStrategy
LENDING_STRATEGY_DONT_LEND: LendingStrategy

class ListRegionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RegionInfo(_message.Message):
    __slots__ = ("name", "agent_ids", "connected", "last_heartbeat_time", "draining", "nodes", "total_gpus", "allocated_gpus", "free_gpus", "running_jobs", "checkpoint_bucket", "drain_reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_TIME_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_GPUS_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_GPUS_FIELD_NUMBER: _ClassVar[int]
    FREE_GPUS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_JOBS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_BUCKET_FIELD_NUMBER: _ClassVar[int]
    DRAIN_REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    connected: bool
    last_heartbeat_time: float
    draining: bool
    nodes: int
    total_gpus: int
    allocated_gpus: int
    free_gpus: int
    running_jobs: int
    checkpoint_bucket: str
    drain_reason: str
    def __init__(self, name: _Optional[str] = ..., agent_ids: _Optional[_Iterable[str]] = ..., connected: _Optional[bool] = ..., last_heartbeat_time: _Optional[float] = ..., draining: _Optional[bool] = ..., nodes: _Optional[int] = ..., total_gpus: _Optional[int] = ..., allocated_gpus: _Optional[int] = ..., free_gpus: _Optional[int] = ..., running_jobs: _Optional[int] = ..., checkpoint_bucket: _Optional[str] = ..., drain_reason: _Optional[str] = ...) -> None: ...

class ListRegionsResponse(_message.Message):
    __slots__ = ("regions",)
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    regions: _containers.RepeatedCompositeFieldContainer[RegionInfo]
    def __init__(self, regions: _Optional[_Iterable[_Union[RegionInfo, _Mapping]]] = ...) -> None: ...

class GetCapacityRequest(_message.Message):
    __slots__ = ("region", "by_block", "include_nodes")
    REGION_FIELD_NUMBER: _ClassVar[int]
    BY_BLOCK_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_NODES_FIELD_NUMBER: _ClassVar[int]
    region: str
    by_block: bool
    include_nodes: bool
    def __init__(self, region: _Optional[str] = ..., by_block: _Optional[bool] = ..., include_nodes: _Optional[bool] = ...) -> None: ...

class CapacityRow(_message.Message):
    __slots__ = ("region", "zone", "capacity_type", "pool", "accelerator", "block", "total_gpus", "allocated_gpus", "free_gpus", "borrowed_gpus", "price_per_gpu_hour", "unhealthy_gpus", "spare_gpus")
    REGION_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_TYPE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    TOTAL_GPUS_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_GPUS_FIELD_NUMBER: _ClassVar[int]
    FREE_GPUS_FIELD_NUMBER: _ClassVar[int]
    BORROWED_GPUS_FIELD_NUMBER: _ClassVar[int]
    PRICE_PER_GPU_HOUR_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_GPUS_FIELD_NUMBER: _ClassVar[int]
    SPARE_GPUS_FIELD_NUMBER: _ClassVar[int]
    region: str
    zone: str
    capacity_type: _common_pb2.CapacityType
    pool: str
    accelerator: str
    block: str
    total_gpus: int
    allocated_gpus: int
    free_gpus: int
    borrowed_gpus: int
    price_per_gpu_hour: float
    unhealthy_gpus: int
    spare_gpus: int
    def __init__(self, region: _Optional[str] = ..., zone: _Optional[str] = ..., capacity_type: _Optional[_Union[_common_pb2.CapacityType, str]] = ..., pool: _Optional[str] = ..., accelerator: _Optional[str] = ..., block: _Optional[str] = ..., total_gpus: _Optional[int] = ..., allocated_gpus: _Optional[int] = ..., free_gpus: _Optional[int] = ..., borrowed_gpus: _Optional[int] = ..., price_per_gpu_hour: _Optional[float] = ..., unhealthy_gpus: _Optional[int] = ..., spare_gpus: _Optional[int] = ...) -> None: ...

class NodeUsage(_message.Message):
    __slots__ = ("node", "allocated_gpus", "job_ids", "borrowed_gpus", "spare")
    NODE_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_GPUS_FIELD_NUMBER: _ClassVar[int]
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    BORROWED_GPUS_FIELD_NUMBER: _ClassVar[int]
    SPARE_FIELD_NUMBER: _ClassVar[int]
    node: _common_pb2.Node
    allocated_gpus: int
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    borrowed_gpus: int
    spare: bool
    def __init__(self, node: _Optional[_Union[_common_pb2.Node, _Mapping]] = ..., allocated_gpus: _Optional[int] = ..., job_ids: _Optional[_Iterable[str]] = ..., borrowed_gpus: _Optional[int] = ..., spare: _Optional[bool] = ...) -> None: ...

class GetCapacityResponse(_message.Message):
    __slots__ = ("rows", "nodes")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[CapacityRow]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeUsage]
    def __init__(self, rows: _Optional[_Iterable[_Union[CapacityRow, _Mapping]]] = ..., nodes: _Optional[_Iterable[_Union[NodeUsage, _Mapping]]] = ...) -> None: ...

class TrainingPlan(_message.Message):
    __slots__ = ("id", "name", "region", "zone", "instance_type", "accelerator", "instance_count", "gpus_per_instance", "start_time", "end_time", "state", "team", "price_per_gpu_hour")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_COUNT_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    PRICE_PER_GPU_HOUR_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    region: str
    zone: str
    instance_type: str
    accelerator: str
    instance_count: int
    gpus_per_instance: int
    start_time: float
    end_time: float
    state: PlanState
    team: str
    price_per_gpu_hour: float
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., region: _Optional[str] = ..., zone: _Optional[str] = ..., instance_type: _Optional[str] = ..., accelerator: _Optional[str] = ..., instance_count: _Optional[int] = ..., gpus_per_instance: _Optional[int] = ..., start_time: _Optional[float] = ..., end_time: _Optional[float] = ..., state: _Optional[_Union[PlanState, str]] = ..., team: _Optional[str] = ..., price_per_gpu_hour: _Optional[float] = ...) -> None: ...

class CreateTrainingPlanRequest(_message.Message):
    __slots__ = ("plan",)
    PLAN_FIELD_NUMBER: _ClassVar[int]
    plan: TrainingPlan
    def __init__(self, plan: _Optional[_Union[TrainingPlan, _Mapping]] = ...) -> None: ...

class ListTrainingPlansRequest(_message.Message):
    __slots__ = ("region", "include_ended")
    REGION_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_ENDED_FIELD_NUMBER: _ClassVar[int]
    region: str
    include_ended: bool
    def __init__(self, region: _Optional[str] = ..., include_ended: _Optional[bool] = ...) -> None: ...

class ListTrainingPlansResponse(_message.Message):
    __slots__ = ("plans",)
    PLANS_FIELD_NUMBER: _ClassVar[int]
    plans: _containers.RepeatedCompositeFieldContainer[TrainingPlan]
    def __init__(self, plans: _Optional[_Iterable[_Union[TrainingPlan, _Mapping]]] = ...) -> None: ...

class CancelTrainingPlanRequest(_message.Message):
    __slots__ = ("plan_id",)
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    def __init__(self, plan_id: _Optional[str] = ...) -> None: ...

class QuotaEntry(_message.Message):
    __slots__ = ("accelerator", "guaranteed_gpus", "borrow_limit_gpus", "lend_limit_gpus", "region_caps")
    class RegionCapsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ACCELERATOR_FIELD_NUMBER: _ClassVar[int]
    GUARANTEED_GPUS_FIELD_NUMBER: _ClassVar[int]
    BORROW_LIMIT_GPUS_FIELD_NUMBER: _ClassVar[int]
    LEND_LIMIT_GPUS_FIELD_NUMBER: _ClassVar[int]
    REGION_CAPS_FIELD_NUMBER: _ClassVar[int]
    accelerator: str
    guaranteed_gpus: int
    borrow_limit_gpus: int
    lend_limit_gpus: int
    region_caps: _containers.ScalarMap[str, int]
    def __init__(self, accelerator: _Optional[str] = ..., guaranteed_gpus: _Optional[int] = ..., borrow_limit_gpus: _Optional[int] = ..., lend_limit_gpus: _Optional[int] = ..., region_caps: _Optional[_Mapping[str, int]] = ...) -> None: ...

class TeamQuota(_message.Message):
    __slots__ = ("team", "cohort", "strategy", "quotas", "fair_share_weight", "used_gpus", "borrowed_gpus", "lent_gpus", "pending_jobs", "running_jobs", "usage")
    TEAM_FIELD_NUMBER: _ClassVar[int]
    COHORT_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    FAIR_SHARE_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    USED_GPUS_FIELD_NUMBER: _ClassVar[int]
    BORROWED_GPUS_FIELD_NUMBER: _ClassVar[int]
    LENT_GPUS_FIELD_NUMBER: _ClassVar[int]
    PENDING_JOBS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_JOBS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    team: str
    cohort: str
    strategy: LendingStrategy
    quotas: _containers.RepeatedCompositeFieldContainer[QuotaEntry]
    fair_share_weight: float
    used_gpus: int
    borrowed_gpus: int
    lent_gpus: int
    pending_jobs: int
    running_jobs: int
    usage: _containers.RepeatedCompositeFieldContainer[AcceleratorUsage]
    def __init__(self, team: _Optional[str] = ..., cohort: _Optional[str] = ..., strategy: _Optional[_Union[LendingStrategy, str]] = ..., quotas: _Optional[_Iterable[_Union[QuotaEntry, _Mapping]]] = ..., fair_share_weight: _Optional[float] = ..., used_gpus: _Optional[int] = ..., borrowed_gpus: _Optional[int] = ..., lent_gpus: _Optional[int] = ..., pending_jobs: _Optional[int] = ..., running_jobs: _Optional[int] = ..., usage: _Optional[_Iterable[_Union[AcceleratorUsage, _Mapping]]] = ...) -> None: ...

class AcceleratorUsage(_message.Message):
    __slots__ = ("accelerator", "guaranteed_gpus", "used_gpus", "borrowed_gpus", "lent_gpus", "pending_gpus")
    ACCELERATOR_FIELD_NUMBER: _ClassVar[int]
    GUARANTEED_GPUS_FIELD_NUMBER: _ClassVar[int]
    USED_GPUS_FIELD_NUMBER: _ClassVar[int]
    BORROWED_GPUS_FIELD_NUMBER: _ClassVar[int]
    LENT_GPUS_FIELD_NUMBER: _ClassVar[int]
    PENDING_GPUS_FIELD_NUMBER: _ClassVar[int]
    accelerator: str
    guaranteed_gpus: int
    used_gpus: int
    borrowed_gpus: int
    lent_gpus: int
    pending_gpus: int
    def __init__(self, accelerator: _Optional[str] = ..., guaranteed_gpus: _Optional[int] = ..., used_gpus: _Optional[int] = ..., borrowed_gpus: _Optional[int] = ..., lent_gpus: _Optional[int] = ..., pending_gpus: _Optional[int] = ...) -> None: ...

class SetTeamQuotaRequest(_message.Message):
    __slots__ = ("quota",)
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    quota: TeamQuota
    def __init__(self, quota: _Optional[_Union[TeamQuota, _Mapping]] = ...) -> None: ...

class GetTeamQuotaRequest(_message.Message):
    __slots__ = ("team",)
    TEAM_FIELD_NUMBER: _ClassVar[int]
    team: str
    def __init__(self, team: _Optional[str] = ...) -> None: ...

class ListTeamsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTeamsResponse(_message.Message):
    __slots__ = ("teams",)
    TEAMS_FIELD_NUMBER: _ClassVar[int]
    teams: _containers.RepeatedCompositeFieldContainer[TeamQuota]
    def __init__(self, teams: _Optional[_Iterable[_Union[TeamQuota, _Mapping]]] = ...) -> None: ...

class DrainRegionRequest(_message.Message):
    __slots__ = ("region", "undrain", "reason")
    REGION_FIELD_NUMBER: _ClassVar[int]
    UNDRAIN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    region: str
    undrain: bool
    reason: str
    def __init__(self, region: _Optional[str] = ..., undrain: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class DrainRegionResponse(_message.Message):
    __slots__ = ("region", "draining", "moved_job_ids")
    REGION_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    MOVED_JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    region: str
    draining: bool
    moved_job_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, region: _Optional[str] = ..., draining: _Optional[bool] = ..., moved_job_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CordonNodeRequest(_message.Message):
    __slots__ = ("node_id", "uncordon")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    UNCORDON_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    uncordon: bool
    def __init__(self, node_id: _Optional[str] = ..., uncordon: _Optional[bool] = ...) -> None: ...

class CordonNodeResponse(_message.Message):
    __slots__ = ("node_id", "cordoned")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CORDONED_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    cordoned: bool
    def __init__(self, node_id: _Optional[str] = ..., cordoned: _Optional[bool] = ...) -> None: ...

class PriorityClass(_message.Message):
    __slots__ = ("name", "value", "description", "is_default")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    IS_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: int
    description: str
    is_default: bool
    def __init__(self, name: _Optional[str] = ..., value: _Optional[int] = ..., description: _Optional[str] = ..., is_default: _Optional[bool] = ...) -> None: ...

class SetPriorityClassRequest(_message.Message):
    __slots__ = ("priority_class",)
    PRIORITY_CLASS_FIELD_NUMBER: _ClassVar[int]
    priority_class: PriorityClass
    def __init__(self, priority_class: _Optional[_Union[PriorityClass, _Mapping]] = ...) -> None: ...

class ListPriorityClassesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPriorityClassesResponse(_message.Message):
    __slots__ = ("priority_classes",)
    PRIORITY_CLASSES_FIELD_NUMBER: _ClassVar[int]
    priority_classes: _containers.RepeatedCompositeFieldContainer[PriorityClass]
    def __init__(self, priority_classes: _Optional[_Iterable[_Union[PriorityClass, _Mapping]]] = ...) -> None: ...

class DeletePriorityClassRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeletePriorityClassResponse(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetUsageSeriesRequest(_message.Message):
    __slots__ = ("window_s", "team")
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    window_s: float
    team: str
    def __init__(self, window_s: _Optional[float] = ..., team: _Optional[str] = ...) -> None: ...

class TeamUsageSeries(_message.Message):
    __slots__ = ("team", "pending_jobs", "admissions", "gpus_used", "spend_usd_per_hour", "now_pending_jobs", "now_gpus_used", "now_spend_usd_per_hour")
    TEAM_FIELD_NUMBER: _ClassVar[int]
    PENDING_JOBS_FIELD_NUMBER: _ClassVar[int]
    ADMISSIONS_FIELD_NUMBER: _ClassVar[int]
    GPUS_USED_FIELD_NUMBER: _ClassVar[int]
    SPEND_USD_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    NOW_PENDING_JOBS_FIELD_NUMBER: _ClassVar[int]
    NOW_GPUS_USED_FIELD_NUMBER: _ClassVar[int]
    NOW_SPEND_USD_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    team: str
    pending_jobs: _containers.RepeatedScalarFieldContainer[float]
    admissions: _containers.RepeatedScalarFieldContainer[float]
    gpus_used: _containers.RepeatedScalarFieldContainer[float]
    spend_usd_per_hour: _containers.RepeatedScalarFieldContainer[float]
    now_pending_jobs: int
    now_gpus_used: int
    now_spend_usd_per_hour: float
    def __init__(self, team: _Optional[str] = ..., pending_jobs: _Optional[_Iterable[float]] = ..., admissions: _Optional[_Iterable[float]] = ..., gpus_used: _Optional[_Iterable[float]] = ..., spend_usd_per_hour: _Optional[_Iterable[float]] = ..., now_pending_jobs: _Optional[int] = ..., now_gpus_used: _Optional[int] = ..., now_spend_usd_per_hour: _Optional[float] = ...) -> None: ...

class UsageSeries(_message.Message):
    __slots__ = ("step_s", "start_time", "end_time", "times", "teams", "sample_interval_s", "latest_time")
    STEP_S_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    TIMES_FIELD_NUMBER: _ClassVar[int]
    TEAMS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    LATEST_TIME_FIELD_NUMBER: _ClassVar[int]
    step_s: float
    start_time: float
    end_time: float
    times: _containers.RepeatedScalarFieldContainer[float]
    teams: _containers.RepeatedCompositeFieldContainer[TeamUsageSeries]
    sample_interval_s: float
    latest_time: float
    def __init__(self, step_s: _Optional[float] = ..., start_time: _Optional[float] = ..., end_time: _Optional[float] = ..., times: _Optional[_Iterable[float]] = ..., teams: _Optional[_Iterable[_Union[TeamUsageSeries, _Mapping]]] = ..., sample_interval_s: _Optional[float] = ..., latest_time: _Optional[float] = ...) -> None: ...

class UsageBucketTeam(_message.Message):
    __slots__ = ("team", "pending_sum", "gpus_sum", "spend_sum", "admissions")
    TEAM_FIELD_NUMBER: _ClassVar[int]
    PENDING_SUM_FIELD_NUMBER: _ClassVar[int]
    GPUS_SUM_FIELD_NUMBER: _ClassVar[int]
    SPEND_SUM_FIELD_NUMBER: _ClassVar[int]
    ADMISSIONS_FIELD_NUMBER: _ClassVar[int]
    team: str
    pending_sum: float
    gpus_sum: float
    spend_sum: float
    admissions: float
    def __init__(self, team: _Optional[str] = ..., pending_sum: _Optional[float] = ..., gpus_sum: _Optional[float] = ..., spend_sum: _Optional[float] = ..., admissions: _Optional[float] = ...) -> None: ...

class UsageBucket(_message.Message):
    __slots__ = ("time", "samples", "teams")
    TIME_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    TEAMS_FIELD_NUMBER: _ClassVar[int]
    time: float
    samples: int
    teams: _containers.RepeatedCompositeFieldContainer[UsageBucketTeam]
    def __init__(self, time: _Optional[float] = ..., samples: _Optional[int] = ..., teams: _Optional[_Iterable[_Union[UsageBucketTeam, _Mapping]]] = ...) -> None: ...

class UsageSeriesTier(_message.Message):
    __slots__ = ("step_s", "buckets")
    STEP_S_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    step_s: float
    buckets: _containers.RepeatedCompositeFieldContainer[UsageBucket]
    def __init__(self, step_s: _Optional[float] = ..., buckets: _Optional[_Iterable[_Union[UsageBucket, _Mapping]]] = ...) -> None: ...

class UsageSeriesState(_message.Message):
    __slots__ = ("tiers", "saved_time")
    TIERS_FIELD_NUMBER: _ClassVar[int]
    SAVED_TIME_FIELD_NUMBER: _ClassVar[int]
    tiers: _containers.RepeatedCompositeFieldContainer[UsageSeriesTier]
    saved_time: float
    def __init__(self, tiers: _Optional[_Iterable[_Union[UsageSeriesTier, _Mapping]]] = ..., saved_time: _Optional[float] = ...) -> None: ...
