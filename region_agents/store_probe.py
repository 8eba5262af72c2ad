"""Probe the region's checkpoint store at agent start: write a small object, delete it.

Why at start and reported in Register: a misconfigured bucket (typo, no credentials,
read-only mount) otherwise shows up only when a trainer first checkpoints, minutes
into a job, or worse at its emergency checkpoint on a spot notice. The broker gives a
region whose probe failed no placements and says why in the pending reason.
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from pathlib import Path

from checkpoint_layout.faults import is_outage


def resolve_store(bucket: str) -> str:
    """A local store path made absolute (against the agent's cwd, once); URIs unchanged.

    Why: ranks run in their attempt directory, so a relative path handed to them
    would point somewhere else for every attempt."""
    if not bucket:
        return ""
    if bucket.startswith("file://"):
        return "file://" + str(Path(bucket.removeprefix("file://")).resolve())
    if "://" in bucket:
        return bucket
    return str(Path(bucket).resolve())


def probe(bucket: str) -> str:
    """"" when ``bucket`` (s3://bucket/prefix or a directory) takes a write and a delete;
    else one line saying what failed."""
    return probe_store(bucket)[0]


def probe_store(bucket: str) -> tuple[str, bool]:
    """(:func:`probe`'s line, whether the failure is an outage rather than a
    misconfiguration, by checkpoint_layout/faults.py)."""
    try:
        return _probe(bucket), False
    except _Outage as e:
        return str(e), True


class _Outage(Exception):
    """The probe failed because the store is down (its one line is the message)."""


def _probe(bucket: str) -> str:
    if not bucket:
        return ""
    name = f".cb-probe-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    if bucket.startswith("s3://"):
        return _probe_s3(bucket, name)
    if "://" in bucket and not bucket.startswith("file://"):
        return f"unsupported checkpoint store {bucket!r} (use a directory or s3://bucket/prefix)"
    root = Path(bucket.removeprefix("file://"))
    path = root / name
    try:
        root.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"probe")
        path.unlink()
    except OSError as e:
        with contextlib.suppress(OSError):
            path.unlink()
        line = f"cannot write {root}: {e.strerror or e}"
        if is_outage(e):
            raise _Outage(line) from None
        return line
    return ""


def _probe_s3(bucket_uri: str, name: str) -> str:
    rest = bucket_uri.removeprefix("s3://")
    bucket, _, prefix = rest.partition("/")
    key = f"{prefix.strip('/')}/{name}" if prefix.strip("/") else name
    try:
        from region_agents.staging import s3_client

        s3 = s3_client()
        s3.put_object(Bucket=bucket, Key=key, Body=b"probe")
        s3.delete_object(Bucket=bucket, Key=key)
    except Exception as e:  # noqa: BLE001 - any failure means "not writable", said in one line
        line = f"cannot write s3://{bucket}/{key}: {str(e).splitlines()[0][:300]}"
        if is_outage(e):
            raise _Outage(line) from None
        return line
    return ""
