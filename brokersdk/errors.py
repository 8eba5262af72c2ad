"""The SDK's typed errors: every gRPC failure becomes a :class:`BrokerError` subclass.

Each carries the gRPC status code and the server's message (and an optional hint for
people), so callers can ``except InvalidJobSpec`` instead of inspecting ``grpc.RpcError``.
"""

from __future__ import annotations

import grpc

__all__ = [
    "AlreadyExists",
    "BrokerError",
    "BrokerUnavailable",
    "InvalidJobSpec",
    "JobNotFound",
    "NotFound",
    "PermissionDenied",
    "PreconditionFailed",
    "QuotaExceeded",
]


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
        details: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.hint = self.default_hint if hint is None else hint
        self.details = details  # gRPC's own text, for diagnose.py to read

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


class NotAuthenticated(PermissionDenied):
    """UNAUTHENTICATED: no credential, or a bad/revoked one."""


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
    grpc.StatusCode.UNAUTHENTICATED: NotAuthenticated,
    grpc.StatusCode.UNAVAILABLE: BrokerUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: BrokerUnavailable,
}


def translate_rpc_error(err: grpc.RpcError, address: str, *, job_id: str | None = None) -> BrokerError:
    """Turn a grpc.RpcError into the matching BrokerError subclass."""
    code = err.code() if hasattr(err, "code") else None
    details = (err.details() if hasattr(err, "details") else None) or ""
    made = _translate(code, details, address, job_id)
    made.details = details
    return made


def _translate(code: grpc.StatusCode | None, details: str, address: str,
               job_id: str | None) -> BrokerError:
    if code is grpc.StatusCode.UNAVAILABLE and any(
            w in details.lower() for w in ("ssl", "handshake", "certificate", "tls")):
        return BrokerUnavailable(
            f"TLS with the broker at {address} failed", code,
            hint="check CB_CA / the context's ca (the CA that signed the broker's certificate),"
            " and that certificate users use the broker's mutual-TLS port (agent_listen)")
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return NotAuthenticated(details or "not authenticated", code,
                                hint="not logged in: set CB_TOKEN, or pick a context (CB_CONTEXT /"
                                " --context) from a config made by `brokerctl dev-ca DIR`")
    if code is grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(details or "permission denied", code,
                                hint="your role does not allow this; `brokerctl whoami` shows who"
                                " you are, an operator can grant more")
    if code is grpc.StatusCode.UNAVAILABLE and "state store unavailable" in details:
        return BrokerUnavailable(
            f"the broker at {address} is up, but its state store is unavailable", code,
            hint="its database (SQLite file or Redis) is down or unreachable: retry in a"
            " moment; an operator should look at the broker's log")
    if code is grpc.StatusCode.UNAVAILABLE:
        return BrokerUnavailable(
            f"cannot reach the broker at {address}",
            code,
            hint="is it running? start one with `brokerctl serve` or point CB_SERVER (or --broker) at it"
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
