"""A job's workdir (its uploaded code) in the job's own checkpoint store, for pods.

Why here and not only on the agent's disk: on Kubernetes the agent's disk is not the
node's. The region agent has already fetched the tarball from the broker and verified
it against its sha256 name (region_agents/workdir.py); the Kubernetes executor then puts
those bytes where the job's pods can read them and nobody else's are expected to: under
the attempt's own ``CB_CHECKPOINT_URI`` (S3, or a directory the pods share),

    <checkpoint_uri>/workdir/sha256-<hex>.tar

and the trainer pod's supervisor (checkpoint_layout/pod_supervisor.py) fetches it with
the job's own store credentials, checks size and sha256 again (the store is not
trusted: whoever may write the job's prefix must not be able to swap its code), and
unpacks it with the project's extractor (region_agents/safe_untar.py: no link followed,
no ``..``, no absolute names, links, devices) into ``<CB_WORK_DIR>/workdir``, the
command's cwd, exactly where the local executor puts it. docs/kubernetes.md compares
this with a ConfigMap (1 MiB), an init container, and SkyPilot's rsync into the pod.

Tenants: the key is derived from the attempt's checkpoint location, which the broker
gives each job its own of and the agent checks against its allowed roots; the pod
refuses a workdir URI that is not inside its own ``CB_CHECKPOINT_URI``. Reading a job's
code therefore takes exactly the access that reading its checkpoints takes.

Size: the broker refuses uploads over ``workdir_max_bytes``; the ``WorkdirRef`` carries
the size, and the pod reads at most that many bytes (one more proves a mismatch), so a
swapped object cannot fill the pod's disk either.

Torch-free; boto3 only for ``s3://`` (imported when used). The pod side imports only
the standard library otherwise: it runs in the trainer's image.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from checkpoint_layout.roots import RootError, canonical, under

URI_ENV = "CB_WORKDIR_URI"  # where the pod fetches the tarball
DIGEST_ENV = "CB_WORKDIR_DIGEST"  # "sha256:<hex>" it must hash to
SIZE_ENV = "CB_WORKDIR_SIZE"  # bytes it must have
WORK_DIR_ENV = "CB_WORK_DIR"  # the attempt's own directory (the workdir goes in it)
SUBDIR = "workdir"  # <checkpoint_uri>/workdir/... and <CB_WORK_DIR>/workdir
# The pod could not fetch, verify or unpack its workdir: not the node's fault and not
# the trainer's (docs/contracts.md section 1). The supervisor's termination message says why.
EXIT_WORKDIR_REFUSED = 82
CHUNK = 1 << 20
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class WorkdirRefused(ValueError):
    """The workdir cannot be used (the message says why, for the user). ``outage``: the
    store could not be reached (checkpoint_layout/faults.py), not a bad workdir; the pod
    then exits EXIT_STORE_UNAVAILABLE, as a trainer does, and the broker waits."""

    def __init__(self, message: str, outage: bool = False) -> None:
        super().__init__(message)
        self.outage = outage


def check_digest(digest: str) -> str:
    """The 64 hex digits of a ``sha256:<hex>`` digest, or WorkdirRefused."""
    if not _DIGEST.fullmatch(digest):
        raise WorkdirRefused(f"workdir digest {digest!r} is not sha256:<64 lowercase hex>")
    return digest.removeprefix("sha256:")


def workdir_uri(checkpoint_uri: str, digest: str) -> str:
    """Where an attempt's workdir lives: inside its checkpoint location (module doc)."""
    if not checkpoint_uri:
        raise WorkdirRefused("a workdir on Kubernetes travels through the job's checkpoint"
                             " store, and this attempt has none (set the region's"
                             " checkpoint_bucket or the job's checkpoint_uri)")
    canonical(checkpoint_uri)  # RootError for '..', relative paths, unknown schemes
    return f"{checkpoint_uri.rstrip('/')}/{SUBDIR}/sha256-{check_digest(digest)}.tar"


def _file_path(uri: str) -> Path:
    return Path(uri.removeprefix("file://"))


def publish(tar_path: str | os.PathLike[str], uri: str, size: int,
            s3_client: Any | None = None, owner: tuple[int, int] | None = None) -> bool:
    """Put the agent's verified tarball at ``uri`` (agent side). Content-addressed, so an
    object already there with the right size is left alone (the pod verifies the digest
    anyway). Returns True when it wrote. S3: one ``upload_file`` (multipart for large
    files, boto3's transfer manager); a directory: temp file, fsync, rename, mode 0644
    (the pods' user reads it), see :func:`_make_checkpoint_dirs` for the directories."""
    if uri.startswith("s3://"):
        from checkpoint_layout.names import split_s3_uri
        from checkpoint_layout.s3 import make_s3_client

        bucket, key = split_s3_uri(uri)
        client = s3_client or make_s3_client()
        with contextlib.suppress(Exception):
            if int(client.head_object(Bucket=bucket, Key=key)["ContentLength"]) == size:
                return False
        client.upload_file(str(tar_path), bucket, key)
        return True
    dst = _file_path(uri)
    with contextlib.suppress(OSError):
        if dst.stat().st_size == size:
            return False
    _make_checkpoint_dirs(dst.parent, owner)
    fd, tmp = tempfile.mkstemp(prefix=".put-", dir=dst.parent)
    try:
        with os.fdopen(fd, "wb") as out, open(tar_path, "rb") as src:
            shutil.copyfileobj(src, out, CHUNK)
            out.flush()
            os.fchmod(out.fileno(), 0o644)
            os.fsync(out.fileno())
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return True


def _make_checkpoint_dirs(workdir_dir: Path, owner: tuple[int, int] | None) -> None:
    """Make ``<checkpoint_uri>/workdir`` and any missing directory above it.

    The agent often makes the attempt's checkpoint directory here, before the trainer
    does: it must not take it from the pods, who write their checkpoints in it. So a
    directory made above ``workdir/`` gets the mode of the existing directory it was
    made in (the access the operator arranged), and, when the agent is root, ``owner``
    (the pods' uid and gid). ``workdir/`` itself stays the agent's, 0755: the pods read
    the code, they do not replace it."""
    missing: list[Path] = []
    d = workdir_dir
    while not d.exists() and d != d.parent:
        missing.append(d)
        d = d.parent
    mode = d.stat().st_mode & 0o7777 if d.exists() else 0o755
    for m in reversed(missing):
        try:
            m.mkdir(mode=0o700)
        except FileExistsError:
            continue  # someone else's meanwhile: not ours to change
        if m == workdir_dir:
            m.chmod(0o755)
            continue
        m.chmod(mode)
        if owner is not None and os.geteuid() == 0:
            os.chown(m, *owner, follow_symlinks=False)


def _chunks(uri: str, limit: int, s3_client: Any | None) -> Any:
    """The object's bytes, at most ``limit`` of them, in chunks."""
    if uri.startswith("s3://"):
        from checkpoint_layout.names import split_s3_uri
        from checkpoint_layout.s3 import make_s3_client

        bucket, key = split_s3_uri(uri)
        client = s3_client or make_s3_client()
        body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{limit - 1}")["Body"]
        try:
            while chunk := body.read(CHUNK):
                yield chunk
        finally:
            body.close()
        return
    with open(_file_path(uri), "rb") as f:
        left = limit
        while left > 0 and (chunk := f.read(min(CHUNK, left))):
            left -= len(chunk)
            yield chunk


def fetch_verified(uri: str, digest: str, size: int, dest: str | os.PathLike[str],
                   checkpoint_uri: str, s3_client: Any | None = None) -> None:
    """Download ``uri`` to the file ``dest`` (pod side), or WorkdirRefused: outside the
    job's checkpoint location, a different size, or bytes that do not hash to ``digest``
    (tampered with, or not this job's code)."""
    hexd = check_digest(digest)
    try:
        inside = bool(checkpoint_uri) and under(uri, checkpoint_uri)
    except RootError as e:
        raise WorkdirRefused(f"workdir location refused: {e}") from None
    if not inside:
        raise WorkdirRefused(f"workdir location {uri!r} is not inside this job's checkpoint"
                             f" location {checkpoint_uri!r}: refused")
    if size < 0:
        raise WorkdirRefused(f"workdir size {size} is negative")
    h, n = hashlib.sha256(), 0
    try:
        with open(dest, "wb") as out:
            for chunk in _chunks(uri, size + 1, s3_client):
                h.update(chunk)
                n += len(chunk)
                out.write(chunk)
    except WorkdirRefused:
        raise
    except Exception as e:  # noqa: BLE001 - the store's own words, for the user
        from checkpoint_layout.faults import is_outage

        raise WorkdirRefused(f"cannot fetch the workdir from {uri}: {e}",
                             outage=is_outage(e)) from None
    if n != size:
        what = f"is over its {size} bytes" if n > size else f"has {n} bytes, not {size}"
        raise WorkdirRefused(f"workdir at {uri} {what}: refused (changed after upload?)")
    if h.hexdigest() != hexd:
        raise WorkdirRefused(f"workdir at {uri} hashes to sha256:{h.hexdigest()}, not {digest}:"
                             " refused (tampered with or not this job's code)")


def unpack(tar_path: str | os.PathLike[str], dest: str | os.PathLike[str]) -> int:
    """Extract with the project's extractor into ``dest`` (made); WorkdirRefused names
    the member it refused. Returns how many members it wrote."""
    import tarfile

    from region_agents import safe_untar

    try:
        return safe_untar.extract(tar_path, dest)
    except (safe_untar.UnsafeMember, tarfile.TarError, OSError) as e:
        raise WorkdirRefused(f"cannot unpack the workdir: {e}") from None


def prepare_from_env(env: dict[str, str]) -> str | None:
    """The pod's workdir from its environment: fetched, verified, unpacked into
    ``<CB_WORK_DIR>/workdir``; its path (the command's cwd), or None without one."""
    uri = env.get(URI_ENV, "")
    if not uri:
        return None
    work = env.get(WORK_DIR_ENV, "")
    if not work:
        raise WorkdirRefused(f"{URI_ENV} is set but {WORK_DIR_ENV} is not")
    try:
        size = int(env.get(SIZE_ENV, ""))
    except ValueError:
        raise WorkdirRefused(f"{SIZE_ENV}={env.get(SIZE_ENV, '')!r} is not a size") from None
    tmp = Path(work) / f".{SUBDIR}.tar"
    out = Path(work) / SUBDIR
    try:
        fetch_verified(uri, env.get(DIGEST_ENV, ""), size, tmp,
                       env.get("CB_CHECKPOINT_URI", ""))
        unpack(tmp, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return str(out)
