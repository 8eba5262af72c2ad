"""WorkdirService and the submit-time checks of jobs that run users' code, over real gRPC.

Each refusal is checked for its gRPC code and for a message that says what to do.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import grpc
import pytest

from brokersdk.client import BrokerClient, InvalidJobSpec, PreconditionFailed
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import workdir_pb2 as wpb
from computebroker.v1 import workdir_pb2_grpc
from tests.broker.harness import Broker, fast_config, spec, wait_until


@pytest.fixture
def small_broker(tmp_path: Path):
    b = Broker(fast_config(tmp_path, workdir_max_bytes=64 * 1024))
    yield b
    b.stop()


def code_dir(root: Path, text: str = "print('hi')\n") -> Path:
    d = root / "code"
    d.mkdir(exist_ok=True)
    (d / "train.py").write_text(text)
    return d


def rpc_error(fn, *args) -> grpc.RpcError:  # noqa: ANN001
    with pytest.raises(grpc.RpcError) as ei:
        result = fn(*args)
        if hasattr(result, "__iter__") and not isinstance(result, (bytes, str)):
            list(result)
    return ei.value


def test_upload_dedup_and_fetch(broker: Broker, tmp_path: Path) -> None:
    d = code_dir(tmp_path)
    puts: list[str] = []
    real_put = broker.server.blobs.put

    def counting_put(digest, size, chunks):  # noqa: ANN001, ANN202
        puts.append(digest)
        return real_put(digest, size, chunks)

    broker.server.blobs.put = counting_put
    seen: list[tuple[int, int]] = []
    with BrokerClient(broker.address) as c:
        ref = c.upload_workdir(str(d), progress=lambda done, total: seen.append((done, total)))
        assert ref.digest.startswith("sha256:") and ref.size_bytes > 0
        assert seen[-1] == (ref.size_bytes, ref.size_bytes)
        again = c.upload_workdir(str(d))
        assert again == ref
        assert puts == [ref.digest]  # the second upload was skipped by HasWorkdir
        has = c.has_workdir(ref.digest)
        assert has.exists and has.size_bytes == ref.size_bytes
    stub = workdir_pb2_grpc.WorkdirServiceStub(broker.channel)
    data = b"".join(c.data for c in stub.FetchWorkdir(wpb.FetchWorkdirRequest(digest=ref.digest)))
    assert "sha256:" + hashlib.sha256(data).hexdigest() == ref.digest


def test_workdir_rpc_errors(small_broker: Broker) -> None:
    stub = workdir_pb2_grpc.WorkdirServiceStub(small_broker.channel)
    missing = "sha256:" + "0" * 64
    e = rpc_error(stub.FetchWorkdir, wpb.FetchWorkdirRequest(digest=missing))
    assert e.code() == grpc.StatusCode.NOT_FOUND and "not stored" in e.details()
    e = rpc_error(stub.HasWorkdir, wpb.HasWorkdirRequest(digest="abc"))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "sha256:" in e.details()
    big = b"x" * (65 * 1024)
    d = "sha256:" + hashlib.sha256(big).hexdigest()
    e = rpc_error(stub.UploadWorkdir,
                  iter([wpb.WorkdirChunk(digest=d, size_bytes=len(big), data=big)]))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "at most 0.1 MiB" in e.details()
    e = rpc_error(stub.UploadWorkdir,
                  iter([wpb.WorkdirChunk(digest=missing, size_bytes=3, data=b"abc")]))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "hash to" in e.details()
    assert not stub.HasWorkdir(wpb.HasWorkdirRequest(digest=missing)).exists
    e = rpc_error(stub.UploadWorkdir, iter([]))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "empty upload" in e.details()


def test_sdk_refuses_workdir_over_broker_limit(small_broker: Broker, tmp_path: Path) -> None:
    d = code_dir(tmp_path)
    (d / "weights.bin").write_bytes(b"\0" * (80 * 1024))
    with BrokerClient(small_broker.address) as c, pytest.raises(
            InvalidJobSpec, match=r"over the 0.1 MiB limit.*weights\.bin"):
        c.upload_workdir(str(d))


def test_submit_checks(broker: Broker, make_agent, tmp_path: Path) -> None:  # noqa: ANN001
    broker.team()
    make_agent()

    def refused(s: pb.JobSpec) -> grpc.RpcError:
        return rpc_error(broker.submit, s)

    e = refused(spec(workdir=pb.WorkdirRef(digest="sha256:" + "1" * 64),
                     command=["python", "t.py"]))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "never uploaded" in e.details()
    e = refused(spec(workdir=pb.WorkdirRef(digest="nope"), command=["python"]))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "spec.workdir.digest" in e.details()
    e = refused(spec(command=["python", "a\0b"]))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "control character" in e.details()
    e = refused(spec(command=["  ", "x"]))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "empty program" in e.details()
    e = refused(spec(command=["echo", "x" * 200_000]))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most" in e.details()
    e = refused(spec(trainer=pb.TrainerSpec(model="gpt5", total_steps=5, global_batch_size=8)))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "tiny" in e.details()
    for uri in ("var/ckpt", "gs://bucket/x"):  # no region could write there
        e = refused(spec(checkpoint_uri=uri))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "s3://bucket/prefix" in e.details()
    # A multi-line script for bash -c is fine, and so is an uploaded workdir.
    with BrokerClient(broker.address) as c:
        h = c.submit({"name": "mine", "team": "ml", "workdir": str(code_dir(tmp_path)),
                      "run": "echo one\necho two"})
        job = h.status()
    assert list(job.spec.command) == ["bash", "-c", "echo one\necho two"]
    assert job.spec.workdir.digest.startswith("sha256:")


def test_broken_checkpoint_stores(broker: Broker, make_agent) -> None:  # noqa: ANN001
    broker.team()
    make_agent("us-east-2", store_error="cannot write /ro: Read-only file system")
    e = rpc_error(broker.submit, spec())
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "us-east-2: cannot write /ro" in e.details()
    # An explicit checkpoint_uri does not depend on the regions' stores.
    job = broker.submit(spec(checkpoint_uri=f"{broker.config.checkpoint_root}/mine"))
    # ...but the broken region still takes no placement, and the reason says why.
    j = wait_until(lambda: (g := broker.get(job.id)).pending_reason and g, 20, "pending reason")
    assert j.phase == pb.JOB_PHASE_PENDING
    assert "checkpoint store is not writable" in j.pending_reason
    # A healthy region appears: the job runs there, and plain submits work again.
    make_agent("us-west-2")
    j = broker.wait_phase(job.id, pb.JOB_PHASE_LAUNCHING, pb.JOB_PHASE_RUNNING)
    assert j.placement.region == "us-west-2"
    assert broker.submit(spec(name="second")).id


def test_sdk_unknown_workdir_digest_refused(broker: Broker) -> None:
    with BrokerClient(broker.address) as c, pytest.raises(PreconditionFailed,
                                                          match="never uploaded"):
        c.submit({"name": "x", "team": "ml", "run": ["python", "t.py"],
                  "workdir": "sha256:" + "2" * 64})


def test_s3_workdir_store_round_trip(s3_server, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
                                     tmp_path: Path) -> None:
    s3_server.apply_env(monkeypatch)
    bucket = s3_server.unique_bucket("cb-workdirs")
    b = Broker(fast_config(tmp_path, workdir_store=f"s3://{bucket}/wd"))
    try:
        with BrokerClient(b.address) as c:
            ref = c.upload_workdir(str(code_dir(tmp_path, "print('s3')\n")))
        keys = s3_server.list_keys(bucket)
        assert keys == [f"wd/sha256/{ref.digest.removeprefix('sha256:')}"]  # no temp keys left
        stub = workdir_pb2_grpc.WorkdirServiceStub(b.channel)
        chunks = stub.FetchWorkdir(wpb.FetchWorkdirRequest(digest=ref.digest))
        data = b"".join(ch.data for ch in chunks)
        assert len(data) == ref.size_bytes
        assert "sha256:" + hashlib.sha256(data).hexdigest() == ref.digest
    finally:
        b.stop()


def test_model_preset_names_need_no_torch() -> None:
    """The broker checks preset names at submit; that must not import torch (seconds of
    start-up and hundreds of MB in the broker process)."""
    import subprocess
    import sys

    code = ("import sys; from broker.workdirs.checks import model_presets; "
            "names = model_presets(); assert 'tiny' in names, names; "
            "assert 'torch' not in sys.modules, 'torch imported'; print(','.join(names))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "tiny" in res.stdout
