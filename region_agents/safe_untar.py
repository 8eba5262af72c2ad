"""Extract an untrusted tar into a directory without ever following a link: our own
routine, independent of the Python release's ``tarfile`` extraction filters.

Why our own: ``tarfile``'s ``data`` filter decides by *string* (``os.path.realpath`` of
each member's name) and then writes by path. Both halves have failed: CVE-2025-4517
(nested 247-character directories reached through short symlinks push ``realpath``
past PATH_MAX, so it stops resolving and a link climbing ``../`` x16 passes the
check) wrote a file outside the target as root, and some Pythons (Debian's 3.11.2) have
no ``data_filter`` at all. Here nothing is decided by string and nothing is written by
path:

* every directory is opened relative to its parent's **directory fd** with
  ``O_NOFOLLOW | O_DIRECTORY`` (``openat``), starting from the target's own fd, and
  every file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` relative to such an fd.
  A symlink met on the way (planted by the tar or by anyone else) is refused by the
  kernel (``ELOOP``/``ENOTDIR``), not followed, so no write can leave the target;
* member names must be relative, without ``..``, NUL or empty-looking tricks, at most
  :data:`MAX_NAME_BYTES` long with components of at most :data:`MAX_COMPONENT_BYTES`;
* hard links, device files, FIFOs and sparse or unknown member types are refused;
* symbolic links are **kept only when they point downward**: a relative target
  without any ``..`` component (``run.sh -> bin/run.sh``, ``latest -> v2``). Such a
  link resolves, from the directory holding it, to a descendant of that directory
  (and so does any chain of them), so neither our extraction (which never follows
  links anyway) nor the job's code reading through them can reach outside the tree.
  An absolute or upward (``../x``) target is refused: a lexical "stays inside" check
  of an upward target is wrong once other links are involved (``a/l -> .`` makes
  ``a/l/..`` the root, not ``a``), which is the CVE's very shape.
* modes keep "executable or not" and owner/group/other read bits; setuid, setgid,
  sticky and group/other write bits are dropped, and the owner can always read and
  write what it extracted.

Refusing is whole: the first bad member stops the extraction with :class:`UnsafeMember`
naming it (the caller removes the half-made directory). This file imports only the
standard library: the agent runs it as a script (``python -I safe_untar.py``) in a
child process that has dropped to the job's user, so even a bug here cannot write where
that user could not (region_agents/workdir.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import tarfile
from typing import BinaryIO

MAX_NAME_BYTES = 1024  # a member's whole relative name, in bytes (UTF-8)
MAX_COMPONENT_BYTES = 255  # NAME_MAX on Linux file systems
MAX_LINK_BYTES = 1024  # a symlink's target
MAX_MEMBERS = 200_000  # a tar of millions of empty files would exhaust inodes, not code

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_NO_COPY_RANGE = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP}


class UnsafeMember(ValueError):
    """A member the extractor refuses (its name says which and why)."""


def split_name(name: str) -> list[str]:
    """The path components of a member name, or UnsafeMember.

    ``./a//b/`` -> ``["a", "b"]``; absolute names, ``..`` anywhere, NUL and over-long
    names or components are refused."""
    if "\x00" in name:
        raise UnsafeMember(f"{name!r}: NUL in a member name")
    if name.startswith("/"):
        raise UnsafeMember(f"{name!r}: absolute member name")
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) > MAX_NAME_BYTES:
        raise UnsafeMember(f"{name[:60]!r}...: member name over {MAX_NAME_BYTES} bytes")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    for p in parts:
        if p == "..":
            raise UnsafeMember(f"{name!r}: '..' in a member name")
        if len(p.encode("utf-8", "surrogateescape")) > MAX_COMPONENT_BYTES:
            raise UnsafeMember(f"{name[:60]!r}...: a component over {MAX_COMPONENT_BYTES} bytes")
    return parts


def check_link_target(name: str, target: str) -> None:
    """Refuse a symlink target that is empty, absolute or climbs (see the module doc)."""
    if not target or "\x00" in target:
        raise UnsafeMember(f"{name!r}: empty or NUL symlink target")
    if target.startswith("/"):
        raise UnsafeMember(f"{name!r} -> {target!r}: absolute symlink target")
    if len(target.encode("utf-8", "surrogateescape")) > MAX_LINK_BYTES:
        raise UnsafeMember(f"{name!r}: symlink target over {MAX_LINK_BYTES} bytes")
    if ".." in target.split("/"):
        raise UnsafeMember(f"{name!r} -> {target!r}: symlink target climbs out with '..'"
                           " (only links pointing down into the tree are kept)")


def _mode(member: tarfile.TarInfo, is_dir: bool) -> int:
    m = (member.mode or 0) & 0o755
    if is_dir:
        return m | 0o700
    m |= 0o600
    return m if m & 0o100 else m & ~0o111


def _open_dir(parent: int, name: str, create: bool) -> int:
    """``openat(parent, name, O_DIRECTORY|O_NOFOLLOW)``, made first when ``create``."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent)
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            raise UnsafeMember(f"{name!r} is not a real directory (a symlink or a file);"
                               " nothing is extracted through it") from None
        raise


def _copy(src: int, dst: int, offset: int, size: int) -> None:
    """``size`` bytes of ``src`` at ``offset`` into ``dst`` (in the kernel when it can)."""
    done = 0
    try:
        while done < size:
            n = os.copy_file_range(src, dst, size - done, offset + done)
            if n == 0:
                raise UnsafeMember(f"tar ended {size - done} bytes early")
            done += n
        return
    except OSError as e:
        if done or e.errno not in _NO_COPY_RANGE:
            raise
    while done < size:
        b = os.pread(src, min(size - done, 1 << 20), offset + done)
        if not b:
            raise UnsafeMember(f"tar ended {size - done} bytes early")
        os.write(dst, b)
        done += len(b)


def extract_fd(tar_fd: int, dest_fd: int) -> int:
    """Extract the tar open at ``tar_fd`` into the directory open at ``dest_fd``.

    Returns how many members were extracted; raises UnsafeMember (or OSError /
    tarfile.TarError for a broken tar) at the first member it will not write."""
    src: BinaryIO = os.fdopen(os.dup(tar_fd), "rb")
    count = 0
    with src, tarfile.open(fileobj=src, mode="r:") as tar:
        for member in tar:
            count += 1
            if count > MAX_MEMBERS:
                raise UnsafeMember(f"more than {MAX_MEMBERS} members")
            parts = split_name(member.name)
            if not parts:
                continue  # "." or "./": the target itself
            if member.issparse():
                raise UnsafeMember(f"{member.name!r}: sparse member")
            if member.islnk():
                raise UnsafeMember(f"{member.name!r}: hard link (not extracted)")
            if not (member.isreg() or member.isdir() or member.issym()):
                raise UnsafeMember(f"{member.name!r}: device, FIFO or unknown member type")
            if member.issym():
                check_link_target(member.name, member.linkname)
            _place(tar_fd, dest_fd, member, parts)
    return count


def _walk(dest_fd: int, parts: list[str], create: bool = True) -> int:
    """An fd of the directory ``parts`` under ``dest_fd``, one openat per component."""
    fd = os.dup(dest_fd)
    try:
        for p in parts:
            nxt = _open_dir(fd, p, create)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _place(tar_fd: int, dest_fd: int, member: tarfile.TarInfo, parts: list[str]) -> None:
    parent = _walk(dest_fd, parts[:-1])
    leaf = parts[-1]
    try:
        if member.isdir():
            fd = _open_dir(parent, leaf, create=True)
            try:  # always owner-rwx: later members still go in
                os.fchmod(fd, _mode(member, True))
            finally:
                os.close(fd)
        elif member.issym():
            try:
                os.symlink(member.linkname, leaf, dir_fd=parent)
            except FileExistsError:
                raise UnsafeMember(f"{member.name!r}: listed twice") from None
        else:
            try:
                out = os.open(leaf, _FILE_FLAGS, 0o600, dir_fd=parent)
            except FileExistsError:
                raise UnsafeMember(f"{member.name!r}: listed twice") from None
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise UnsafeMember(f"{member.name!r}: a symlink is in its place") from None
                raise
            try:
                if not stat.S_ISREG(os.fstat(out).st_mode):
                    raise UnsafeMember(f"{member.name!r}: not a regular file once opened")
                _copy(tar_fd, out, member.offset_data, member.size)
                os.fchmod(out, _mode(member, False))
            finally:
                os.close(out)
    finally:
        os.close(parent)


def extract(tar_path: str | os.PathLike[str], dest: str | os.PathLike[str]) -> int:
    """Extract ``tar_path`` into the directory ``dest`` (made if missing; it must not be
    a symlink itself). The path-taking convenience around :func:`extract_fd`."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(dest, 0o700)
    dest_fd = os.open(dest, _DIR_FLAGS)
    try:
        tar_fd = os.open(tar_path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return extract_fd(tar_fd, dest_fd)
        finally:
            os.close(tar_fd)
    finally:
        os.close(dest_fd)


def main(argv: list[str]) -> int:
    """``safe_untar.py TAR_FD DEST_FD``: the child the agent runs as the job's user;
    exit 0, or 2 with the reason on stderr."""
    try:
        n = extract_fd(int(argv[0]), int(argv[1]))
    except (UnsafeMember, OSError, tarfile.TarError, ValueError) as e:
        sys.stderr.write(f"{e}\n")
        return 2
    sys.stdout.write(f"{n}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
