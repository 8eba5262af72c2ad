"""Redis primary loss under load: does any acknowledged job write go missing?

Each repetition starts a fresh primary + 2 replicas + 3 Sentinels (real processes,
tests/fixtures/redis_sentinel.py), opens the store on its ``redis+sentinel://`` URL
(replica confirmation on), and runs a burst: ``--writers`` threads submit jobs
(``create_job``) while one thread ends running jobs (``update_job`` to SUCCEEDED, a CAS
write) one after another. Mid-burst the primary is SIGKILLed. The burst goes on until
writes have succeeded again for ``--after`` seconds; then a fresh client on the promoted
primary checks that every acknowledged submit is there and every acknowledged terminal
update is SUCCEEDED. A write answered UNAVAILABLE is not acknowledged and not counted.

The store URL's ``min_replicas`` is ``all`` (``--min-replicas``; the default for Sentinel
URLs: each write waits for every replica the Sentinels may promote).
Baseline in the same run: the same repetition with ``min_replicas=0`` (no WAIT), which
shows what WAIT buys (acknowledged writes the failover may lose) and costs (write rate).

A second scenario (``--broker-reps``) runs the same fault under a real broker (gRPC over
TLS, in this process) on the Sentinel URL, with a scripted region agent
(tests/broker/harness.py FakeAgent): clients submit through SubmitJob, the agent reports
running jobs SUCCEEDED across the kill, and a job submitted after the kill must be
launched. It records the acknowledged submits and terminal updates (JobUpdateAck) lost and
how long after the SIGKILL the scheduler launched again, next to the failover time and the
leader lease. Every other repetition also cuts the agent's stream mid-failover; it dials
again as soon as the new primary is up and re-sends unacknowledged ends (as
region_agents/agent.py does). ``--broker-baseline-reps`` runs that reconnect with the
scripted agent's old Register, which omitted ended attempts not yet acknowledged: the
broker then relaunched them as missing and acked the re-sent ends as a superseded
attempt's, the "lost" updates that harness reported.

    .venv/bin/python benchmarks/store_failover.py [--reps 20] [--broker-reps 20] \
        [--broker-baseline-reps 3] [--out benchmarks/results/store_failover.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "proto")]

from broker.store.base import StoreError  # noqa: E402
from broker.store.redis import RedisStore  # noqa: E402
from computebroker.v1 import common_pb2 as pb  # noqa: E402
from tests.fixtures.redis_sentinel import (  # noqa: E402
    DOWN_AFTER_MS,
    FAILOVER_TIMEOUT_MS,
    start_sentinel_cluster,
)


@dataclass
class Outcome:
    """One repetition's result; ``*_lost`` must be 0."""

    min_replicas: str  # the store URL's min_replicas: "all" (the Sentinel default) or a count
    acked_submits: int = 0
    acked_terminal: int = 0
    refused_writes: int = 0  # answered UNAVAILABLE (or another store error): not acknowledged
    submits_lost: int = 0
    terminal_lost: int = 0
    failover_s: float = 0.0  # SIGKILL -> the Sentinels name a new writable primary
    writes_resume_s: float = 0.0  # SIGKILL -> first ack of a write begun after the kill
    submit_rate_before_kill: float = 0.0  # acknowledged submits/s before the kill
    lost_ids: list[str] = field(default_factory=list)


def _job(job_id: str, phase: int = pb.JOB_PHASE_PENDING) -> pb.Job:
    return pb.Job(id=job_id, spec=pb.JobSpec(team="ml", name=f"n-{job_id}"), phase=phase)


def run_once(workdir: Path, *, min_replicas: str = "all", writers: int = 4, before_s: float = 1.0,
             after_s: float = 2.0, running: int = 60) -> Outcome:
    """One repetition (see the module docstring)."""
    cluster = start_sentinel_cluster(workdir)
    out = Outcome(min_replicas)
    prefix = f"f{uuid.uuid4().hex[:8]}"
    store = RedisStore(cluster.url(prefix=prefix, min_replicas=min_replicas))
    try:
        live = []
        for i in range(running):
            job = store.create_job(_job(f"run-{i:04d}"))
            live.append(store.update_job(_job(job.id, pb.JOB_PHASE_RUNNING), job.version))
        stop = threading.Event()
        lock = threading.Lock()
        acked: list[str] = []
        ended: list[str] = []
        ack_times: list[float] = []  # acks of writes *started* after the primary died
        killed = [float("inf")]  # when kill_primary returned (the old primary is gone)

        def submitter(w: int) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                job_id = f"sub-{w}-{n:06d}"
                started = time.monotonic()
                try:
                    store.create_job(_job(job_id))
                except StoreError:
                    with lock:
                        out.refused_writes += 1
                    continue
                with lock:
                    acked.append(job_id)
                    if started > killed[0]:
                        ack_times.append(time.monotonic())

        def terminator() -> None:
            for job in live:
                while not stop.is_set():
                    started = time.monotonic()
                    try:
                        cur = store.get_job(job.id)
                        if cur.phase == pb.JOB_PHASE_SUCCEEDED:
                            break  # an earlier try applied but was not acknowledged
                        store.update_job(_job(job.id, pb.JOB_PHASE_SUCCEEDED), cur.version)
                    except StoreError:
                        with lock:
                            out.refused_writes += 1
                        time.sleep(0.05)
                        continue
                    with lock:
                        ended.append(job.id)
                        if started > killed[0]:
                            ack_times.append(time.monotonic())
                    break
                time.sleep(before_s / (running / 2))  # half end before the kill, half after

        threads = [threading.Thread(target=submitter, args=(w,)) for w in range(writers)]
        threads.append(threading.Thread(target=terminator))
        t0 = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(before_s)
        with lock:
            out.submit_rate_before_kill = round(len(acked) / (time.monotonic() - t0), 1)
        t_kill = time.monotonic()
        old = cluster.kill_primary()
        killed[0] = time.monotonic()
        cluster.wait_promoted(old)
        out.failover_s = round(time.monotonic() - t_kill, 3)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with lock:
                first = ack_times[0] if ack_times else None
            if first is not None and time.monotonic() - first >= after_s \
                    and not threads[-1].is_alive():
                break
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join(timeout=120)
        out.writes_resume_s = round(ack_times[0] - t_kill, 3) if ack_times else -1.0
        check = RedisStore(cluster.url(prefix=prefix, min_replicas=0))
        try:
            present = {j.id: j.phase for j in check.list_jobs(limit=0)}
        finally:
            check.close()
        lost = [i for i in acked if i not in present]
        lost_end = [i for i in ended if present.get(i) != pb.JOB_PHASE_SUCCEEDED]
        out.acked_submits, out.acked_terminal = len(acked), len(ended)
        out.submits_lost, out.terminal_lost = len(lost), len(lost_end)
        out.lost_ids = (lost + lost_end)[:20]
        return out
    finally:
        store.close()
        cluster.stop()


@dataclass
class BrokerOutcome:
    """One broker-level repetition; ``*_lost`` must be 0."""

    lease_s: float
    reconnect: bool  # the agent's stream was cut mid-failover and it dialled again
    lists_unacked_ends: bool = True  # False: the scripted agent's old Register (baseline)
    acked_submits: int = 0
    refused_submits: int = 0
    acked_terminal: int = 0
    submits_lost: int = 0
    terminal_lost: int = 0
    relaunched: int = 0  # jobs whose ended attempt the broker declared missing
    reconnects: int = 0  # agent streams opened after the first
    failover_s: float = 0.0
    # SIGKILL -> the new primary has a replica online again (until then WAIT 1 cannot be
    # met: writes, the lease included, answer UNAVAILABLE by design)
    replica_attached_s: float = 0.0
    schedule_resume_s: float = 0.0  # SIGKILL -> Launch of a job submitted after it
    within_failover_plus_lease: bool = False
    within_replica_attached_plus_lease: bool = False
    lost_detail: list[str] = field(default_factory=list)  # a lost update's job events


class _AgentKeeper:
    """What a real agent does with a broken stream and unacknowledged ends, for the
    scripted one: dial again while the stream is down (the broker drops agents' streams
    when it loses its lease; Connect answers UNAVAILABLE while the store is down) and
    re-send unacknowledged terminal updates every 2 s (region_agents/agent.py)."""

    def __init__(self, agent: object) -> None:
        self.agent = agent
        self.reconnects = 0
        self.cut = threading.Event()  # set: drop the stream now, then dial again
        self.hold = threading.Event()  # set: do not dial yet
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agent-keeper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        agent = self.agent
        down = False
        last_resend = time.monotonic()
        while not self._stop.wait(0.1):
            if self.cut.is_set():
                self.cut.clear()
                agent.close()  # type: ignore[attr-defined]
                down = True
            if self.hold.is_set():
                continue
            if down or agent.error is not None or agent.ended:  # type: ignore[attr-defined]
                try:
                    agent.connect()  # type: ignore[attr-defined]
                except Exception:  # noqa: BLE001 - refused while the store is down: again
                    down = True
                    continue
                down = False
                self.reconnects += 1
                last_resend = time.monotonic()
            elif time.monotonic() - last_resend >= 2.0:
                agent.resend_unacked()  # type: ignore[attr-defined]
                last_resend = time.monotonic()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _time_replica(port: int, t_kill: float, out: BrokerOutcome, timeout: float = 120.0) -> None:
    """Set ``out.replica_attached_s``: SIGKILL until the primary on ``port`` has a replica
    online (-1 if not within ``timeout``)."""
    import redis

    deadline = time.monotonic() + timeout
    out.replica_attached_s = -1.0
    while time.monotonic() < deadline:
        try:
            with redis.Redis(port=port, socket_timeout=2) as r:
                info = r.info("replication")
        except redis.RedisError:
            info = {}
        if any(k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"
               for k, v in info.items()):
            out.replica_attached_s = round(time.monotonic() - t_kill, 3)
            return
        time.sleep(0.05)


def run_broker_once(workdir: Path, *, clients: int = 3, running: int = 6, lease_s: float = 5.0,
                    before_s: float = 1.0, reconnect: bool = False,
                    lists_unacked_ends: bool = True) -> BrokerOutcome:
    """The broker-level repetition (see the module docstring). ``reconnect``: the agent
    loses its stream right after the terminal updates sent into the failover and dials
    again as soon as the new primary is up (while those updates may still be retrying
    inside the broker), until a broker takes it. ``lists_unacked_ends=False`` is the scripted agent as
    it was (its Register omitted ended attempts the broker had not acknowledged): the
    baseline that shows where the "lost" updates of that harness came from."""
    import grpc

    from computebroker.v1 import agent_pb2 as apb
    from computebroker.v1 import jobs_pb2 as jpb
    from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, spec, wait_until

    cluster = start_sentinel_cluster(workdir / "redis")
    out = BrokerOutcome(lease_s, reconnect, lists_unacked_ends)
    prefix = f"b{uuid.uuid4().hex[:8]}"
    b = Broker(fast_config(workdir, store=cluster.url(prefix=prefix), leader_lease_s=lease_s))
    agent = FakeAgent(b.address, "a1", "us-east-2", nodes_for("us-east-2", "a1", running + 2, 1),
                      list_unacked_ends=lists_unacked_ends)
    keeper: _AgentKeeper | None = None
    try:
        b.team(gpus=1000)
        agent.connect()
        keeper = _AgentKeeper(agent)
        attempts: dict[str, int] = {}
        for i in range(running):
            job = b.submit(spec(f"run-{i}"))
            launch = agent.wait_launch(job.id, timeout=60)
            agent.update(job.id, launch.attempt, apb.ATTEMPT_STATE_RUNNING, step=1)
            attempts[job.id] = launch.attempt
        for job_id in attempts:
            b.wait_phase(job_id, pb.JOB_PHASE_RUNNING, timeout=60)
        stop = threading.Event()
        lock = threading.Lock()
        acked: list[str] = []

        def client(w: int) -> None:
            stubs = b.stubs_as(f"user{w}")
            n = 0
            while not stop.is_set():
                n += 1  # parked jobs: no region can place them, so they never take a node
                s = spec(f"burst-{w}-{n}", allowed_regions=["parked-nowhere"])
                try:
                    job = stubs.jobs.SubmitJob(jpb.SubmitJobRequest(
                        spec=s, client_request_id=f"c{w}-{n}"), timeout=60).job
                except grpc.RpcError:
                    with lock:
                        out.refused_submits += 1
                    time.sleep(0.05)
                    continue
                with lock:
                    acked.append(job.id)

        threads = [threading.Thread(target=client, args=(w,)) for w in range(clients)]
        for t in threads:
            t.start()
        ids = list(attempts)
        time.sleep(before_s / 2)
        for job_id in ids[: running // 2]:  # half end before the kill, half across it
            agent.update(job_id, attempts[job_id], apb.ATTEMPT_STATE_SUCCEEDED, step=100)
        time.sleep(before_s / 2)
        t_kill = time.monotonic()
        old = cluster.kill_primary()
        for job_id in ids[running // 2:]:
            agent.update(job_id, attempts[job_id], apb.ATTEMPT_STATE_SUCCEEDED, step=100)
        if reconnect:  # cut mid-failover; the agent's next dial lands just after it
            time.sleep(0.3)
            keeper.hold.set()
            keeper.cut.set()
        new = cluster.wait_promoted(old)
        keeper.hold.clear()
        out.failover_s = round(time.monotonic() - t_kill, 3)
        attached = threading.Thread(target=_time_replica, args=(new, t_kill, out), daemon=True)
        attached.start()
        probe = wait_until(lambda: b.submit(spec("after-failover")), timeout=120,
                           what="a submit acknowledged after the failover", interval=0.05)
        wait_until(lambda: agent.commands("launch", probe.id), timeout=120,
                   what="the scheduler launches again", interval=0.02)
        out.schedule_resume_s = round(time.monotonic() - t_kill, 3)
        out.within_failover_plus_lease = out.schedule_resume_s <= out.failover_s + lease_s
        attached.join(timeout=120)
        out.within_replica_attached_plus_lease = (
            out.replica_attached_s >= 0 and out.schedule_resume_s <= out.replica_attached_s + lease_s)
        wait_until(lambda: all(agent.acked(j, apb.ATTEMPT_STATE_SUCCEEDED, attempts[j]) for j in ids),
                   timeout=90, what="every terminal update acknowledged")
        stop.set()
        for t in threads:
            t.join(timeout=120)
        ended = [j for j in ids if agent.acked(j, apb.ATTEMPT_STATE_SUCCEEDED, attempts[j])]
        check = RedisStore(cluster.url(prefix=prefix, min_replicas=0))
        try:
            present = {j.id: j for j in check.list_jobs(limit=0)}
            lost_end = [i for i in ended if i not in present
                        or present[i].phase != pb.JOB_PHASE_SUCCEEDED]
            for i in lost_end[:3]:  # why: the job's own account of it
                evs = check.list_events(i) if i in present else []
                out.lost_detail.append(f"{i}: " + "; ".join(
                    f"{e.type}/{e.reason} #{e.attempt}" for e in evs[-4:]))
        finally:
            check.close()
        out.acked_submits, out.acked_terminal = len(acked), len(ended)
        out.submits_lost = sum(1 for i in acked if i not in present)
        out.terminal_lost = len(lost_end)
        out.relaunched = sum(1 for i in ids if i in present and present[i].attempt != attempts[i])
        out.reconnects = keeper.reconnects
        return out
    finally:
        if keeper is not None:
            keeper.stop()
        agent.close()
        b.stop()
        cluster.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--baseline-reps", type=int, default=3,
                    help="repetitions without replica confirmation (min_replicas=0)")
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--min-replicas", default="all",
                    help="the store URL's min_replicas for the measured repetitions: 'all' (the"
                         " default for Sentinel URLs: every replica they may promote) or a count")
    ap.add_argument("--broker-reps", type=int, default=0,
                    help="repetitions under a real broker with a scripted agent (every other"
                         " one with the agent's stream cut mid-failover and dialled again)")
    ap.add_argument("--broker-baseline-reps", type=int, default=0,
                    help="broker repetitions with a reconnect and the scripted agent's old"
                         " Register (it omitted unacknowledged ended attempts)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "store_failover.json"))
    args = ap.parse_args()
    load_start = os.getloadavg()
    runs: dict[str, list[dict[str, object]]] = {"wait": [], "baseline_no_wait": []}
    broker_runs: list[dict[str, object]] = []
    broker_baseline: list[dict[str, object]] = []
    broker_errors: list[str] = []  # a repetition that could not finish: said, not hidden

    def summary(rs: list[dict[str, object]]) -> dict[str, object]:
        fo = sorted(float(r["failover_s"]) for r in rs)  # type: ignore[arg-type]
        return {
            "reps": len(rs),
            "acked_submits": sum(int(r["acked_submits"]) for r in rs),  # type: ignore[call-overload]
            "acked_terminal": sum(int(r["acked_terminal"]) for r in rs),  # type: ignore[call-overload]
            "acked_lost": sum(int(r["submits_lost"]) + int(r["terminal_lost"])  # type: ignore[call-overload]
                              for r in rs),
            "failover_s_max": fo[-1] if fo else None,
            "failover_s_median": fo[len(fo) // 2] if fo else None,
            "writes_resume_s_max": max((float(r["writes_resume_s"]) for r in rs),  # type: ignore[arg-type]
                                       default=None),
            "submit_rate_before_kill_median": sorted(
                float(r["submit_rate_before_kill"]) for r in rs)[len(rs) // 2] if rs else None,  # type: ignore[arg-type]
        }

    def broker_summary(rs: list[dict[str, object]]) -> dict[str, object]:
        def total(key: str) -> int:
            return sum(int(r[key]) for r in rs)  # type: ignore[call-overload]

        resume = sorted(float(r["schedule_resume_s"]) for r in rs)  # type: ignore[arg-type]
        return {
            "reps": len(rs),
            "reps_with_reconnect": sum(1 for r in rs if r["reconnect"]),
            "acked_submits": total("acked_submits"),
            "acked_terminal": total("acked_terminal"),
            "submits_lost": total("submits_lost"),
            "terminal_lost": total("terminal_lost"),
            "acked_lost": total("submits_lost") + total("terminal_lost"),
            "relaunched": total("relaunched"),
            "schedule_resume_s_median": resume[len(resume) // 2] if resume else None,
            "schedule_resume_s_max": resume[-1] if resume else None,
            "failover_s_max": max((float(r["failover_s"]) for r in rs), default=None),  # type: ignore[arg-type]
            "replica_attached_s_max": max((float(r["replica_attached_s"])  # type: ignore[arg-type]
                                           for r in rs), default=None),
            "failover_plus_lease_s_min": min((float(r["failover_s"]) + float(r["lease_s"])  # type: ignore[arg-type]
                                              for r in rs), default=None),
            "reps_within_failover_plus_lease": sum(1 for r in rs if r["within_failover_plus_lease"]),
            "reps_within_replica_attached_plus_lease": sum(
                1 for r in rs if r["within_replica_attached_plus_lease"]),
        }

    def result(complete: bool) -> dict[str, object]:
        return {
            "benchmark": "store_failover",
            "complete": complete,
            "sentinel": {"down_after_ms": DOWN_AFTER_MS, "failover_timeout_ms": FAILOVER_TIMEOUT_MS,
                         "quorum": 2, "replicas": 2, "sentinels": 3,
                         "min_replicas": args.min_replicas},
            "writers": args.writers,
            "summary": {k: summary(v) for k, v in runs.items()},
            "runs": runs,
            "broker_runs": broker_runs,
            "broker_summary": broker_summary(broker_runs),
            "broker_baseline_runs": broker_baseline,
            "broker_baseline_summary": broker_summary(broker_baseline),
            "loadavg_start": load_start,
            "loadavg_end": os.getloadavg(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "broker_errors": broker_errors,
            "note": "shared machine: other engineers' tests ran beside this one",
        }

    def write(complete: bool) -> None:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result(complete), indent=2) + "\n")

    with tempfile.TemporaryDirectory(prefix="cb-failover-") as tmp:
        for i in range(args.reps):
            o = run_once(Path(tmp) / f"w{i}", min_replicas=args.min_replicas, writers=args.writers)
            runs["wait"].append(asdict(o))
            print(f"rep {i + 1}/{args.reps}: {asdict(o)}", flush=True)
        for i in range(args.baseline_reps):
            o = run_once(Path(tmp) / f"b{i}", min_replicas="0", writers=args.writers)
            runs["baseline_no_wait"].append(asdict(o))
            print(f"baseline {i + 1}/{args.baseline_reps}: {asdict(o)}", flush=True)

        def broker_rep(into: list[dict[str, object]], label: str, **kw: object) -> None:
            try:
                bo = asdict(run_broker_once(Path(tmp) / f"k{label}", **kw))  # type: ignore[arg-type]
            except Exception as e:  # noqa: BLE001 - recorded in the JSON and printed
                broker_errors.append(f"{label}: {type(e).__name__}: {e}"[:500])
                print(f"broker {label}: ERROR {broker_errors[-1]}", flush=True)
            else:
                into.append(bo)
                print(f"broker {label}: {bo}", flush=True)
            write(complete=False)

        for i in range(args.broker_baseline_reps):
            broker_rep(broker_baseline, f"baseline-{i + 1}", reconnect=True, lists_unacked_ends=False)
        for i in range(args.broker_reps):
            broker_rep(broker_runs, f"{i + 1}", reconnect=i % 2 == 1)

    write(complete=True)
    print(json.dumps(result(True)["summary"], indent=2))


if __name__ == "__main__":
    main()
