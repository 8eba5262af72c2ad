"""Fetch a job's workdir from the broker (by digest), cache it, unpack it per attempt.

Why per digest and per attempt: the tarball is fetched once per agent and verified
against its sha256 name (a cache hit costs nothing; a migrated job re-fetches the same
bytes in its new region), while each attempt unpacks its own fresh copy, so files a
previous attempt wrote or changed never leak into the next one. Extraction is our own
(region_agents/safe_untar.py, fd-relative, never following a link; it does not depend
on the Python release's tarfile filter) and, when jobs have their own Unix user, runs
as that user: no absolute paths, no ``..``, no links out of the directory, no hard
links or device files, whatever a tar holds.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from brokersdk.credentials import ClientCredentials, make_channel
from computebroker.v1 import workdir_pb2, workdir_pb2_grpc
from region_agents import safe_untar

if TYPE_CHECKING:
    from region_agents.executors.job_user import JobUser

log = logging.getLogger(__name__)

FETCH_TIMEOUT_S = 600.0


class WorkdirFetchError(ValueError):
    """The workdir could not be fetched or verified (the attempt fails with this)."""


class WorkdirCache:
    """Tarballs under ``<work_dir>/workdirs/sha256/<hex>.tar``; one fetch per digest."""

    def __init__(self, work_dir: str | os.PathLike[str], broker_address: Callable[[], str],
                 credentials: ClientCredentials | None = None) -> None:
        self.credentials = credentials or ClientCredentials(insecure=True)
        self.root = Path(work_dir).resolve() / "workdirs" / "sha256"
        self.broker_address = broker_address
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def path(self, digest: str) -> Path:
        return self.root / (digest.removeprefix("sha256:") + ".tar")

    def cached(self, digest: str) -> bool:
        return digest.startswith("sha256:") and self.path(digest).exists()

    def get(self, digest: str) -> Path:
        """The verified tarball for ``digest`` (fetched from the broker on a miss)."""
        if not digest.startswith("sha256:") or len(digest) != 71:
            raise WorkdirFetchError(f"workdir digest {digest!r} is not sha256:<64 hex>")
        with self._guard:
            lock = self._locks.setdefault(digest, threading.Lock())
        with lock:
            final = self.path(digest)
            if final.exists():
                return final
            self.root.mkdir(parents=True, exist_ok=True)
            # The agent's alone: unpacking reads the tar by fd, so no job needs to list
            # or read which code other teams run here.
            os.chmod(self.root.parent, 0o700, follow_symlinks=False)
            self._fetch(digest, final)
            return final

    def _fetch(self, digest: str, final: Path) -> None:
        address = self.broker_address()
        h = hashlib.sha256()
        n = 0
        fd, tmp = tempfile.mkstemp(prefix=".fetch-", dir=self.root)
        try:
            with os.fdopen(fd, "wb") as f, make_channel(
                address, self.credentials,
                options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)]
            ) as channel:
                stub = workdir_pb2_grpc.WorkdirServiceStub(channel)
                try:
                    for chunk in stub.FetchWorkdir(workdir_pb2.FetchWorkdirRequest(digest=digest),
                                                   timeout=FETCH_TIMEOUT_S):
                        h.update(chunk.data)
                        n += len(chunk.data)
                        f.write(chunk.data)
                except grpc.RpcError as e:
                    raise WorkdirFetchError(
                        f"cannot fetch workdir {digest} from the broker at {address}:"
                        f" {e.details() or e.code().name}") from None
            got = "sha256:" + h.hexdigest()
            if got != digest:
                raise WorkdirFetchError(f"fetched workdir hashes to {got}, not {digest}")
            os.replace(tmp, final)
            log.info("fetched workdir %s (%d bytes)", digest, n)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


def unpack(tar_path: str | os.PathLike[str], dest: str | os.PathLike[str],
           user: JobUser | None = None, python: str = sys.executable) -> Path:
    """Extract a workdir tarball into ``dest`` (made; its parent must be the agent's).

    With ``user`` (the job's Unix identity), ``dest`` is made, handed to that user by
    its fd, and the extraction runs in a child process that has dropped to that user
    (``python -I region_agents/safe_untar.py``, the tar and ``dest`` passed as open
    fds): the kernel, not our checks alone, then keeps every write inside what the job
    user may write. Without ``user`` (a non-root agent, or jobs allowed to run as root)
    it runs in this process. Either way the routine is region_agents/safe_untar.py: no
    link is ever followed, and links out, ``..``, absolute and over-long names, hard
    links and device files are refused (WorkdirFetchError names the member)."""
    out = Path(dest)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(out, 0o700)
        dest_fd = os.open(out, _DIR_FLAGS)
    except OSError as e:
        raise WorkdirFetchError(f"cannot unpack workdir into {out}: {e}") from None
    try:
        tar_fd = os.open(tar_path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if user is None:
                safe_untar.extract_fd(tar_fd, dest_fd)
            else:
                _extract_as(user, python, tar_fd, dest_fd)
        finally:
            os.close(tar_fd)
    except (safe_untar.UnsafeMember, tarfile.TarError, OSError) as e:
        raise WorkdirFetchError(f"cannot unpack workdir {tar_path}: {e}") from None
    finally:
        os.close(dest_fd)
    return out


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
UNPACK_TIMEOUT_S = 600.0


def _extract_as(user: JobUser, python: str, tar_fd: int, dest_fd: int) -> None:
    """Run safe_untar in a child that is ``user`` (no supplementary groups)."""
    os.fchown(dest_fd, user.uid, user.gid)  # by fd: the directory just made, nothing else
    try:
        res = subprocess.run(
            [python, "-I", safe_untar.__file__, str(tar_fd), str(dest_fd)],
            pass_fds=(tar_fd, dest_fd), capture_output=True, timeout=UNPACK_TIMEOUT_S,
            cwd="/", env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
            **user.popen_kwargs())  # type: ignore[call-overload]
    except subprocess.TimeoutExpired:
        raise safe_untar.UnsafeMember(f"unpacking took over {UNPACK_TIMEOUT_S:g} s") from None
    if res.returncode != 0:
        why = res.stderr.decode(errors="replace").strip()[-500:]
        raise safe_untar.UnsafeMember(why or f"unpacker exited with {res.returncode}")
