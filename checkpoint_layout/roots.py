"""Is a checkpoint URI inside an operator's allowed roots? (issue 12)

Why its own module: the broker checks a user's ``checkpoint_uri`` at submit and the
region agent checks it again at launch (the agent is the one that writes there, as a
job user, and must not trust the broker's copy of the rules). Both sides need the same
parsing: one spelling per location, no ``..`` escapes, bucket-or-directory prefixes
that match on path segments (``/data/ck`` does not contain ``/data/ckpt-other``).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable


class RootError(ValueError):
    """The URI is malformed or outside every allowed root (message says which)."""


def canonical(uri: str) -> tuple[str, str]:
    """``(scheme, location)``: ``("file", "/abs/dir")`` or ``("s3", "bucket/prefix")``.

    Refuses relative paths, ``.``/``..`` segments and unsupported schemes, so that a
    prefix test on the result is a containment test.
    """
    if uri.startswith("s3://"):
        scheme, rest = "s3", uri[len("s3://"):]
    elif uri.startswith("file://"):
        scheme, rest = "file", uri[len("file://"):]
    elif uri.startswith("/"):
        scheme, rest = "file", uri
    else:
        raise RootError(f"{uri!r}: use an absolute path, file:///path or s3://bucket/prefix")
    if scheme == "file" and not rest.startswith("/"):
        raise RootError(f"{uri!r}: a file:// URI needs an absolute path (file:///data/ckpt)")
    parts = [p for p in rest.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise RootError(f"{uri!r}: '.' and '..' path segments are not allowed")
    if scheme == "s3" and not parts:
        raise RootError(f"{uri!r} names no bucket (s3://bucket/prefix)")
    return scheme, ("/" if scheme == "file" else "") + "/".join(parts)


def under(uri: str, root: str) -> bool:
    """True when ``uri`` is ``root`` or inside it (segment-wise)."""
    s1, loc = canonical(uri)
    s2, base = canonical(root)
    if s1 != s2:
        return False
    base = base.rstrip("/")
    return loc == base or loc.startswith(base + "/") or base == ""


def check_under(uri: str, roots: Iterable[str], field: str = "checkpoint_uri") -> None:
    """Raise RootError unless ``uri`` lies under one of ``roots``."""
    roots = [r for r in roots if r]
    canonical(uri)
    if any(under(uri, r) for r in roots):
        return
    shown = ", ".join(sorted(set(roots))) or "none configured"
    raise RootError(f"{field} {uri!r} is outside the allowed checkpoint roots ({shown});"
                    " ask an operator to allow it, or leave it empty for the region's store")


def normalized_root(root: str) -> str:
    """A root as configured, in canonical spelling (for messages and comparisons)."""
    scheme, loc = canonical(root)
    return f"s3://{loc}" if scheme == "s3" else posixpath.normpath(loc)
