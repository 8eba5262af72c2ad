"""Keys of the store's checkpoint-prefix index: which job chose which ``checkpoint_uri``.

Why an index: a SubmitJob that chooses a ``checkpoint_uri`` (or resumes from a checkpoint
path) must find the job whose prefix holds, equals or lies inside that path
(broker/jobs/checkpoint_shares.py). That used to be a scan of every job the broker ever
had, on every such submit. Both stores now keep one index entry per job that chose a
prefix, written in the same transaction (SQLite) or script (Redis) as the job, and
answer the two questions the rule asks with indexed lookups only:

* **ancestors**: the prefixes that equal or hold a path: one exact lookup per leading
  segment run of the path (:func:`ancestor_keys`, at most its depth);
* **descendants**: the prefixes strictly inside a path: one range of keys
  (:func:`descendant_range`), because a key's children all start with ``key + "/"``.

A key is ``<scheme>:/<segment>/<segment>...`` of the canonical URI
(checkpoint_layout.roots.canonical): ``/data/ckpt/a/``, ``file:///data/ckpt/a`` and
``/data//ckpt/a`` are one key, so a lookup never misses a prefix written another way.
A job's ``spec.checkpoint_uri`` never changes after submit, so an entry is written
once, with the job.
"""

from __future__ import annotations

from checkpoint_layout.roots import RootError, canonical


def _segments(uri: str) -> tuple[str, list[str]] | None:
    try:
        scheme, loc = canonical(uri)
    except RootError:
        return None
    return scheme, [p for p in loc.split("/") if p]


def prefix_key(uri: str) -> str:
    """The index key of ``uri`` ("" for a URI that is not canonical: never indexed)."""
    seg = _segments(uri)
    if seg is None:
        return ""
    scheme, parts = seg
    return f"{scheme}:/" + "/".join(parts)


def ancestor_keys(uri: str) -> list[str]:
    """The keys of every prefix that equals or holds ``uri``, shortest first."""
    seg = _segments(uri)
    if seg is None:
        return []
    scheme, parts = seg
    return [f"{scheme}:/" + "/".join(parts[:i]) for i in range(len(parts) + 1)]


def descendant_range(uri: str) -> tuple[str, str] | None:
    """``(low, high)``: the keys strictly inside ``uri`` are those with
    ``low <= key < high`` ("/" sorts just before "0", so nothing else falls between)."""
    key = prefix_key(uri)
    if not key:
        return None
    low = key if key.endswith("/") else key + "/"
    return low, low[:-1] + "0"


def job_prefix_key(job_spec_checkpoint_uri: str) -> str:
    """The key a job is indexed under ("" = the job chose no prefix: not indexed)."""
    return prefix_key(job_spec_checkpoint_uri) if job_spec_checkpoint_uri else ""
