"""checkpoint_layout/workdir_store.py: the job's workdir in its checkpoint store, as the
Kubernetes executor puts it there and a pod's supervisor takes it out (real files, and
boto3 against moto's S3 server on loopback)."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from brokersdk.workdir import pack
from checkpoint_layout import workdir_store as ws


def packed(tmp_path: Path) -> tuple[Path, str, int]:
    src = tmp_path / "code"
    (src / "data").mkdir(parents=True)
    (src / "run.py").write_text("print('hi')\n")
    (src / "data" / "words.txt").write_text("shipped with the job\n")
    p = pack(src)
    tar = tmp_path / "wd.tar"
    p.write_to(tar)
    return tar, p.digest, p.size_bytes


def env_for(ckpt: str, uri: str, digest: str, size: int, work: Path) -> dict[str, str]:
    return {ws.URI_ENV: uri, ws.DIGEST_ENV: digest, ws.SIZE_ENV: str(size),
            ws.WORK_DIR_ENV: str(work), "CB_CHECKPOINT_URI": ckpt}


def test_the_location_is_inside_the_attempts_checkpoint_uri() -> None:
    d = "sha256:" + "ab" * 32
    assert ws.workdir_uri("s3://b/jobs/j1/attempt-2/", d) == \
        f"s3://b/jobs/j1/attempt-2/workdir/sha256-{'ab' * 32}.tar"
    with pytest.raises(ws.WorkdirRefused, match="checkpoint store"):
        ws.workdir_uri("", d)
    with pytest.raises(ValueError, match=r"'\.\.'"):
        ws.workdir_uri("s3://b/jobs/../other", d)
    with pytest.raises(ws.WorkdirRefused, match="sha256"):
        ws.workdir_uri("s3://b/jobs/j1", "sha256:../../x")


def test_publish_then_fetch_and_unpack_from_a_directory_store(tmp_path: Path) -> None:
    tar, digest, size = packed(tmp_path)
    ckpt = str(tmp_path / "ckpt" / "attempt-1")
    uri = ws.workdir_uri(ckpt, digest)
    assert ws.publish(tar, uri, size) is True
    assert ws.publish(tar, uri, size) is False  # content-addressed: once
    assert Path(uri).read_bytes() == tar.read_bytes()
    work = tmp_path / "pod"
    work.mkdir()
    out = ws.prepare_from_env(env_for(ckpt, uri, digest, size, work))
    assert out == str(work / "workdir")
    assert (work / "workdir" / "data" / "words.txt").read_text() == "shipped with the job\n"
    assert not (work / ".workdir.tar").exists()  # the download does not stay


def test_a_swapped_object_or_a_wrong_size_is_refused(tmp_path: Path) -> None:
    tar, digest, size = packed(tmp_path)
    ckpt = str(tmp_path / "ckpt")
    uri = ws.workdir_uri(ckpt, digest)
    ws.publish(tar, uri, size)
    data = bytearray(Path(uri).read_bytes())
    data[600] ^= 0xFF  # same size, other bytes
    Path(uri).write_bytes(bytes(data))
    work = tmp_path / "pod"
    work.mkdir()
    with pytest.raises(ws.WorkdirRefused, match="hashes to sha256:.* not sha256:.*tampered"):
        ws.prepare_from_env(env_for(ckpt, uri, digest, size, work))
    assert not (work / "workdir").exists()
    Path(uri).write_bytes(tar.read_bytes() + b"\0" * 512)
    with pytest.raises(ws.WorkdirRefused, match=f"is over its {size} bytes"):
        ws.prepare_from_env(env_for(ckpt, uri, digest, size, work))


def test_a_location_outside_the_jobs_own_checkpoints_is_refused(tmp_path: Path) -> None:
    tar, digest, size = packed(tmp_path)
    other = ws.workdir_uri(str(tmp_path / "other-team" / "job"), digest)
    ws.publish(tar, other, size)
    work = tmp_path / "pod"
    work.mkdir()
    with pytest.raises(ws.WorkdirRefused, match="not inside this job's checkpoint location"):
        ws.prepare_from_env(env_for(str(tmp_path / "mine"), other, digest, size, work))


def test_a_traversal_member_is_refused_by_the_safe_extractor(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 3
        t.addfile(info, io.BytesIO(b"bad"))
    raw = buf.getvalue()
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    tar = tmp_path / "evil.tar"
    tar.write_bytes(raw)
    ckpt = str(tmp_path / "ckpt")
    uri = ws.workdir_uri(ckpt, digest)
    ws.publish(tar, uri, len(raw))
    work = tmp_path / "pod"
    work.mkdir()
    with pytest.raises(ws.WorkdirRefused, match=r"'\.\.' in a member name"):
        ws.prepare_from_env(env_for(ckpt, uri, digest, len(raw), work))
    assert not (work / "escape.txt").exists()


def test_publish_and_fetch_through_s3(tmp_path: Path, s3_server, monkeypatch) -> None:
    s3_server.apply_env(monkeypatch)
    bucket = s3_server.unique_bucket("wd")
    tar, digest, size = packed(tmp_path)
    ckpt = f"s3://{bucket}/jobs/j1/attempt-1"
    uri = ws.workdir_uri(ckpt, digest)
    assert ws.publish(tar, uri, size) is True
    assert ws.publish(tar, uri, size) is False
    assert s3_server.list_keys(bucket) == [f"jobs/j1/attempt-1/workdir/sha256-{digest[7:]}.tar"]
    work = tmp_path / "pod"
    work.mkdir()
    ws.prepare_from_env(env_for(ckpt, uri, digest, size, work))
    assert (work / "workdir" / "run.py").read_text() == "print('hi')\n"
    s3_server.client().put_object(Bucket=bucket, Key=uri.split("/", 3)[3],
                                  Body=tar.read_bytes()[:-512])
    with pytest.raises(ws.WorkdirRefused, match=f"not {size}"):
        ws.prepare_from_env(env_for(ckpt, uri, digest, size, tmp_path))


def test_an_unreachable_store_is_an_outage_not_a_bad_workdir(tmp_path: Path) -> None:
    import socket

    import boto3
    from botocore.config import Config

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                          aws_access_key_id="x", aws_secret_access_key="x",
                          config=Config(retries={"total_max_attempts": 1}, connect_timeout=2))
    digest = "sha256:" + "0" * 64
    ckpt = "s3://b/jobs/j1/attempt-1"
    with pytest.raises(ws.WorkdirRefused, match="cannot fetch the workdir") as e:
        ws.fetch_verified(ws.workdir_uri(ckpt, digest), digest, 10, tmp_path / "t.tar", ckpt,
                          s3_client=client)
    assert e.value.outage is True


def test_directories_made_above_the_workdir_keep_the_access_arranged_for_the_pods(
        tmp_path: Path) -> None:
    """The agent may make the attempt's checkpoint directory before the trainer does: it
    gets its parent's mode (and, for a root agent, the pods' uid), so the pods can still
    write their checkpoints in it; workdir/ itself stays the agent's, read-only to others."""
    import os
    import stat

    tar, digest, size = packed(tmp_path)
    root = tmp_path / "store"
    root.mkdir()
    root.chmod(0o1777)
    ckpt = root / "jobs" / "j1" / "attempt-1"
    ws.publish(tar, ws.workdir_uri(str(ckpt), digest), size, owner=(65532, 65532))
    for d in (root / "jobs", root / "jobs" / "j1", ckpt):
        st = d.stat()
        assert stat.S_IMODE(st.st_mode) == 0o1777, d
        if os.geteuid() == 0:
            assert (st.st_uid, st.st_gid) == (65532, 65532), d
    assert stat.S_IMODE((ckpt / "workdir").stat().st_mode) == 0o755
    assert (ckpt / "workdir").stat().st_uid == os.geteuid()
