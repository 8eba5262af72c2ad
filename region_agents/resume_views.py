"""The agent's side of "checkpoints by owner": which job a checkpoint directory belongs
to, and what a rank is handed when it resumes (its own checkpoint, or a read-only copy of
one another job shared with it).

Why the agent checks too: the broker decides who may resume from what
(broker/jobs/checkpoint_shares.py), but only the agent sees the file system. On one host
two jobs of a team run as the same uid, so ownership by uid cannot tell job A's
directory from job B's, and a job can plant links in what it owns. So:

* :class:`OwnerBook` records, root-owned in the agent's work dir, which job's launch
  made each checkpoint prefix (resolved by a no-follow walk from a trusted root). A second
  job whose prefix equals, holds or lies in a recorded one is refused;
* :func:`resume_point` lets a rank resume from a local path only when it lies in its own
  prefix (recorded for no other job), or in the prefix of the job the broker named in
  ``spec.resume_source`` (a share in force). A shared local checkpoint is never handed
  over in place: it is copied, by fd and through no link, into a directory root owns
  and the job's identity may only read (``0750``/``0440``, group = the job's gid). Every
  entry of the source must be a directory or regular file of the source's identity: a
  symlink (or anything else) anywhere in it refuses the launch. An S3 URI is passed on
  as it is, after the same prefix check: the trainer writes only under its own
  ``CB_CHECKPOINT_URI``, never to the checkpoint it resumes from.

Without root the copy's modes are the only thing that keeps the job from writing it
(the job runs as the agent's own user); the source is still never written.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import threading
from pathlib import Path

from checkpoint_layout.names import parse_step
from checkpoint_layout.nofollow import read_small, replace_file
from checkpoint_layout.roots import RootError, canonical
from region_agents.executors.job_dirs import JobDirError, open_job_dir, trusted_root
from region_agents.executors.job_user import JobUser

SHARE_HOW = ("a job resumes only from its own checkpoints or from another job's that were"
             " shared with its team (`brokerctl share JOB_ID`), named in resume_from")
ATTEMPT_RE = re.compile(r"^attempt-\d+$")
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_DEPTH = 32


def parts_of(path: str) -> tuple[str, ...]:
    return tuple(p for p in path.split("/") if p and p != ".")


def inside(outer: str, inner: str) -> bool:
    """``inner`` is ``outer`` or below it, component-wise (both absolute, no ``..``)."""
    a, b = parts_of(outer), parts_of(inner)
    return b[: len(a)] == a


def own_prefix(checkpoint_dir: str) -> str:
    """A job's checkpoint prefix: the launch's ``<prefix>/attempt-<n>`` less the attempt."""
    ckpt = checkpoint_dir.rstrip("/")
    return ckpt.rsplit("/", 1)[0] if ATTEMPT_RE.match(ckpt.rsplit("/", 1)[-1]) else ckpt


def resolved(path: str, roots: list[str]) -> str:
    """``path`` spelled from its resolved trusted root (what the book records)."""
    root, parts = trusted_root(path, roots)
    return os.path.join(root, *parts)


class OwnerBook:
    """Resolved checkpoint prefix -> the job whose launch made it (see the module doc)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def _load(self) -> dict[str, str]:
        got = read_small(self.path, limit=64 << 20)
        if got is None:
            return {}
        data = json.loads(got[0])
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def owner(self, path: str) -> tuple[str, str] | None:
        """(prefix, job id) of the recorded prefix holding ``path`` (the longest), or None."""
        hits = [(p, j) for p, j in self._load().items() if inside(p, path)]
        return max(hits, key=lambda h: len(parts_of(h[0]))) if hits else None

    def claim(self, prefix: str, job_id: str) -> None:
        """Record ``prefix`` as ``job_id``'s; JobDirError when it equals, holds or lies
        in another job's."""
        with self._lock:
            table = self._load()
            for p, j in table.items():
                if j != job_id and (inside(p, prefix) or inside(prefix, p)):
                    raise JobDirError(
                        f"checkpoint directory {prefix} overlaps {p}, the checkpoints of job"
                        f" {j}: a job writes only under its own prefix; {SHARE_HOW}")
            if table.get(prefix) != job_id:
                table[prefix] = job_id
                self.path.parent.mkdir(parents=True, exist_ok=True)
                replace_file(self.path, json.dumps(table, sort_keys=True), mode=0o600)


def uri_key(uri: str) -> str:
    """``scheme://location`` of a canonical URI (``/a/b``, ``file:///a/b/`` -> ``file://a/b``),
    so the book's component-wise tests also tell schemes apart; JobDirError if not canonical."""
    try:
        scheme, loc = canonical(uri)
    except RootError as e:
        raise JobDirError(str(e)) from None
    return f"{scheme}://{loc.strip('/')}"


def check_named_owners(book: OwnerBook, spec: object) -> None:
    """The owner rules of :func:`resume_point`, by canonical name, for an executor whose
    checkpoint store the agent cannot walk (the Kubernetes executor: its pods write to
    S3 or to a volume the agent does not mount). The attempt's prefix is claimed for its
    job (refused when it equals, holds or lies in a prefix another job's launch claimed
    here), and its resume point must not lie in a prefix recorded for any job other than
    itself or the job the broker named as the share's source (``resume_source``).
    JobDirError names the refusal. What is *not* checked here, unlike a local launch:
    links and file ownership in the store (object stores have neither), and the copy (the
    pods read the source in place; the trainer writes only under its own prefix)."""
    ckpt = getattr(spec, "checkpoint_uri", "") or spec.spec.checkpoint_uri  # type: ignore[attr-defined]
    job_id = spec.job_id  # type: ignore[attr-defined]
    if ckpt:
        book.claim(uri_key(own_prefix(ckpt)), job_id)
    resume = getattr(spec, "resume_from", "")
    if not resume:
        return
    recorded = book.owner(uri_key(resume))
    src = spec.spec.resume_source.job_id  # type: ignore[attr-defined]
    if recorded is not None and recorded[1] not in (job_id, src):
        raise JobDirError(f"resume_from {resume} is in the checkpoints of job {recorded[1]},"
                          f" not this job's{' nor of job ' + src + ' that shared them' if src else ''}:"
                          f" {SHARE_HOW}")


def _own_default(path: str, job_id: str) -> bool:
    """``.../jobs/<job_id>/...``: the job's default prefix in any region's store (a move
    resumes from the store of the region it came from)."""
    p = parts_of(path.split("://", 1)[-1])
    return any(p[i] == "jobs" and p[i + 1] == job_id for i in range(len(p) - 1))


def resume_refusal(launch: object) -> str | None:
    """Why the agent will not even stage ``launch.resume_from`` (read or copy it from
    another store), or None: by name, it must be the job's own checkpoint or lie in the
    prefix of the job the broker says shared it. The executor checks the file system."""
    resume = getattr(launch, "resume_from", "")
    if not resume:
        return None
    spec = launch.spec
    job_id, ckpt = launch.job_id, launch.checkpoint_uri
    path = resume.removeprefix("file://")
    prefix = own_prefix(ckpt.removeprefix("file://")) if ckpt else ""
    if prefix and _same_place(prefix, path) or _own_default(path, job_id):
        return None
    src = spec.resume_source
    if src.job_id and src.prefix and _same_place(src.prefix.removeprefix("file://"), path):
        return None
    return f"resume_from {resume} refused: {SHARE_HOW}"


def _same_place(prefix: str, path: str) -> bool:
    """``path`` lies in ``prefix`` (same scheme; component-wise)."""
    ps, _, pl = prefix.rpartition("://")
    rs, _, rl = path.rpartition("://")
    return ps == rs and inside(pl, rl)


def resume_point(*, job_id: str, resume: str, checkpoint_dir: str, source: object,
                 roots: list[str], user: JobUser | None, source_user: JobUser | None,
                 book: OwnerBook, view_dir: Path) -> str:
    """What CB_RESUME_FROM may be for this launch (see the module doc); JobDirError
    names what is refused. ``source`` is ``spec.resume_source`` (a ResumeSource)."""
    src_job = getattr(source, "job_id", "")
    src_prefix = getattr(source, "prefix", "")
    if src_prefix.startswith("file://"):
        src_prefix = src_prefix.removeprefix("file://")
    prefix = own_prefix(checkpoint_dir)
    if "://" in resume:  # an object store: no links; the prefix is the whole check
        if _same_place(prefix, resume) or _own_default(resume, job_id):
            return resume
        if src_job and src_prefix and _same_place(src_prefix, resume):
            return resume
        raise JobDirError(f"resume_from {resume} is not this job's checkpoint: {SHARE_HOW}")
    resume = os.path.abspath(resume)
    where = resolved(resume, roots)
    recorded = book.owner(where)
    if inside(prefix, resume) or _own_default(resume, job_id):
        if recorded is not None and recorded[1] != job_id:
            raise JobDirError(f"resume_from {resume} is in the checkpoints of job"
                              f" {recorded[1]}, not this job's: {SHARE_HOW}")
        with contextlib.suppress(FileNotFoundError):  # a missing one: the trainer's error
            os.close(open_job_dir(resume, roots, user, create=False))
        return resume
    if not src_job or not src_prefix or "://" in src_prefix or not inside(src_prefix, resume):
        raise JobDirError(f"resume_from {resume} is not this job's checkpoint: {SHARE_HOW}")
    if recorded is not None and recorded[1] != src_job:
        raise JobDirError(f"resume_from {resume} is in the checkpoints of job {recorded[1]},"
                          f" not of job {src_job} that shared them: refused")
    name = os.path.basename(resume)
    if parse_step(name) is None:
        raise JobDirError(f"resume_from {resume} names no checkpoint step directory")
    fd = open_job_dir(resume, roots, source_user, create=False)
    try:
        return str(copy_read_only(fd, name, view_dir, user, source_user))
    finally:
        os.close(fd)


VIEW_RE = re.compile(r"^resume-(\d+)$")


def view_dir(work_dir: Path, job_id: str, attempt: int) -> Path:
    """Where attempt ``attempt`` of ``job_id`` gets its copy of a shared checkpoint."""
    return work_dir / "jobs" / job_id / f"resume-{attempt}"


def drop_view(work_dir: Path, job_id: str, attempt: int) -> bool:
    """Remove an attempt's copy of a shared checkpoint (True if there was one).

    Why: the copy is only the attempt's starting point. It is the agent's (root's,
    inside the agent's 0711 ``jobs/<job>``), so no job can have planted a link in it;
    ``shutil.rmtree`` removes it by fd all the same, and a symlink in its place is
    unlinked, never followed."""
    path = view_dir(work_dir, job_id, attempt)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        path.unlink()
        return True
    shutil.rmtree(path)
    return True


def drop_stale_views(work_dir: Path, live: set[tuple[str, int]]) -> list[Path]:
    """Remove every copy whose attempt is not in ``live`` (an agent restarted after the
    attempt ended, or died before it could clean up); returns what it removed."""
    gone: list[Path] = []
    jobs = work_dir / "jobs"
    try:
        job_ids = [e.name for e in os.scandir(jobs) if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return gone
    for job_id in job_ids:
        with os.scandir(jobs / job_id) as it:
            names = [e.name for e in it]
        for name in names:
            m = VIEW_RE.match(name)
            if m and (job_id, int(m.group(1))) not in live:
                drop_view(work_dir, job_id, int(m.group(1)))
                gone.append(jobs / job_id / name)
    return gone


def copy_read_only(src_fd: int, name: str, view_dir: Path, user: JobUser | None,
                   source_user: JobUser | None) -> Path:
    """Copy the step directory open at ``src_fd`` to ``view_dir/name`` (``view_dir`` is
    made fresh, the agent's): root-owned, readable by ``user``'s group only."""
    view_dir.parent.mkdir(parents=True, exist_ok=True)
    if view_dir.is_symlink():
        raise JobDirError(f"{view_dir} is a symlink: refused")
    if view_dir.exists():
        shutil.rmtree(view_dir)  # the agent's own (root-owned) copy of an earlier launch
    os.mkdir(view_dir, 0o700)
    vfd = os.open(view_dir, DIR_FLAGS)
    try:
        _copy_open_dir(src_fd, vfd, name, source_user, 0)
        _seal(vfd, user)
    finally:
        os.close(vfd)
    return view_dir / name


def _check_owner(st: os.stat_result, source_user: JobUser | None, what: str) -> None:
    want = source_user.uid if source_user is not None else os.geteuid()
    if st.st_uid != want:
        raise JobDirError(f"{what} belongs to uid {st.st_uid}, not to the identity of the job"
                          " that shared it: refused")


def _copy_dir(src_parent: int, dst_parent: int, name: str, source_user: JobUser | None,
              depth: int) -> None:
    """Copy directory ``name`` (in ``src_parent``) into ``dst_parent``, by fd only."""
    try:
        sfd = os.open(name, DIR_FLAGS, dir_fd=src_parent)
    except OSError:
        raise JobDirError(f"{name} in a shared checkpoint is a symlink or not a directory:"
                          " refused") from None
    try:
        _copy_open_dir(sfd, dst_parent, name, source_user, depth)
    finally:
        os.close(sfd)


def _copy_open_dir(sfd: int, dst_parent: int, name: str, source_user: JobUser | None,
                   depth: int) -> None:
    """Copy the directory open at ``sfd`` to ``dst_parent/name``: directories and regular
    files of the source's identity only; anything else refuses the whole copy."""
    if depth > MAX_DEPTH:
        raise JobDirError(f"{name}: deeper than {MAX_DEPTH} levels: refused")
    _check_owner(os.fstat(sfd), source_user, name)
    os.mkdir(name, 0o700, dir_fd=dst_parent)
    dfd = os.open(name, DIR_FLAGS, dir_fd=dst_parent)
    try:
        with os.scandir(sfd) as it:
            names = sorted(e.name for e in it)
        for entry in names:
            st = os.stat(entry, dir_fd=sfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                _copy_dir(sfd, dfd, entry, source_user, depth + 1)
            elif stat.S_ISREG(st.st_mode):
                _copy_file(sfd, dfd, entry, source_user)
            else:
                kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
                raise JobDirError(f"{entry} in the shared checkpoint {name} is {kind}:"
                                  " refused (a link could lead into another job's files)")
    finally:
        os.close(dfd)


def _copy_file(sdir: int, ddir: int, name: str, source_user: JobUser | None) -> None:
    try:
        sfd = os.open(name, FILE_FLAGS, dir_fd=sdir)
    except OSError:
        raise JobDirError(f"{name} in a shared checkpoint is a symlink: refused") from None
    try:
        st = os.fstat(sfd)
        if not stat.S_ISREG(st.st_mode):
            raise JobDirError(f"{name} in a shared checkpoint is not a regular file: refused")
        _check_owner(st, source_user, name)
        dfd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o600, dir_fd=ddir)
        try:
            left = st.st_size
            while left > 0:
                n = os.sendfile(dfd, sfd, None, min(left, 1 << 30))
                if n == 0:
                    break
                left -= n
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


def _seal(dir_fd: int, user: JobUser | None, depth: int = 0) -> None:
    """Make the copy readable (not writable) by the job: dirs 0750, files 0440, group =
    the job's gid, owner = the agent (root)."""
    gid = user.gid if user is not None else os.getegid()
    os.fchown(dir_fd, os.geteuid(), gid)
    os.fchmod(dir_fd, 0o750)
    with os.scandir(dir_fd) as it:
        entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    for name, is_dir in entries:
        fd = os.open(name, (DIR_FLAGS if is_dir else FILE_FLAGS), dir_fd=dir_fd)
        try:
            if is_dir:
                _seal(fd, user, depth + 1)
            else:
                os.fchown(fd, os.geteuid(), gid)
                os.fchmod(fd, 0o440)
        finally:
            os.close(fd)
