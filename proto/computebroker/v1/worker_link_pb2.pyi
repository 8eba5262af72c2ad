from computebroker.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FollowRequest(_message.Message):
    __slots__ = ("worker", "pid")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    worker: int
    pid: int
    def __init__(self, worker: _Optional[int] = ..., pid: _Optional[int] = ...) -> None: ...

class ReadyResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CoreState(_message.Message):
    __slots__ = ("leading", "standby_message", "fence_epoch", "changed_jobs")
    LEADING_FIELD_NUMBER: _ClassVar[int]
    STANDBY_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FENCE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CHANGED_JOBS_FIELD_NUMBER: _ClassVar[int]
    leading: bool
    standby_message: str
    fence_epoch: int
    changed_jobs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, leading: _Optional[bool] = ..., standby_message: _Optional[str] = ..., fence_epoch: _Optional[int] = ..., changed_jobs: _Optional[_Iterable[str]] = ...) -> None: ...

class JobsCreatedRequest(_message.Message):
    __slots__ = ("worker", "jobs", "sender")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    worker: int
    jobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.Job]
    sender: str
    def __init__(self, worker: _Optional[int] = ..., jobs: _Optional[_Iterable[_Union[_common_pb2.Job, _Mapping]]] = ..., sender: _Optional[str] = ...) -> None: ...

class JobsCreatedResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
