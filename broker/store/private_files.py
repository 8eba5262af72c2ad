"""The broker's state files are its own: 0600 files, 0700 directories it creates.

Why: the SQLite store holds every job's env (secrets such as HF_TOKEN), token hashes and
the audit log; with SQLite's default 0644 (umask permitting) a job running as another
user on the same host read a secret straight out of the file and its WAL. SQLite gives
the ``-wal`` and ``-shm`` files the permissions of the database file, so creating the
database 0600 before SQLite opens it covers all three; a file left by an older broker is
tightened at start (with its ``-wal``/``-shm``, if present) and the change logged.
"""

from __future__ import annotations

import logging
import os
import stat

log = logging.getLogger(__name__)

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_file(path: str) -> None:
    """Create ``path`` 0600 if missing (never truncates); tighten it if looser."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
    try:
        tighten_fd(fd, path)
    finally:
        os.close(fd)


def tighten_fd(fd: int, path: str) -> None:
    """chmod an open file to 0600 if group or others may read or write it."""
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    if mode & 0o077:
        os.fchmod(fd, FILE_MODE)
        log.warning("%s was mode %o: now %o (broker state is private to the broker's user)",
                    path, mode, FILE_MODE)


def private_sqlite(path: str) -> None:
    """The SQLite database, its WAL and its shared-memory file: 0600 (see the module)."""
    private_file(path)
    for suffix in ("-wal", "-shm", "-journal"):
        try:
            fd = os.open(path + suffix, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            continue
        try:
            tighten_fd(fd, path + suffix)
        finally:
            os.close(fd)


def private_dirs(path: str) -> None:
    """``os.makedirs`` with 0700 for the directories it creates (existing ones untouched:
    an operator may have chosen their mode)."""
    os.makedirs(path, mode=DIR_MODE, exist_ok=True)
