"""Workdirs are stored once per digest but usable only by the teams that uploaded them:
a member of another team who learned a digest (job specs, logs and the console show it)
can neither run that code nor learn it exists, and claiming a stored digest with other
bytes is refused. Real broker, real tokens, over TLS."""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Iterator

import grpc
import pytest

from broker.auth.identity import Role
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import jobs_pb2 as jpb
from computebroker.v1 import workdir_pb2 as wpb
from tests.broker.harness import Broker, Stubs, spec


def _tar(text: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        ti = tarfile.TarInfo("train.py")
        ti.size = len(text)
        t.addfile(ti, io.BytesIO(text))
    return buf.getvalue()


def _chunks(digest: str, data: bytes) -> Iterator[wpb.WorkdirChunk]:
    yield wpb.WorkdirChunk(digest=digest, size_bytes=len(data), data=data[:100])
    yield wpb.WorkdirChunk(data=data[100:])


def _upload(s: Stubs, data: bytes, digest: str = "") -> pb.WorkdirRef:
    digest = digest or "sha256:" + hashlib.sha256(data).hexdigest()
    return s.workdir.UploadWorkdir(_chunks(digest, data), timeout=10)


def _submit(s: Stubs, team: str, digest: str) -> jpb.SubmitJobResponse:
    return s.jobs.SubmitJob(jpb.SubmitJobRequest(spec=spec(
        "wd", team=team, command=["python", "train.py"],
        workdir=pb.WorkdirRef(digest=digest))), timeout=10)


def test_another_teams_digest_cannot_be_run_or_probed(broker: Broker, make_agent) -> None:  # noqa: ANN001
    broker.team("alice-team")
    broker.team("bob-team")
    make_agent()
    alice = broker.stubs_as("alice", Role.MEMBER, "alice-team")
    bob = broker.stubs_as("bob", Role.MEMBER, "bob-team")
    secret = _tar(b"print('alice proprietary model')\n")
    ref = _upload(alice, secret)
    assert alice.workdir.HasWorkdir(wpb.HasWorkdirRequest(digest=ref.digest)).exists
    assert _submit(alice, "alice-team", ref.digest).job.id

    # Bob knows the digest: it is not his team's, and he cannot tell it is stored.
    assert not bob.workdir.HasWorkdir(wpb.HasWorkdirRequest(digest=ref.digest)).exists
    with pytest.raises(grpc.RpcError) as e:
        _submit(bob, "bob-team", ref.digest)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "never uploaded" in e.value.details()
    never = "sha256:" + "7" * 64
    with pytest.raises(grpc.RpcError) as e2:
        _submit(bob, "bob-team", never)
    assert e2.value.details().replace(never, ref.digest) == e.value.details()  # no oracle

    # Claiming the digest with other bytes (the old dedup took the claim unread).
    with pytest.raises(grpc.RpcError) as e3:
        _upload(bob, _tar(b"print('bob')\n"), digest=ref.digest)
    assert e3.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not bob.workdir.HasWorkdir(wpb.HasWorkdirRequest(digest=ref.digest)).exists

    # Holding the same bytes is proof enough: Bob uploads them and may run them.
    assert _upload(bob, secret) == ref
    assert _submit(bob, "bob-team", ref.digest).job.id
    # Operators run any stored workdir (they may submit for every team).
    assert broker.jobs.SubmitJob(jpb.SubmitJobRequest(spec=spec(
        "op", team="alice-team", command=["python", "train.py"],
        workdir=pb.WorkdirRef(digest=ref.digest))), timeout=10).job.id
