"""Which checkpoints exist under a root, which is the latest complete one, and which one
a relaunch should resume from.

"Complete" = the step directory has its manifest (docs/contracts.md section 3). The
trainer's Store.list_steps and the agent both list through here, so they agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checkpoint_layout.manifest import MANIFEST
from checkpoint_layout.names import (
    STEP_PREFIX,
    check_scheme,
    local_path,
    parse_step,
    split_s3_uri,
    split_step_uri,
    step_name,
)


class CheckpointMissing(Exception):
    """The checkpoint to resume from is gone or incomplete and no newer complete one of the
    same directory exists. Not a configuration error: the store may catch up, or the
    broker may pick another resume point; the attempt is retried."""


def list_local_steps(root: str | Path) -> dict[int, bool]:
    """{step: has_manifest} for every step directory under a local root."""
    out: dict[int, bool] = {}
    root = Path(root)
    if not root.is_dir():
        return out
    for child in root.iterdir():
        step = parse_step(child.name)
        if step is not None and child.is_dir():
            out[step] = (child / MANIFEST).is_file()
    return out


def list_s3_steps(client: Any, bucket: str, prefix: str) -> dict[int, bool]:
    """{step: has_manifest} for every step "directory" under s3://bucket/prefix."""
    base = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
    out: dict[int, bool] = {}
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=base + STEP_PREFIX
    )
    for page in pages:
        for obj in page.get("Contents", []):
            name, _, fname = obj["Key"][len(base) :].partition("/")
            step = parse_step(name)
            if step is not None:
                out[step] = out.get(step, False) or fname == MANIFEST
    return out


def root_uri(base_uri: str) -> str:
    """The canonical spelling of a root (absolute path, or s3:// without a trailing /)."""
    check_scheme(base_uri)
    if base_uri.startswith("s3://"):
        return base_uri.rstrip("/")
    return str(local_path(base_uri))


def list_steps(base_uri: str, *, s3_client: Any = None) -> dict[int, bool]:
    """{step: has_manifest} under a local or s3:// root (S3: `s3_client`, or one from env)."""
    check_scheme(base_uri)
    if base_uri.startswith("s3://"):
        if s3_client is None:
            from checkpoint_layout.s3 import make_s3_client

            s3_client = make_s3_client()
        return list_s3_steps(s3_client, *split_s3_uri(base_uri))
    return list_local_steps(local_path(base_uri))


def latest_complete(steps: dict[int, bool], at_least: int = -1) -> int | None:
    """The highest complete step (>= at_least), or None."""
    complete = [s for s, ok in steps.items() if ok and s >= at_least]
    return max(complete) if complete else None


def latest_complete_checkpoint(base_uri: str, *, s3_client: Any = None) -> str | None:
    """URI of the highest-step checkpoint under `base_uri` that has a manifest, or None."""
    step = latest_complete(list_steps(base_uri, s3_client=s3_client))
    return None if step is None else f"{root_uri(base_uri)}/{step_name(step)}"


@dataclass(frozen=True)
class ResumePoint:
    uri: str  # the complete checkpoint to load
    requested: str  # what the broker named
    fell_back: bool  # uri != requested: the requested one was gone or incomplete


def resolve_resume(uri: str, *, s3_client: Any = None) -> ResumePoint:
    """The checkpoint a relaunch should load when the broker named `uri` (.../step-X).

    `uri` itself if it is complete; else the newest complete checkpoint of the same
    directory that is at least as new (step >= X); else CheckpointMissing. Why the
    fallback is sound: the attempt that wrote `uri` may still be alive (its agent paused
    or partitioned, not yet told to stop) and keeps training and pruning its own
    directory (keep_last), so the checkpoint the broker last heard of can vanish; its
    newer checkpoints are complete, consistent points of the same deterministic run.
    One listing of the directory, for local dirs and S3 alike."""
    parent, name = split_step_uri(uri)
    want = parse_step(name)
    assert want is not None
    steps = list_steps(parent, s3_client=s3_client)
    if steps.get(want, False):
        return ResumePoint(f"{root_uri(parent)}/{name}", uri, False)
    newer = latest_complete(steps, at_least=want)
    if newer is None:
        state = "incomplete (no manifest)" if want in steps else "gone"
        raise CheckpointMissing(
            f"{uri} is {state} and {parent} has no complete checkpoint "
            f"at step >= {want} (complete: {sorted(s for s, ok in steps.items() if ok) or 'none'})"
        )
    return ResumePoint(f"{root_uri(parent)}/{step_name(newer)}", uri, True)
