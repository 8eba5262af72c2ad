"""Directories the (root) agent makes for a job or hands to it: attempt directories and
checkpoint directories, opened by resolved path and ownership, never through a link.

Why: a job owns its attempt and checkpoint directories and can plant anything in them.
The agent once made a checkpoint directory with ``mkdir(parents, exist_ok)``, then
``os.chown``-ed and ``os.walk``-ed it as root: a job that had planted
``<its checkpoint dir>/evil/attempt-1 -> /root/secret`` and then submitted a second job
with ``checkpoint_uri=<its dir>/evil`` was handed the root-only directory. The rules:

* every path is walked one component at a time from a **trusted root** (the operator's
  resolved checkpoint roots, the work dir; ``/`` when none contains the path), each
  component opened relative to its parent's fd with ``O_NOFOLLOW | O_DIRECTORY``: a
  symlink refuses the launch (:class:`JobDirError`, which names it) instead of being
  followed, unless root owns it in a directory only root can write (an operator's
  ``/var/run -> /run``; checkpoint_dirs.open_dir_nofollow). Give the resolved path;
* with a job identity: every existing component below a trusted root must already
  belong to that identity (a directory of another team's, or one the agent made for
  someone else, is refused: "checkpoints by ownership, not by string"); above it (the
  ``/`` walk) root's directories may be crossed too. Missing components are made
  ``0700`` and handed to the identity by fd (``fchown``), so the identity owns every
  directory of its own path below the root;
* :func:`own_tree` gives the job what the agent itself wrote inside a directory the job
  owns (a checkpoint copied in from another region): only entries owned by the agent,
  directories by fd, regular files with a single link (a hard link a job made to a
  root file would otherwise be handed over; ``fs.protected_hardlinks=1`` is assumed
  too), never a symlink, device or FIFO.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from region_agents.checkpoint_dirs import open_dir_nofollow
from region_agents.executors.job_user import JobUser

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class JobDirError(ValueError):
    """A directory the agent would make or hand to a job is a link or someone else's."""


def trusted_root(path: str, roots: Iterable[str]) -> tuple[str, list[str]]:
    """(the resolved root to walk from, the components below it) for absolute ``path``.

    The longest configured root ``path`` lies under (by string: the agent checked that
    already) is resolved by ``realpath`` once (the operator's, trusted); ``/`` if none."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise JobDirError(f"{path}: '..' in a job directory")
    best: list[str] | None = None
    best_root = "/"
    for r in roots:
        if "://" in r or not r:
            continue
        rparts = [p for p in os.path.abspath(r).split("/") if p]
        if parts[: len(rparts)] == rparts and (best is None or len(rparts) > len(best)):
            best, best_root = rparts, os.path.realpath(r)
    if best is None:
        return "/", parts
    return best_root, parts[len(best):]


def open_job_dir(path: str, roots: Iterable[str], user: JobUser | None, *,
                 create: bool = True) -> int:
    """An fd of directory ``path`` (made if missing and ``create``) per the module rules;
    the caller closes it. Raises JobDirError (or FileNotFoundError when not ``create``)."""
    root, parts = trusted_root(path, roots)
    below_root = root != "/"
    euid = os.geteuid()
    if create and below_root:
        os.makedirs(root, exist_ok=True)  # the operator's root (resolved): trusted
    fd = os.open(root, DIR_FLAGS)
    walked = root
    try:
        for part in parts:
            walked = os.path.join(walked, part)
            made = False
            if create:
                try:
                    os.mkdir(part, 0o700 if user is not None else 0o755, dir_fd=fd)
                    made = True
                except FileExistsError:
                    pass
            try:
                nxt = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                try:  # an operator's link (root's, where only root writes) is crossed
                    nxt = open_dir_nofollow(walked)
                except OSError:
                    raise JobDirError(f"{walked} is a symlink or not a directory: the agent"
                                      " follows no link in a job's directory; give the"
                                      " resolved path") from None
            os.close(fd)
            fd = nxt
            if user is None:
                continue
            st = os.fstat(fd)
            if made and st.st_uid == euid:
                os.fchown(fd, user.uid, user.gid)
            elif st.st_uid != user.uid and (below_root or st.st_uid != euid):
                raise JobDirError(f"{walked} belongs to uid {st.st_uid}, not to this job's"
                                  f" identity (uid {user.uid}): a job may only use directories"
                                  " its own identity made")
        if user is not None and not parts:
            raise JobDirError(f"{path} is a configured root itself, not a job's directory")
        return fd
    except BaseException:
        os.close(fd)
        raise


def own_tree(dir_fd: int, user: JobUser, _depth: int = 0) -> None:
    """Give ``user`` what the agent wrote under the directory open at ``dir_fd`` (see the
    module doc); everything else is left as it is."""
    if _depth > 64:
        return
    euid = os.geteuid()
    with os.scandir(dir_fd) as it:
        names = [e.name for e in it]
    for name in names:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            pre = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if not (stat.S_ISDIR(pre.st_mode) or stat.S_ISREG(pre.st_mode)):
                continue  # a link, device, FIFO or socket is never opened
            fd = os.open(name, flags, dir_fd=dir_fd)
        except OSError:
            continue  # a symlink (ELOOP), gone, or a socket: not handed over
        try:
            st = os.fstat(fd)
            if st.st_uid != euid:
                continue
            if stat.S_ISDIR(st.st_mode):
                os.fchown(fd, user.uid, user.gid)
                own_tree(fd, user, _depth + 1)
            elif stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                os.fchown(fd, user.uid, user.gid)
        finally:
            os.close(fd)


def make_job_dir(path: str | Path, roots: Iterable[str], user: JobUser | None) -> None:
    """Make (or check) ``path`` for ``user`` and give it what the agent wrote inside."""
    fd = open_job_dir(str(path), roots, user)
    try:
        if user is not None:
            own_tree(fd, user)
    finally:
        os.close(fd)
