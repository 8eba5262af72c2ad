"""Package a local directory as a job's workdir: a deterministic, content-addressed tar.

Why deterministic: the tar's sha256 names the upload, so the same code must give the
same bytes whoever packs it and whenever. Entries are sorted, and mtimes, owners and
permission bits beyond "executable or not" are fixed; the tar is not compressed
(gzip headers carry times, and code compresses little next to the cost of it on a
50 MB tree). ``.git``, ``__pycache__``, ``.venv`` and anything matched by a
``.brokerignore`` (gitignore-like: ``*.ckpt``, ``data/``, ``/build``) are skipped,
and a tree over the limit (default 100 MiB) is refused before anything is sent.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import os
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

DEFAULT_MAX_BYTES = 100 * 1024 * 1024
ALWAYS_IGNORED = (".git/", "__pycache__/", ".venv/", "*.pyc", ".brokerignore")
IGNORE_FILE = ".brokerignore"


class WorkdirError(ValueError):
    """The directory cannot be packaged (missing, too large, unreadable)."""


@dataclass(frozen=True)
class PackedWorkdir:
    """A packed tar on local disk (delete it with :meth:`close`)."""

    path: str
    digest: str  # "sha256:<hex>"
    size_bytes: int
    files: int

    def close(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


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


def iter_files(root: Path) -> list[tuple[str, Path]]:
    """(relative posix path, absolute path) of every packed file, sorted; directories
    are implied by their files (an empty directory is not packed)."""
    rules = IgnoreRules.for_dir(root)
    out: list[tuple[str, Path]] = []

    def walk(d: Path, prefix: str) -> None:
        with os.scandir(d) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            rel = f"{prefix}{e.name}"
            is_dir = e.is_dir(follow_symlinks=False)
            if rules.ignored(rel, is_dir):
                continue
            if is_dir:
                walk(Path(e.path), rel + "/")
            elif e.is_file(follow_symlinks=False) or e.is_symlink():
                out.append((rel, Path(e.path)))

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
    else:
        ti.size = st.st_size
        ti.mode = 0o755 if st.st_mode & 0o111 else 0o644
    return ti


def _too_large(files: list[tuple[str, Path]], limit: int, total: int) -> WorkdirError:
    sizes = sorted(((p.lstat().st_size, rel) for rel, p in files), reverse=True)[:3]
    biggest = ", ".join(f"{rel} ({s / 2**20:.1f} MiB)" for s, rel in sizes)
    return WorkdirError(
        f"workdir is over the {limit / 2**20:.0f} MiB limit ({total / 2**20:.1f} MiB of files);"
        f" largest: {biggest}. Add large files to {IGNORE_FILE} and read data from a dataset URI")


def pack(directory: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES,
         tmp_dir: str | None = None) -> PackedWorkdir:
    """Tar ``directory`` deterministically into a temp file; hash it while writing."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise WorkdirError(f"workdir {str(directory)!r} is not a directory")
    files = iter_files(root.resolve())
    total = sum(p.lstat().st_size for _, p in files)
    if total > max_bytes:
        raise _too_large(files, max_bytes, total)
    fd, tmp = tempfile.mkstemp(prefix="cb-workdir-", suffix=".tar", dir=tmp_dir)
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as raw:
            sink = _HashingWriter(raw, h)
            with tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for rel, path in files:
                    ti = _tarinfo(rel, path)
                    if ti.type == tarfile.SYMTYPE:
                        tar.addfile(ti)
                    else:
                        with open(path, "rb") as f:
                            tar.addfile(ti, f)
            size = sink.n
    except BaseException:
        os.unlink(tmp)
        raise
    if size > max_bytes:
        os.unlink(tmp)
        raise _too_large(files, max_bytes, size)
    return PackedWorkdir(tmp, "sha256:" + h.hexdigest(), size, len(files))


class _HashingWriter:
    """A write-only file that hashes and counts what passes through it (tarfile needs
    only ``write`` and ``tell``)."""

    def __init__(self, raw: BinaryIO, h: Any) -> None:
        self.raw, self.h, self.n = raw, h, 0

    def tell(self) -> int:
        return self.n

    def write(self, b: bytes) -> int:
        self.h.update(b)
        self.n += len(b)
        return self.raw.write(b)
