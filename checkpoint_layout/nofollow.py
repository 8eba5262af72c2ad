"""Small files the (root) agent writes into or reads from a directory a job owns,
without following a link the job could have planted there.

Why: a job owns its attempt directory (it is its HOME and cwd). The agent still writes
the stop deadline, the standby Go and the fence file there and reads the progress and
exit files back. ``Path.write_text`` follows a symlink, so a job's ``ln -s /etc/shadow
go.tmp`` would have had root overwrite any file; ``open`` of a FIFO would hang the
agent. Here: writes go to a fresh ``O_EXCL | O_NOFOLLOW`` temp file renamed over the
name (a rename replaces a planted link, it never writes through it), and reads open
with ``O_NOFOLLOW | O_NONBLOCK``, take regular files only and at most ``limit`` bytes.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

READ_LIMIT = 1 << 20


def replace_file(path: str | os.PathLike[str], data: str | bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically, through no symlink (see the module doc)."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a planted tmp (link, FIFO) is removed, not opened
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.write(fd, data.encode() if isinstance(data, str) else data)
    finally:
        os.close(fd)
    os.replace(tmp, p)


def touch(path: str | os.PathLike[str]) -> None:
    """Create ``path`` if missing (never through a link; an existing file is left)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        return
    os.close(fd)


def read_small(path: str | os.PathLike[str], limit: int = READ_LIMIT) -> tuple[bytes, float] | None:
    """(content, mtime) of a regular file at ``path`` (not a link, FIFO or device), or
    None. At most ``limit`` bytes are read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        return os.read(fd, limit), st.st_mtime
    except OSError:
        return None
    finally:
        os.close(fd)
