"""`manifest.json`: the commit record of one checkpoint (docs/contracts.md section 3).

Written LAST into `<root>/step-N/`; its presence means "complete". It lists every other
file of the directory with its size and (version 2: `sha256`, version 3: `xxh3_128`)
digest; version 1 has sizes only. The trainer writes it (trainer/checkpoint.py), the
trainer's loader and the region agents' mover read it: both parse it here, so a
manifest one accepts the other accepts too.
"""

from __future__ import annotations

import json
import time
from typing import Any

from checkpoint_layout.digests import HASH_ALGO

MANIFEST = "manifest.json"
MANIFEST_VERSION = 3  # 2: files[].sha256; 3: files[].xxh3_128, raw-tensor shard layout
SUPPORTED_VERSIONS = (1, 2, 3)


class ManifestError(ValueError):
    """A manifest that cannot be trusted: not JSON, a bad file list, an unknown version."""


def build(
    base: dict[str, Any],
    *,
    step: int,
    samples_seen: int,
    world_size: int,
    files: dict[str, int],
    digests: dict[str, str],
    created: float | None = None,
) -> dict[str, Any]:
    """The current-version manifest: `base` (job_id, attempt, model, ...) plus the commit
    fields and one `{"name", "size", "xxh3_128"}` entry per file, sorted by name."""
    missing = sorted(set(files) - set(digests))
    if missing:  # every file of a save is hashed while written; anything else is foreign
        raise ManifestError(f"no digest for files {missing}")
    manifest = dict(base)
    manifest.update(
        {
            "manifest_version": MANIFEST_VERSION,
            "step": step,
            "samples_seen": samples_seen,
            "world_size": world_size,
            "created": time.time() if created is None else created,
            "files": [
                {"name": n, "size": s, HASH_ALGO: digests[n]} for n, s in sorted(files.items())
            ],
        }
    )
    return manifest


def dumps(manifest: dict[str, Any]) -> bytes:
    """The on-disk bytes (indent 1, sorted keys: stable, diffable)."""
    return json.dumps(manifest, indent=1, sort_keys=True).encode()


def validate(manifest: Any, where: str = "manifest") -> dict[str, Any]:
    """Check the structure every reader relies on; returns the manifest unchanged.

    A missing `manifest_version` means 1. File names must be relative paths inside the
    checkpoint directory (a copy must never write outside it) and never the manifest."""
    if not isinstance(manifest, dict):
        raise ManifestError(f"{where} is not a JSON object")
    version = manifest.get("manifest_version", 1)
    if version not in SUPPORTED_VERSIONS:
        raise ManifestError(
            f"{where} has manifest_version {version!r}; this build reads versions "
            f"{', '.join(map(str, SUPPORTED_VERSIONS))}"
        )
    if "step" in manifest and (not isinstance(manifest["step"], int) or manifest["step"] < 0):
        raise ManifestError(f"{where} has an invalid step {manifest['step']!r}")
    files = manifest.get("files")
    if not isinstance(files, list):
        raise ManifestError(f"{where} has no file list")
    for f in files:
        try:
            name, size = str(f["name"]), int(f["size"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"{where} has an invalid file entry {f!r} ({exc})") from None
        if not name or name == MANIFEST or name.startswith("/") or ".." in name.split("/"):
            raise ManifestError(f"{where} lists an invalid file name {name!r}")
        if size < 0:
            raise ManifestError(f"{where} lists {name} with a negative size")
    return manifest


def loads(raw: bytes | str, where: str = "manifest") -> dict[str, Any]:
    """Parse and validate manifest bytes."""
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise ManifestError(f"{where} is not valid JSON ({exc})") from None
    return validate(manifest, where)


def entries(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The file entries with `name` as str and `size` as int (other keys kept)."""
    return [{**f, "name": str(f["name"]), "size": int(f["size"])} for f in manifest["files"]]
