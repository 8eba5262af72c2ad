"""Concurrent SubmitJob through a real gRPC broker (group commit, live-job cache).

Behaviour only: concurrent submits with their own request ids each create one job,
concurrent retries of one request id create exactly one (every caller gets that
job), every job has exactly one "submitted" event, and the scheduler, which keeps
its live jobs from the applier's commits instead of re-reading the store, sees
every one of them. Every call leaves exactly one audit record (the job's is
committed in the job's own write), and no SubmitJob is answered before its job and
audit record are durable in the store file.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from broker.auth.audit import KIND_AUDIT
from broker.server import BrokerServer
from broker.store.sqlite import SQLiteStore
from computebroker.v1 import auth_pb2 as apb
from computebroker.v1 import jobs_pb2 as jpb
from computebroker.v1 import jobs_pb2_grpc
from tests.broker.harness import Broker, fast_config, spec, wait_until

SUBMIT = "/computebroker.v1.JobService/SubmitJob"


def submit_audits(store) -> list[apb.AuditRecord]:  # noqa: ANN001
    return [r for r in store.list_records(KIND_AUDIT, apb.AuditRecord) if r.method == SUBMIT]


def test_concurrent_submits_none_lost_or_doubled(broker: Broker) -> None:
    broker.team()
    threads_n, per_thread = 16, 6
    out: list[tuple[str, str, bool]] = []
    lock = threading.Lock()
    start = threading.Barrier(threads_n)

    def worker(t: int) -> None:
        start.wait(30)
        for k in range(per_thread):
            crid = "same-request" if k % 3 == 0 else f"req-{t}-{k}"
            r = broker.jobs.SubmitJob(jpb.SubmitJobRequest(spec=spec(f"j{t}-{k}"), client_request_id=crid),
                                      timeout=60)
            with lock:
                out.append((crid, r.job.id, r.created))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(threads_n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert len(out) == threads_n * per_thread
    same = [(jid, created) for crid, jid, created in out if crid == "same-request"]
    assert len({jid for jid, _ in same}) == 1  # every retry got the one job
    assert sum(created for _, created in same) == 1
    own = [(jid, created) for crid, jid, created in out if crid != "same-request"]
    assert all(created for _, created in own) and len({jid for jid, _ in own}) == len(own)
    ids = {jid for _, jid, _ in out}
    stored = {j.id for j in broker.store.list_jobs(limit=0)}
    assert stored == ids
    for jid in ids:
        assert [e.type for e in broker.events(jid)].count("submitted") == 1
    # one audit record per call, created or answered with the existing job
    audits = submit_audits(broker.store)
    assert len(audits) == threads_n * per_thread
    assert {a.result for a in audits} == {"OK"} and {a.target for a in audits} == {"spec:ml"}
    assert len({a.id for a in audits}) == len(audits)
    loop = broker.server.scheduler
    assert loop is not None
    wait_until(lambda: loop.last_snapshot is not None
               and {j.id for j in loop.last_snapshot.pending} == ids, 30,
               "the scheduler's pass to see every submitted job")


def test_refused_submits_are_audited_once(broker: Broker) -> None:
    """A submit refused after authentication (bad spec) writes its record with the
    refusal's status, never an OK one from the job path."""
    broker.team()
    bad = spec("bad")
    bad.resources.nodes = 0
    try:
        broker.jobs.SubmitJob(jpb.SubmitJobRequest(spec=bad), timeout=30)
        raise AssertionError("a job with 0 nodes was accepted")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    broker.submit(spec("good"))
    results = sorted(a.result for a in submit_audits(broker.store))
    assert results == ["INVALID_ARGUMENT", "OK"]


class _GatedStore(SQLiteStore):
    """A real SQLite store whose job creations wait for the test's go."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.entered = threading.Event()
        self.go = threading.Event()

    def create_jobs(self, items):  # noqa: ANN001, ANN201
        self.entered.set()
        assert self.go.wait(60), "the test never opened the gate"
        return super().create_jobs(items)


def test_submit_is_answered_only_after_job_and_audit_are_durable(tmp_path: Path) -> None:
    cfg = fast_config(tmp_path, insecure_dev=True, agent_listen="", tls_cert="", tls_key="",
                      tls_ca="", auto_create_teams=True)
    path = str(tmp_path / "gated.sqlite")
    store = _GatedStore(path)
    server = BrokerServer(cfg, store=store)
    port = server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        with ThreadPoolExecutor(1) as pool:
            call = pool.submit(stub.SubmitJob, jpb.SubmitJobRequest(spec=spec("durable"),
                                                                    client_request_id="d-1"),
                               timeout=120)
            assert store.entered.wait(60), "the submit never reached the store"
            # The write is held: no answer, no job and no audit record yet.
            assert not call.done()
            other = SQLiteStore(path)  # a second connection reads only what is committed
            try:
                assert other.list_jobs(limit=0) == [] and submit_audits(other) == []
                store.go.set()
                job = call.result(120).job
                # Answered: both are on disk, seen through a connection of their own.
                assert [j.id for j in other.list_jobs(limit=0)] == [job.id]
                assert [(a.result, a.target) for a in submit_audits(other)] == [("OK", "spec:ml")]
            finally:
                other.close()
    finally:
        store.go.set()
        channel.close()
        server.stop(0.5)
        store.close()
