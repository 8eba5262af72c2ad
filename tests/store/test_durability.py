"""A broker killed at any instant loses nothing.

SQLite: a writer process is SIGKILLed while it streams writes; a NEW process then
opens the file, checks integrity and finds every write the writer had acknowledged
(printed after the store call returned). Redis persistence is the server's job (AOF);
what the store guarantees is covered by test_conformance.py's second-instance test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WRITER = textwrap.dedent(
    """
    import sys
    from broker.store.sqlite import SQLiteStore
    from computebroker.v1 import common_pb2 as pb

    store = SQLiteStore(sys.argv[1])
    i = int(sys.argv[2])
    while True:
        jid = f"j-{i:07d}"
        store.create_job(pb.Job(id=jid, spec=pb.JobSpec(team="t")),
                         [pb.JobEvent(type="submitted")])
        print(f"create {jid}", flush=True)
        job = store.get_job(jid)
        job.phase = pb.JOB_PHASE_RUNNING
        store.update_job(job, job.version, [pb.JobEvent(type="running")])
        print(f"update {jid}", flush=True)
        store.append_events(jid, [pb.JobEvent(type="progress")])
        print(f"append {jid}", flush=True)
        i += 1
    """
)

CHECKER = textwrap.dedent(
    """
    import json, sqlite3, sys
    from broker.store.sqlite import SQLiteStore
    from computebroker.v1 import common_pb2 as pb

    path = sys.argv[1]
    con = sqlite3.connect(path)
    integrity = con.execute("PRAGMA integrity_check").fetchone()[0]
    con.close()
    store = SQLiteStore(path)
    jobs = {}
    after = ""
    while True:
        page = store.list_jobs(after_id=after, limit=500)
        if not page:
            break
        for j in page:
            jobs[j.id] = {"version": j.version, "phase": j.phase,
                          "events": [e.seq for e in store.list_events(j.id)]}
        after = page[-1].id
    print(json.dumps({"integrity": integrity, "jobs": jobs}))
    """
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "proto"),
                                         env.get("PYTHONPATH", "")])
    return env


def _acked_through_kills(writer: str, db: str, targets: tuple[int, ...]) -> list[list[str]]:
    """Runs ``writer`` once per target, SIGKILLs it after that many acknowledged lines
    (each new writer also reopens a file left by a SIGKILL), and returns every line it
    acknowledged, split: the lines flushed before the kill but not read yet included."""
    acked: list[list[str]] = []
    for round_, target in enumerate(targets):
        proc = subprocess.Popen(
            [sys.executable, "-c", writer, db, str(round_ * 1_000_000)],
            stdout=subprocess.PIPE, text=True, cwd=ROOT, env=_env(),
        )
        assert proc.stdout is not None
        deadline = time.monotonic() + 180
        for _ in range(target):
            line = proc.stdout.readline()
            assert line, f"writer exited early (rc={proc.poll()})"
            assert time.monotonic() < deadline, "writer made no progress"
            acked.append(line.split())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        acked += [line.split() for line in proc.stdout.read().splitlines() if line.strip()]
        proc.stdout.close()
    return acked


def _state(checker: str, db: str) -> dict:
    """What ``checker`` reads from the store left behind (integrity checked first)."""
    out = subprocess.run([sys.executable, "-c", checker, db], capture_output=True, text=True,
                         cwd=ROOT, env=_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    state = json.loads(out.stdout)
    assert state["integrity"] == "ok"
    return state


def test_sqlite_sigkill_mid_writes_loses_no_acknowledged_write(tmp_path):
    db = str(tmp_path / "broker.sqlite")
    acked = [(op, jid) for op, jid in _acked_through_kills(WRITER, db, (40, 57, 74))]
    state = _state(CHECKER, db)
    jobs = state["jobs"]
    assert len(acked) >= 40 + 57 + 74
    for op, jid in acked:
        assert jid in jobs, f"acknowledged {op} of {jid} lost"
        job = jobs[jid]
        if op == "update":
            assert job["version"] == 2 and job["events"][:2] == [1, 2], jid
        if op == "append":
            assert job["events"] == [1, 2, 3], jid
    # unacknowledged writes are all-or-nothing: events contiguous and matching the
    # version (1 event per create, +1 per update, +1 per append)
    for jid, job in jobs.items():
        assert job["events"] == list(range(1, len(job["events"]) + 1)), jid
        assert len(job["events"]) in (job["version"], job["version"] + 1), jid


BATCH_WRITER = textwrap.dedent(
    """
    import sys
    from broker.store.sqlite import SQLiteStore
    from computebroker.v1 import common_pb2 as pb

    store = SQLiteStore(sys.argv[1])
    i = int(sys.argv[2])
    while True:
        ids = [f"j-{i + k:07d}" for k in range(5)]
        # every 7th batch repeats a request id: written again member by member
        crid = [f"r-{i + k}" if (i // 5) % 7 or k != 4 else f"r-{i}" for k in range(5)]
        out = store.create_jobs([
            (pb.Job(id=jid, client_request_id=c, spec=pb.JobSpec(team="t")),
             [pb.JobEvent(type="submitted"), pb.JobEvent(type="note")],
             [("audit", "a-" + jid, pb.JobEvent(type="audit"))])
            for jid, c in zip(ids, crid)])
        for jid, r in zip(ids, out):
            if isinstance(r, pb.Job):
                print(f"create {jid}", flush=True)
        i += 5
    """
)

BATCH_CHECKER = textwrap.dedent(
    """
    import json, sqlite3, sys
    from broker.store.sqlite import SQLiteStore
    from computebroker.v1 import common_pb2 as pb

    path = sys.argv[1]
    con = sqlite3.connect(path)
    integrity = con.execute("PRAGMA integrity_check").fetchone()[0]
    con.close()
    store = SQLiteStore(path)
    jobs = {j.id: {"events": [e.seq for e in store.list_events(j.id)],
                   "audit": store.get_record("audit", "a-" + j.id, pb.JobEvent) is not None}
            for j in store.list_jobs(limit=0)}
    audits = len(store.list_records("audit", pb.JobEvent))
    print(json.dumps({"integrity": integrity, "jobs": jobs, "audits": audits}))
    """
)


def test_sqlite_sigkill_mid_batched_creates_loses_no_acknowledged_job(tmp_path):
    """Job creations written as batches (Store.create_jobs: multi-row INSERTs, and the
    careful rewrite when a batch holds a repeated request id): every job acknowledged
    before a SIGKILL is there with its events and its audit rider, and nothing is half
    written (a job without its events or rider, or a rider without its job)."""
    db = str(tmp_path / "broker.sqlite")
    acked = [jid for _, jid in _acked_through_kills(BATCH_WRITER, db, (60, 95))]
    state = _state(BATCH_CHECKER, db)
    jobs = state["jobs"]
    assert len(acked) >= 60 + 95
    for jid in acked:
        assert jid in jobs, f"acknowledged create of {jid} lost"
    for jid, job in jobs.items():
        assert job["events"] == [1, 2] and job["audit"], (jid, job)
    assert state["audits"] == len(jobs)  # no rider of a job that was not written
