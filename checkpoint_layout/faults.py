"""Which checkpoint-store errors are an outage and which are the job's own configuration.

Why one table: a store that refuses connections for half a minute used to be reported
by the trainer as a configuration error (exit 2: the job FAILED at once) or as an
unavailable resume checkpoint (exit 77: a restart spent per relaunch, three in a second).
Both are weather, not the job's fault. The trainer (``trainer/storage.py``,
``trainer/checkpoint.py``) and the agent (``region_agents/staging.py``) ask
:func:`classify` and exit / report ``EXIT_STORE_UNAVAILABLE`` for an outage, which the
broker answers by waiting with backoff (no restart spent; broker/jobs/store_wait.py).
docs/contracts.md ("Store faults") shows :data:`RULES` as a table; each row has a test
in tests/checkpoint_layout/test_faults.py.

Rows are matched in order against the error and everything that caused it
(:func:`checkpoint_layout.retry.chain`); the first row that matches wins. An error no
row matches is not a store fault this table knows (:func:`classify` returns None) and
keeps the caller's old meaning. Exception classes are named, not imported: this module
stays free of botocore (agents import it at start).
"""

from __future__ import annotations

import enum
import errno
from dataclasses import dataclass

from checkpoint_layout.retry import chain, error_code

# The trainer's / agent's exit code for "the checkpoint store is down; not the job's
# fault": the broker waits and relaunches without spending a restart
# (docs/contracts.md section 1).
EXIT_STORE_UNAVAILABLE = 81


class FaultClass(enum.StrEnum):
    """What a store error says about the job."""

    OUTAGE = "outage"  # infrastructure: wait with backoff, relaunch; no restart spent
    CONFIGURATION = "configuration"  # the job's own spec: fail, retrying will not help


@dataclass(frozen=True)
class FaultRule:
    """One row: an error matches if any of its exception class names (anywhere in its
    MRO), errnos, S3 error codes or HTTP statuses (inclusive range) match."""

    name: str
    fault: FaultClass
    exceptions: frozenset[str] = frozenset()
    errnos: frozenset[int] = frozenset()
    codes: frozenset[str] = frozenset()
    statuses: tuple[int, int] | None = None
    example: str = ""  # what a person sees; the docs table's last column

    def matches(self, exc: BaseException) -> bool:
        names = {k.__name__ for k in type(exc).__mro__}
        if names & self.exceptions:
            return True
        if isinstance(exc, OSError) and exc.errno in self.errnos:
            return True
        code, status = error_code(exc)
        if code and code in self.codes:
            return True
        return bool(self.statuses and status and self.statuses[0] <= status <= self.statuses[1])


_OUT, _CFG = FaultClass.OUTAGE, FaultClass.CONFIGURATION

RULES: tuple[FaultRule, ...] = (
    FaultRule("name does not resolve (DNS)", _OUT,
              exceptions=frozenset({"gaierror", "NameResolutionError"}),
              example="[Errno -2] Name or service not known"),
    FaultRule("connection refused", _OUT,
              exceptions=frozenset({"EndpointConnectionError", "ConnectionRefusedError"}),
              errnos=frozenset({errno.ECONNREFUSED}),
              example="Could not connect to the endpoint URL"),
    FaultRule("connection reset or closed", _OUT,
              exceptions=frozenset({"ConnectionClosedError", "ConnectionResetError",
                                    "BrokenPipeError", "ProtocolError", "ResponseStreamingError",
                                    "IncompleteReadError"}),
              errnos=frozenset({errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED}),
              example="Connection was closed before we received a valid response"),
    FaultRule("timeout or network down", _OUT,
              exceptions=frozenset({"ConnectTimeoutError", "ReadTimeoutError", "TimeoutError"}),
              errnos=frozenset({errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH,
                                errno.ENETDOWN}),
              example="Connect timeout on endpoint URL"),
    FaultRule("throttling", _OUT,
              codes=frozenset({"SlowDown", "Throttling", "ThrottlingException",
                               "RequestLimitExceeded", "TooManyRequests", "RequestTimeout"}),
              statuses=(429, 429),
              example="SlowDown: Please reduce your request rate"),
    FaultRule("not implemented (501)", _CFG,
              codes=frozenset({"NotImplemented", "XNotImplemented"}), statuses=(501, 501),
              example="NotImplemented: the store does not support this call"),
    FaultRule("server error (5xx)", _OUT,
              codes=frozenset({"InternalError", "ServiceUnavailable", "ServiceUnavailableException",
                               "BadGateway", "GatewayTimeout"}),
              statuses=(500, 599),
              example="ServiceUnavailable (503)"),
    FaultRule("local store full", _OUT,
              errnos=frozenset({errno.ENOSPC, errno.EDQUOT}),
              example="[Errno 28] No space left on device"),
    FaultRule("no credentials", _CFG,
              exceptions=frozenset({"NoCredentialsError", "PartialCredentialsError"}),
              example="Unable to locate credentials"),
    FaultRule("access denied or bad credentials", _CFG,
              codes=frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                               "ExpiredToken", "InvalidToken", "AllAccessDisabled"}),
              statuses=(401, 403),
              example="AccessDenied (403)"),
    FaultRule("no such bucket", _CFG,
              codes=frozenset({"NoSuchBucket"}),
              example="NoSuchBucket: The specified bucket does not exist"),
    FaultRule("wrong region or endpoint", _CFG,
              exceptions=frozenset({"InvalidEndpointConfigurationError", "InvalidRegionError"}),
              codes=frozenset({"PermanentRedirect", "AuthorizationHeaderMalformed",
                               "IllegalLocationConstraintException"}),
              statuses=(301, 301),
              example="PermanentRedirect (301)"),
    FaultRule("local store not writable", _CFG,
              errnos=frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR}),
              example="[Errno 30] Read-only file system"),
    FaultRule("other client error (4xx)", _CFG,
              statuses=(400, 499),
              example="InvalidBucketName (400)"),
)


def classify(exc: BaseException) -> FaultRule | None:
    """The first row of :data:`RULES` that ``exc`` or any of its causes matches.

    Row order decides, not depth: botocore reports a name that does not resolve and a
    refused connection alike as EndpointConnectionError, and only the socket error it
    wraps tells them apart, so the DNS row, first, looks through the whole chain."""
    causes = list(chain(exc))
    for rule in RULES:
        if any(rule.matches(e) for e in causes):
            return rule
    return None


def is_outage(exc: BaseException) -> bool:
    """The store is down or overloaded, not misconfigured: wait, do not fail the job."""
    rule = classify(exc)
    return rule is not None and rule.fault is FaultClass.OUTAGE


def describe(exc: BaseException) -> str:
    """One line: the error's first line, as a person would quote it."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]
