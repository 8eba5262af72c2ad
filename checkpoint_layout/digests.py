"""File digests listed in manifests: xxh3_128 (version 3) and sha256 (version 2).

xxh3_128 guards against accidental damage (truncation, bit rot, a file from another
checkpoint) several times faster per core than sha256 (benchmarks/bench_hash.py); a
cryptographic hash adds nothing because whoever can rewrite a shard can rewrite the
manifest beside it. The mover also accepts a few hashlib algorithms for hand-made manifests.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

HASH_ALGO = "xxh3_128"  # manifest key of every file's digest, version 3
LEGACY_HASH_ALGOS = ("sha256",)  # manifest_version 2
ACCEPTED_ALGOS = (HASH_ALGO, *LEGACY_HASH_ALGOS, "sha1", "md5", "blake2b")
CHUNK = 8 << 20  # bytes per read: few syscalls, hashed while cache-hot


def new_hasher(algo: str = HASH_ALGO) -> Any:
    """A hashlib-like object: xxhash's xxh3_128, or any hashlib algorithm."""
    if algo == HASH_ALGO:
        import xxhash

        return xxhash.xxh3_128()
    return hashlib.new(algo)


def expected_digest(entry: dict[str, Any] | None) -> tuple[str, str] | None:
    """(algo, lowercase hex) a manifest file entry promises, or None (version 1: sizes only).

    Accepts `{"xxh3_128": hex}` (what the trainer writes), `{"sha256": hex}`, and
    `{"checksum": "algo:hex"}`."""
    if not entry:
        return None
    for algo in ACCEPTED_ALGOS:
        if isinstance(entry.get(algo), str) and entry[algo]:
            return algo, entry[algo].lower()
    cs = entry.get("checksum")
    if isinstance(cs, str) and ":" in cs:
        algo, _, hexd = cs.partition(":")
        if algo.lower() in ACCEPTED_ALGOS:
            return algo.lower(), hexd.lower()
    return None


def hash_bytes(data: bytes | memoryview, algo: str = HASH_ALGO) -> str:
    h = new_hasher(algo)
    h.update(data)
    return h.hexdigest()


def hash_file(path: str | Path, algo: str = HASH_ALGO) -> str:
    h = new_hasher(algo)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()
