from computebroker.v1 import common_pb2 as _common_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class HasWorkdirRequest(_message.Message):
    __slots__ = ("digest",)
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    digest: str
    def __init__(self, digest: _Optional[str] = ...) -> None: ...

class HasWorkdirResponse(_message.Message):
    __slots__ = ("exists", "size_bytes", "max_bytes")
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    exists: bool
    size_bytes: int
    max_bytes: int
    def __init__(self, exists: _Optional[bool] = ..., size_bytes: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class WorkdirChunk(_message.Message):
    __slots__ = ("digest", "size_bytes", "data")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    digest: str
    size_bytes: int
    data: bytes
    def __init__(self, digest: _Optional[str] = ..., size_bytes: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class FetchWorkdirRequest(_message.Message):
    __slots__ = ("digest",)
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    digest: str
    def __init__(self, digest: _Optional[str] = ...) -> None: ...
