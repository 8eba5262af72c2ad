from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WhoAmIRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Principal(_message.Message):
    __slots__ = ("name", "team", "role", "region", "credential")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    name: str
    team: str
    role: str
    region: str
    credential: str
    def __init__(self, name: _Optional[str] = ..., team: _Optional[str] = ..., role: _Optional[str] = ..., region: _Optional[str] = ..., credential: _Optional[str] = ...) -> None: ...

class ApiToken(_message.Message):
    __slots__ = ("id", "user", "team", "role", "secret_hash", "created_time", "rotated_time", "revoked", "revoked_time", "created_by", "expires_time")
    ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SECRET_HASH_FIELD_NUMBER: _ClassVar[int]
    CREATED_TIME_FIELD_NUMBER: _ClassVar[int]
    ROTATED_TIME_FIELD_NUMBER: _ClassVar[int]
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    REVOKED_TIME_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_TIME_FIELD_NUMBER: _ClassVar[int]
    id: str
    user: str
    team: str
    role: str
    secret_hash: str
    created_time: float
    rotated_time: float
    revoked: bool
    revoked_time: float
    created_by: str
    expires_time: float
    def __init__(self, id: _Optional[str] = ..., user: _Optional[str] = ..., team: _Optional[str] = ..., role: _Optional[str] = ..., secret_hash: _Optional[str] = ..., created_time: _Optional[float] = ..., rotated_time: _Optional[float] = ..., revoked: _Optional[bool] = ..., revoked_time: _Optional[float] = ..., created_by: _Optional[str] = ..., expires_time: _Optional[float] = ...) -> None: ...

class IssuedToken(_message.Message):
    __slots__ = ("token", "secret")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    token: ApiToken
    secret: str
    def __init__(self, token: _Optional[_Union[ApiToken, _Mapping]] = ..., secret: _Optional[str] = ...) -> None: ...

class CreateTokenRequest(_message.Message):
    __slots__ = ("user", "team", "role", "ttl_s")
    USER_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    user: str
    team: str
    role: str
    ttl_s: float
    def __init__(self, user: _Optional[str] = ..., team: _Optional[str] = ..., role: _Optional[str] = ..., ttl_s: _Optional[float] = ...) -> None: ...

class ListTokensRequest(_message.Message):
    __slots__ = ("user", "include_revoked")
    USER_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_REVOKED_FIELD_NUMBER: _ClassVar[int]
    user: str
    include_revoked: bool
    def __init__(self, user: _Optional[str] = ..., include_revoked: _Optional[bool] = ...) -> None: ...

class ListTokensResponse(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[ApiToken]
    def __init__(self, tokens: _Optional[_Iterable[_Union[ApiToken, _Mapping]]] = ...) -> None: ...

class RevokeTokenRequest(_message.Message):
    __slots__ = ("token_id",)
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    token_id: str
    def __init__(self, token_id: _Optional[str] = ...) -> None: ...

class RotateTokenRequest(_message.Message):
    __slots__ = ("token_id",)
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    token_id: str
    def __init__(self, token_id: _Optional[str] = ...) -> None: ...

class AuditRecord(_message.Message):
    __slots__ = ("id", "time", "actor", "role", "team", "method", "target", "peer", "result", "message")
    ID_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    id: str
    time: float
    actor: str
    role: str
    team: str
    method: str
    target: str
    peer: str
    result: str
    message: str
    def __init__(self, id: _Optional[str] = ..., time: _Optional[float] = ..., actor: _Optional[str] = ..., role: _Optional[str] = ..., team: _Optional[str] = ..., method: _Optional[str] = ..., target: _Optional[str] = ..., peer: _Optional[str] = ..., result: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ListAuditRecordsRequest(_message.Message):
    __slots__ = ("actor", "since", "limit")
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    actor: str
    since: float
    limit: int
    def __init__(self, actor: _Optional[str] = ..., since: _Optional[float] = ..., limit: _Optional[int] = ...) -> None: ...

class ListAuditRecordsResponse(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[AuditRecord]
    def __init__(self, records: _Optional[_Iterable[_Union[AuditRecord, _Mapping]]] = ...) -> None: ...
