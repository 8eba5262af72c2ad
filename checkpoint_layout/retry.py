"""The one retry policy for checkpoint I/O, and the one "is this worth retrying" check.

Two layers multiply: botocore's "standard" mode retries a single request
(`botocore_attempts`), tenacity retries a whole unit of work (a part, a small object, a
file read or a file copy; a stream cut mid-body is not a request botocore can retry)
with exponential backoff from `wait_initial_s` up to `wait_max_s`, `attempts` times.
The trainer's storage layer uses `RetryPolicy()` (4 tries), the agents' mover
`MOVER_RETRY` (5: a copy is off the training path, so it can afford one more).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class TransientError(Exception):
    """Mixin for the project's own errors that a retry can fix (a stream that ended
    early, bytes that did not match and will be fetched again)."""


@dataclass(frozen=True)
class RetryPolicy:
    """`attempts` tries per unit of work (tenacity), each request up to `botocore_attempts`."""

    attempts: int = 4
    wait_initial_s: float = 0.25
    wait_max_s: float = 8.0
    botocore_attempts: int = 3

    def retrying(self, before_sleep: Callable[[Any], None] | None = None) -> Any:
        """A tenacity `Retrying` that retries transient errors and re-raises the last one."""
        from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

        return Retrying(
            retry=retry_if_exception(is_transient),
            stop=stop_after_attempt(max(1, self.attempts)),
            wait=wait_exponential(multiplier=self.wait_initial_s, max=self.wait_max_s),
            before_sleep=before_sleep,
            reraise=True,
        )

    def wrap(self, fn: F) -> F:
        """`fn` retried under this policy."""

        def call(*args: Any, **kwargs: Any) -> Any:
            return self.retrying()(fn, *args, **kwargs)

        return call  # type: ignore[return-value]


MOVER_RETRY = RetryPolicy(attempts=5)

_RETRY_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
    }
)


def error_code(exc: BaseException) -> tuple[str, int]:
    """(S3 error code, HTTP status) of a botocore ClientError-like exception, else ('', 0)."""
    resp = getattr(exc, "response", None)
    if isinstance(resp, dict):
        return str(resp.get("Error", {}).get("Code", "")), int(
            resp.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0
        )
    return "", 0


def chain(exc: BaseException) -> Iterator[BaseException]:
    """exc, then what caused it (boto3 wraps ClientErrors; s3transfer keeps last_exception)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        last = getattr(cur, "last_exception", None)
        if isinstance(last, BaseException):
            cur = last
        elif cur.__cause__ is not None or not cur.__suppress_context__:
            cur = cur.__cause__ or cur.__context__
        else:  # `raise ... from None`: explicitly not caused by what was being handled
            cur = None


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: throttling, 5xx (not 501), connection errors and timeouts, a
    response stream cut mid-body, or one of our own `TransientError`s."""
    from botocore.exceptions import (
        BotoCoreError,
        HTTPClientError,
        IncompleteReadError,
    )
    from botocore.exceptions import ConnectionError as BotoConnError

    # HTTPClientError covers a response stream cut mid-body (ResponseStreamingError) and
    # read timeouts.
    transport = (TransientError, BotoConnError, HTTPClientError, IncompleteReadError)
    for e in chain(exc):
        if isinstance(e, (*transport, ConnectionError, TimeoutError)):
            return True
        code, status = error_code(e)
        if code in {"NotImplemented", "XNotImplemented"} or status == 501:
            return False
        if status >= 500 or code in _RETRY_CODES:
            return True
        if isinstance(e, BotoCoreError) and "retries exceeded" in str(e).lower():
            return True
    return False
