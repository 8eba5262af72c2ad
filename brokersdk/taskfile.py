"""SkyPilot-style task files and `run` strings, turned into our flat JobSpec fields.

Why accept SkyPilot's shape: it is what many ML engineers already write (``name``,
``resources.accelerators: H100:8``, ``num_nodes``, ``workdir``, ``envs``, ``run``), so
a task file moves over with few edits. There is no ``cloud``: the broker picks the
region. Our own fields (team, priority, spot, min/max nodes, checkpoint_uri,
trainer, ...) sit next to them at the top level.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

# Keys that mark a mapping as a task file rather than the flat or API JSON form.
TASK_KEYS = frozenset({"run", "envs", "num_nodes", "workdir"})
# Our names for SkyPilot-ish top-level keys; the rest pass through as flat JobSpec fields.
RENAMES = {"priority": "priority_class", "spot": "spot_ok", "num_nodes": "nodes", "envs": "env"}


class TaskFileError(ValueError):
    pass


API_RESOURCE_KEYS = frozenset({"nodes", "gpus_per_node", "gpusPerNode", "accelerator"})


def is_task_file(data: Mapping[str, Any]) -> bool:
    """A task file has SkyPilot keys, or a ``resources`` mapping that is not the API's
    own ``Resources`` message (nodes / gpus_per_node / accelerator)."""
    res = data.get("resources")
    if isinstance(res, Mapping):
        return bool(set(res) - API_RESOURCE_KEYS)
    return bool(TASK_KEYS & set(data))


def run_argv(run: str | list[str]) -> list[str]:
    """A `run` value as argv: a list is used as is; a one-line string is split like a
    shell would (shlex); a multi-line string is a script for ``bash -c``."""
    if isinstance(run, list):
        return run
    if not isinstance(run, str):
        raise TaskFileError(f"run must be a string or a list of strings, not {type(run).__name__}")
    text = run.strip()
    if not text:
        return []
    if "\n" in text:
        return ["bash", "-c", text]
    try:
        return shlex.split(text)
    except ValueError as e:
        raise TaskFileError(f"run {run!r} is not a valid command line: {e}") from None


def parse_accelerators(value: Any) -> tuple[str, int]:
    """``H100:8`` / ``{"H100": 8}`` / ``h100`` -> ("h100", 8)."""
    if isinstance(value, Mapping):
        if len(value) != 1:
            raise TaskFileError("resources.accelerators: give one type, e.g. H100:8")
        ((name, count),) = value.items()
    elif isinstance(value, str):
        name, _, count = value.partition(":")
        count = count or 1
    else:
        raise TaskFileError(f"resources.accelerators {value!r}: use NAME:COUNT, e.g. H100:8")
    try:
        n = int(count)
    except (TypeError, ValueError):
        raise TaskFileError(
            f"resources.accelerators {value!r}: the count must be a number") from None
    if n < 1:
        raise TaskFileError(f"resources.accelerators {value!r}: the count must be >= 1")
    return str(name).strip().lower(), n


def from_task_file(data: Mapping[str, Any]) -> dict[str, Any]:
    """A task file as flat JobSpec fields (the SDK's JobSpec validates them)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key == "resources":
            out.update(_resources(value))
        elif key == "cloud":
            raise TaskFileError("cloud: is not used here; the broker picks the region"
                                " (use allowed_regions / preferred_regions)")
        elif key == "setup":
            raise TaskFileError("setup: is not supported; put it at the top of run:")
        else:
            out[RENAMES.get(key, key)] = value
    return out


def _resources(res: Any) -> dict[str, Any]:
    if not isinstance(res, Mapping):
        raise TaskFileError("resources must be a mapping (accelerators: H100:8, ...)")
    out: dict[str, Any] = {}
    for key, value in res.items():
        if key == "accelerators":
            out["accelerator"], out["gpus_per_node"] = parse_accelerators(value)
        elif key == "use_spot":
            out["spot_ok"] = bool(value)
        elif key in ("region", "regions"):
            out["allowed_regions"] = [value] if isinstance(value, str) else list(value)
        elif key == "cloud":
            raise TaskFileError("resources.cloud is not used here; the broker picks the region")
        else:
            raise TaskFileError(
                f"resources.{key} is not supported; use accelerators, use_spot or region")
    return out
