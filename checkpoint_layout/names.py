"""Checkpoint URIs and step directory names (docs/contracts.md section 3).

A checkpoint root is a local directory (`/path`, `file:///path`) or `s3://bucket/prefix`;
one checkpoint is `<root>/step-%09d`. Trainer and agent both parse names here so they
can never disagree about which directory is which step.
"""

from __future__ import annotations

from pathlib import Path

STEP_PREFIX = "step-"


class LayoutError(ValueError):
    """A URI or name that does not follow the checkpoint layout (a user/config mistake)."""


def step_name(step: int) -> str:
    """7 -> 'step-000000007'."""
    return f"{STEP_PREFIX}{step:09d}"


def parse_step(name: str) -> int | None:
    """'step-000000007' -> 7; anything else -> None."""
    if not name.startswith(STEP_PREFIX):
        return None
    try:
        return int(name[len(STEP_PREFIX) :])
    except ValueError:
        return None


def check_scheme(uri: str) -> None:
    """Only local paths, file:// and s3:// are checkpoint stores."""
    if "://" in uri and not uri.startswith(("s3://", "file://")):
        raise LayoutError(
            f"unsupported checkpoint URI {uri!r}: use a local path, file:///path or s3://bucket/prefix"
        )


def split_step_uri(uri: str) -> tuple[str, str]:
    """'s3://b/jobs/j/step-000000120' -> ('s3://b/jobs/j', 'step-000000120')."""
    uri = uri.rstrip("/")
    parent, _, name = uri.rpartition("/")
    if not parent or parse_step(name) is None:
        raise LayoutError(
            f"{uri!r} does not name a checkpoint directory (expected .../{STEP_PREFIX}NNNNNNNNN)"
        )
    return parent, name


def split_s3_uri(uri: str) -> tuple[str, str]:
    """'s3://bucket/a/b/' -> ('bucket', 'a/b'); a missing bucket is a LayoutError."""
    rest = uri.rstrip("/").removeprefix("s3://")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise LayoutError(f"checkpoint URI {uri!r} has no bucket (expected s3://bucket/prefix)")
    return bucket, prefix


def local_path(uri: str) -> Path:
    """The absolute directory a local checkpoint URI names (file:// stripped)."""
    return Path(uri.removeprefix("file://")).absolute()


def normalize(uri: str) -> str:
    """One spelling per location, so two URIs can be compared."""
    if uri.startswith("s3://"):
        return uri.rstrip("/")
    return str(local_path(uri)).rstrip("/") or "/"
