"""S3 client setup shared by the trainer and the agents' mover.

Endpoint: `AWS_ENDPOINT_URL_S3`, else `AWS_ENDPOINT_URL` (passed explicitly: boto3 reads
them itself only from botocore 1.31). Credentials and region: boto3's default chain
(`AWS_ACCESS_KEY_ID`, ... ; docs/contracts.md section 1). Path-style addressing, so any
S3-compatible server on a plain host:port works. Timeouts: 5 s connect, 60 s read for
transfers; a short-deadline probe client for "is the store reachable at all".
"""

from __future__ import annotations

import os
from typing import Any

from checkpoint_layout.retry import RetryPolicy

CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 60


def endpoint_from_env() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def make_s3_client(
    endpoint_url: str | None = None,
    *,
    retry: RetryPolicy | None = None,
    max_pool: int = 32,
) -> Any:
    """A boto3 S3 client for checkpoint transfers (see the module doc)."""
    import boto3
    from botocore.config import Config

    retry = retry or RetryPolicy()
    cfg = Config(
        retries={"mode": "standard", "total_max_attempts": max(1, retry.botocore_attempts)},
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        max_pool_connections=max_pool,
        s3={"addressing_style": "path"},
    )
    endpoint = endpoint_url or endpoint_from_env()
    client = boto3.session.Session().client("s3", endpoint_url=endpoint, config=cfg)
    client.meta.events.register("before-parameter-build.s3.CopyObject", _full_object_crc)
    return client


def make_probe_client(endpoint_url: str | None = None) -> Any:
    """Few retries and short timeouts: a wrong endpoint fails in seconds, not minutes."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url or endpoint_from_env(),
        config=Config(
            retries={"mode": "standard", "max_attempts": 3},
            connect_timeout=3,
            read_timeout=10,
            s3={"addressing_style": "path"},
        ),
    )


def _full_object_crc(params: dict[str, Any], **_: Any) -> None:
    """Ask CopyObject for a fresh full-object CRC32 of the copy.

    Why: the trainer uploads large files multipart, so their stored checksum is a
    *composite* (a CRC of part CRCs). A plain CopyObject may carry that value over as if
    it were a full-object checksum (moto does), and every later checksum-validated GET of
    the copy then fails (botocore FlexibleChecksumError): the resumed trainer would
    refuse a perfectly good checkpoint. With ChecksumAlgorithm set, the store computes
    the copy's checksum from its bytes (real S3 supports the same parameter)."""
    params.setdefault("ChecksumAlgorithm", "CRC32")
