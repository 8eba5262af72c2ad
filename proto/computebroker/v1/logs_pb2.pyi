from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LogChunk(_message.Message):
    __slots__ = ("job_id", "attempt", "rank", "stream", "offset", "lines", "sizes", "time")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    rank: int
    stream: str
    offset: int
    lines: _containers.RepeatedScalarFieldContainer[str]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    time: float
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., rank: _Optional[int] = ..., stream: _Optional[str] = ..., offset: _Optional[int] = ..., lines: _Optional[_Iterable[str]] = ..., sizes: _Optional[_Iterable[int]] = ..., time: _Optional[float] = ...) -> None: ...

class LogOffset(_message.Message):
    __slots__ = ("job_id", "attempt", "rank", "stream", "end_offset")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    rank: int
    stream: str
    end_offset: int
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., rank: _Optional[int] = ..., stream: _Optional[str] = ..., end_offset: _Optional[int] = ...) -> None: ...

class LogLine(_message.Message):
    __slots__ = ("attempt", "rank", "stream", "seq", "time", "text")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    rank: int
    stream: str
    seq: int
    time: float
    text: str
    def __init__(self, attempt: _Optional[int] = ..., rank: _Optional[int] = ..., stream: _Optional[str] = ..., seq: _Optional[int] = ..., time: _Optional[float] = ..., text: _Optional[str] = ...) -> None: ...

class LogAttemptHeader(_message.Message):
    __slots__ = ("attempt", "region", "world_size", "start_time", "agent_id", "ranks")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    region: str
    world_size: int
    start_time: float
    agent_id: str
    ranks: int
    def __init__(self, attempt: _Optional[int] = ..., region: _Optional[str] = ..., world_size: _Optional[int] = ..., start_time: _Optional[float] = ..., agent_id: _Optional[str] = ..., ranks: _Optional[int] = ...) -> None: ...

class LogRecord(_message.Message):
    __slots__ = ("attempt", "line", "dropped_lines")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    DROPPED_LINES_FIELD_NUMBER: _ClassVar[int]
    attempt: LogAttemptHeader
    line: LogLine
    dropped_lines: int
    def __init__(self, attempt: _Optional[_Union[LogAttemptHeader, _Mapping]] = ..., line: _Optional[_Union[LogLine, _Mapping]] = ..., dropped_lines: _Optional[int] = ...) -> None: ...
