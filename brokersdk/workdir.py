"""Package a local directory as a job's workdir: a deterministic, content-addressed tar.

Why deterministic: the tar's sha256 names the upload, so the same code must give the
same bytes whoever packs it and whenever. Entries are sorted, and mtimes, owners and
permission bits beyond "executable or not" are fixed; the tar is not compressed
(gzip headers carry times, and code compresses little next to the cost of it on a
50 MB tree). ``.git``, ``__pycache__``, ``.venv``, anything matched by the root
``.gitignore`` (matched exactly as git does, by ``pathspec``: the data, logs and local
``checkpoints/`` a project already keeps out of git) and by a ``.brokerignore``
(gitignore-like: ``*.ckpt``, ``data/``, ``/build``; ``!pattern`` there cannot re-include
what ``.gitignore`` leaves out) are skipped, and a tree over the limit (default 100 MiB)
is refused before anything is sent. A symlink that is absolute or points up (``..``)
is refused here, at submit, with its name (:func:`_tarinfo`): every region's unpacker
would refuse it later.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_MAX_BYTES = 100 * 1024 * 1024
ALWAYS_IGNORED = (".git/", "__pycache__/", ".venv/", "*.pyc", ".brokerignore")
IGNORE_FILE = ".brokerignore"
GITIGNORE = ".gitignore"


class WorkdirError(ValueError):
    """The directory cannot be packaged (missing, too large, unreadable)."""


@dataclass(frozen=True)
class PackedWorkdir:
    """A scanned workdir: its digest and size, and the file list to stream it from.

    Why no temp file: the tar is made twice from the same (page-cached) files, once to
    hash it (the digest must be known before the upload, for the dedup check) and once
    while sending it; writing a 50 MB tar to disk in between cost more than reading the
    files again. If a file changes in between, the broker's digest check refuses the
    upload and nothing is stored."""

    root: str
    digest: str  # "sha256:<hex>"
    size_bytes: int
    files: tuple[tuple[str, Path], ...]

    def chunks(self, chunk_size: int = 1024 * 1024) -> Iterator[bytes]:
        """The tar's bytes, in chunks of about ``chunk_size``."""
        buf = _Buffer()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel, path in self.files:
                _add(tar, rel, path)
                while buf.pending() >= chunk_size:
                    yield buf.take(chunk_size)
        while buf.pending():
            yield buf.take(chunk_size)

    def write_to(self, path: str | os.PathLike[str]) -> None:
        with open(path, "wb") as f:
            for c in self.chunks():
                f.write(c)


class IgnoreRules:
    """gitignore-like patterns: ``name`` matches at any depth, ``/name`` at the root only,
    ``dir/`` only directories, ``!pattern`` re-includes; ``#`` starts a comment."""

    def __init__(self, lines: list[str]) -> None:
        self.rules: list[tuple[bool, bool, bool, str]] = []  # (negate, dir_only, anchored, pat)
        for raw in lines:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            line = line.removeprefix("!")
            dir_only = line.endswith("/")
            line = line.rstrip("/")
            anchored = line.startswith("/") or "/" in line
            self.rules.append((negate, dir_only, anchored, line.lstrip("/")))

    @classmethod
    def for_dir(cls, root: Path) -> IgnoreRules:
        lines = list(ALWAYS_IGNORED)
        f = root / IGNORE_FILE
        if f.is_file():
            lines += f.read_text(encoding="utf-8", errors="replace").splitlines()
        return cls(lines)

    def ignored(self, rel: str, is_dir: bool) -> bool:
        name = rel.rpartition("/")[2]
        out = False
        for negate, dir_only, anchored, pat in self.rules:
            if dir_only and not is_dir:
                continue
            hit = fnmatch.fnmatchcase(rel, pat) if anchored else fnmatch.fnmatchcase(name, pat)
            if hit:
                out = not negate
        return out


def _gitignore(root: Path) -> Any:
    """The root ``.gitignore`` as git reads it (pathspec's GitIgnoreSpec), or None."""
    f = root / GITIGNORE
    if not f.is_file():
        return None
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines(
        f.read_text(encoding="utf-8", errors="replace").splitlines())


def iter_files(root: Path) -> list[tuple[str, Path]]:
    """(relative posix path, absolute path) of every packed file, sorted; directories
    are implied by their files (an empty directory is not packed)."""
    rules = IgnoreRules.for_dir(root)
    git = _gitignore(root)
    out: list[tuple[str, Path]] = []

    def walk(d: Path, prefix: str) -> None:
        with os.scandir(d) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            rel = f"{prefix}{e.name}"
            is_dir = e.is_dir(follow_symlinks=False)
            if rules.ignored(rel, is_dir) or (
                    git is not None and git.match_file(rel + "/" if is_dir else rel)):
                continue
            if is_dir:
                walk(Path(e.path), rel + "/")
            elif e.is_file(follow_symlinks=False) or e.is_symlink():
                out.append((rel, Path(e.path)))  # links are checked by _tarinfo

    walk(root, "")
    return out


def _tarinfo(rel: str, path: Path) -> tarfile.TarInfo:
    st = path.lstat()
    ti = tarfile.TarInfo(rel)
    ti.mtime = 0
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    if path.is_symlink():
        ti.type = tarfile.SYMTYPE
        ti.linkname = os.readlink(path)
        ti.mode = 0o777
        if ti.linkname.startswith("/") or ".." in ti.linkname.split("/"):
            # The agent keeps only links pointing down into the tree (an upward or
            # absolute one could lead a job out of it): say so here, not at launch.
            raise WorkdirError(
                f"{rel} -> {ti.linkname}: a workdir may hold only symlinks that point down"
                " into it (no absolute target, no '..'); copy the file in, or add the link"
                f" to {IGNORE_FILE}")
    else:
        ti.size = st.st_size
        ti.mode = 0o755 if st.st_mode & 0o111 else 0o644
    return ti


def _too_large(files: list[tuple[str, Path]], limit: int, total: int) -> WorkdirError:
    sizes = sorted(((p.lstat().st_size, rel) for rel, p in files), reverse=True)[:3]
    biggest = ", ".join(f"{rel} ({s / 2**20:.1f} MiB)" for s, rel in sizes)
    return WorkdirError(
        f"workdir is over the {limit / 2**20:.1f} MiB limit ({total / 2**20:.1f} MiB of files);"
        f" largest: {biggest}. Add large files to {IGNORE_FILE} and read data from a dataset URI")


def _add(tar: tarfile.TarFile, rel: str, path: Path) -> None:
    ti = _tarinfo(rel, path)
    if ti.type == tarfile.SYMTYPE:
        tar.addfile(ti)
    else:
        with open(path, "rb") as f:
            tar.addfile(ti, f)


def pack(directory: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES) -> PackedWorkdir:
    """Scan ``directory`` and hash its deterministic tar (nothing is written to disk)."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise WorkdirError(f"workdir {str(directory)!r} is not a directory")
    files = iter_files(root.resolve())
    total = sum(p.lstat().st_size for _, p in files)
    if total > max_bytes:
        raise _too_large(files, max_bytes, total)
    sink = _HashingWriter(hashlib.sha256())
    with tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, path in files:
            _add(tar, rel, path)
    if sink.n > max_bytes:
        raise _too_large(files, max_bytes, sink.n)
    return PackedWorkdir(str(root.resolve()), "sha256:" + sink.h.hexdigest(), sink.n, tuple(files))


class _Buffer:
    """A write-only file that keeps what tarfile wrote until the generator takes it."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0  # pending bytes
        self.n = 0  # total written (tell)

    def tell(self) -> int:
        return self.n

    def write(self, b: bytes) -> int:
        self.parts.append(bytes(b))
        self.size += len(b)
        self.n += len(b)
        return len(b)

    def pending(self) -> int:
        return self.size

    def take(self, n: int) -> bytes:
        data = b"".join(self.parts)
        out, rest = data[:n], data[n:]
        self.parts = [rest] if rest else []
        self.size = len(rest)
        return out


class _HashingWriter:
    """A write-only file that only hashes and counts (tarfile needs ``write``, ``tell``)."""

    def __init__(self, h: Any) -> None:
        self.h, self.n = h, 0

    def tell(self) -> int:
        return self.n

    def write(self, b: bytes) -> int:
        self.h.update(b)
        self.n += len(b)
        return len(b)
