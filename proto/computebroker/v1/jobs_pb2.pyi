from computebroker.v1 import common_pb2 as _common_pb2
from computebroker.v1 import logs_pb2 as _logs_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ShareCheckpointsRequest(_message.Message):
    __slots__ = ("job_id", "grantee_team")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GRANTEE_TEAM_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    grantee_team: str
    def __init__(self, job_id: _Optional[str] = ..., grantee_team: _Optional[str] = ...) -> None: ...

class RevokeCheckpointShareRequest(_message.Message):
    __slots__ = ("job_id", "share_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SHARE_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    share_id: str
    def __init__(self, job_id: _Optional[str] = ..., share_id: _Optional[str] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("spec", "client_request_id")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    CLIENT_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    spec: _common_pb2.JobSpec
    client_request_id: str
    def __init__(self, spec: _Optional[_Union[_common_pb2.JobSpec, _Mapping]] = ..., client_request_id: _Optional[str] = ...) -> None: ...

class SubmitJobResponse(_message.Message):
    __slots__ = ("job", "created")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    job: _common_pb2.Job
    created: bool
    def __init__(self, job: _Optional[_Union[_common_pb2.Job, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("team", "phases", "region", "page_size", "page_token")
    TEAM_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    team: str
    phases: _containers.RepeatedScalarFieldContainer[_common_pb2.JobPhase]
    region: str
    page_size: int
    page_token: str
    def __init__(self, team: _Optional[str] = ..., phases: _Optional[_Iterable[_Union[_common_pb2.JobPhase, str]]] = ..., region: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[_common_pb2.Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("job_id", "after_seq", "include_progress")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    after_seq: int
    include_progress: bool
    def __init__(self, job_id: _Optional[str] = ..., after_seq: _Optional[int] = ..., include_progress: _Optional[bool] = ...) -> None: ...

class GetJobEventsRequest(_message.Message):
    __slots__ = ("job_id", "after_seq", "limit")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    after_seq: int
    limit: int
    def __init__(self, job_id: _Optional[str] = ..., after_seq: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class GetJobEventsResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[_common_pb2.JobEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[_common_pb2.JobEvent, _Mapping]]] = ...) -> None: ...

class GetJobLogsRequest(_message.Message):
    __slots__ = ("job_id", "tail_lines")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TAIL_LINES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    tail_lines: int
    def __init__(self, job_id: _Optional[str] = ..., tail_lines: _Optional[int] = ...) -> None: ...

class GetJobLogsResponse(_message.Message):
    __slots__ = ("lines",)
    LINES_FIELD_NUMBER: _ClassVar[int]
    lines: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, lines: _Optional[_Iterable[str]] = ...) -> None: ...

class ListMigrationsRequest(_message.Message):
    __slots__ = ("job_id", "team", "limit")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    team: str
    limit: int
    def __init__(self, job_id: _Optional[str] = ..., team: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListMigrationsResponse(_message.Message):
    __slots__ = ("migrations",)
    MIGRATIONS_FIELD_NUMBER: _ClassVar[int]
    migrations: _containers.RepeatedCompositeFieldContainer[_common_pb2.Migration]
    def __init__(self, migrations: _Optional[_Iterable[_Union[_common_pb2.Migration, _Mapping]]] = ...) -> None: ...

class StreamJobLogsRequest(_message.Message):
    __slots__ = ("job_id", "follow", "rank", "attempt", "tail")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    follow: bool
    rank: int
    attempt: int
    tail: int
    def __init__(self, job_id: _Optional[str] = ..., follow: _Optional[bool] = ..., rank: _Optional[int] = ..., attempt: _Optional[int] = ..., tail: _Optional[int] = ...) -> None: ...
