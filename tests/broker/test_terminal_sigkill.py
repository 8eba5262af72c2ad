"""A broker SIGKILLed while its agent streams carry ends, progress and log lines loses no
acknowledged end.

Why: the streams judge running jobs on memory copies (broker/jobs/hot_jobs.py), apply a
heartbeat as a barrier across the lanes (broker/api/agent_lanes.py) and share write
groups; none of that may let an ack of an attempt's end go out before the end is in the
store. A real ``brokerctl serve`` (SQLite, WAL, synchronous=FULL) behind real mutual TLS,
one agent stream speaking the real protocol, ``kill -9`` at an arbitrary instant while
acks are flowing; the store file is read afterwards."""

from __future__ import annotations

import os
import queue
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc

from broker.auth.devca import create_dev_pki
from broker.auth.identity import Role
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import agent_pb2_grpc, capacity_pb2_grpc, jobs_pb2_grpc
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import jobs_pb2 as jpb
from computebroker.v1 import logs_pb2 as lpb
from tests.broker.harness import wait_until

ROOT = Path(__file__).resolve().parents[2]
REGION, AGENT = "us-east-2", "kill9-agent"
JOBS = 40


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigkill_mid_stream_loses_no_acknowledged_end(tmp_path: Path) -> None:
    pki = create_dev_pki(tmp_path / "pki", agents=[(REGION, AGENT)],
                         users=[("op", Role.OPERATOR, ""), ("dev", Role.MEMBER, "ml")])
    db = tmp_path / "broker.sqlite"
    address, agent_address = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    sets = [x for k, v in pki.broker_settings.items() for x in ("--set", f"{k}={v}")]
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'proto'}")
    log = open(tmp_path / "broker.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "brokerctl", "serve", "--listen", address, "--store", f"sqlite:///{db}",
         "--checkpoint-root", str(tmp_path / "ckpt"), "--set", f"agent_listen={agent_address}",
         "--set", "progress_write_interval_s=0", *sets], env=env, stdout=log, stderr=subprocess.STDOUT,
        cwd=tmp_path)
    acked_ends: set[str] = set()
    try:
        ca = pki.ca.ca_pem
        user = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=ca))
        grpc.channel_ready_future(user).result(timeout=120)
        op = (("authorization", f"Bearer {pki.tokens['op']}"),)
        dev = (("authorization", f"Bearer {pki.tokens['dev']}"),)
        capacity_pb2_grpc.CapacityServiceStub(user).SetTeamQuota(cpb.SetTeamQuotaRequest(
            quota=cpb.TeamQuota(team="ml", quotas=[cpb.QuotaEntry(guaranteed_gpus=64)])), metadata=op)
        d = tmp_path / "pki" / "agents"
        creds = grpc.ssl_channel_credentials(ca, (d / f"{AGENT}.key").read_bytes(),
                                             (d / f"{AGENT}.pem").read_bytes())
        agent_ch = grpc.secure_channel(agent_address, creds)
        out: queue.SimpleQueue[apb.AgentMessage | None] = queue.SimpleQueue()
        nodes = [pb.Node(id=f"k9-n{i}", region=REGION, zone=f"{REGION}a", instance_type="p5",
                         accelerator="h100", gpus=8, healthy=True,
                         capacity_type=pb.CAPACITY_TYPE_ON_DEMAND) for i in range(8)]
        out.put(apb.AgentMessage(register=apb.Register(agent_id=AGENT, region=REGION, nodes=nodes,
                                                       executor="fake", version="test")))

        def requests():  # noqa: ANN202
            while (m := out.get()) is not None:
                yield m

        launches: queue.SimpleQueue[apb.Launch] = queue.SimpleQueue()
        stream = agent_pb2_grpc.AgentServiceStub(agent_ch).Connect(requests())

        def read() -> None:
            try:
                for msg in stream:
                    kind = msg.WhichOneof("cmd")
                    if kind == "launch":
                        out.put(apb.AgentMessage(ack=apb.CommandAck(command_id=msg.command_id, accepted=True)))
                        launches.put(msg.launch)
                    elif kind == "update_ack" and msg.update_ack.state == apb.ATTEMPT_STATE_SUCCEEDED:
                        acked_ends.add(msg.update_ack.job_id)
            except grpc.RpcError:
                pass

        threading.Thread(target=read, daemon=True).start()
        jobs = jobs_pb2_grpc.JobServiceStub(user)
        for i in range(JOBS):
            s = pb.JobSpec(name=f"k9-{i}", team="ml", priority_class="training", command=["train"],
                           allowed_regions=[REGION])
            s.resources.nodes, s.resources.gpus_per_node = 1, 1
            jobs.SubmitJob(jpb.SubmitJobRequest(spec=s), metadata=dev)
        running: list[apb.Launch] = []
        deadline = time.monotonic() + 60
        while len(running) < JOBS and time.monotonic() < deadline:
            la = launches.get(timeout=60)
            running.append(la)
            out.put(apb.AgentMessage(job_update=apb.JobUpdate(
                job_id=la.job_id, attempt=la.attempt, state=apb.ATTEMPT_STATE_RUNNING, time=time.time(),
                progress=pb.Progress(step=1, total_steps=100))))
        assert len(running) == JOBS
        # Ends, progress of the others, log lines and heartbeats, all at once; the kill
        # comes once some ends are acked and others are still in flight.
        for k, la in enumerate(running):
            out.put(apb.AgentMessage(log_chunk=lpb.LogChunk(
                job_id=la.job_id, attempt=la.attempt, rank=0, stream="stdout", offset=0,
                lines=["last line"], sizes=[10], time=time.time())))
            for other in running[k + 1:k + 4]:
                out.put(apb.AgentMessage(job_update=apb.JobUpdate(
                    job_id=other.job_id, attempt=other.attempt, state=apb.ATTEMPT_STATE_RUNNING,
                    time=time.time(), progress=pb.Progress(step=2 + k, total_steps=100))))
            if k % 5 == 0:
                out.put(apb.AgentMessage(heartbeat=apb.Heartbeat(time=time.time(), running=[
                    apb.RunningAttempt(job_id=r.job_id, attempt=r.attempt, state=apb.ATTEMPT_STATE_RUNNING,
                                       progress=pb.Progress(step=2 + k, total_steps=100))
                    for r in running[k + 1:]])))
            out.put(apb.AgentMessage(job_update=apb.JobUpdate(
                job_id=la.job_id, attempt=la.attempt, state=apb.ATTEMPT_STATE_SUCCEEDED, exit_code=0,
                time=time.time(), progress=pb.Progress(step=100, total_steps=100))))
        wait_until(lambda: len(acked_ends) >= JOBS // 4, 60, "some ends acked")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        out.put(None)
        user.close()
        agent_ch.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        log.close()
    acked = set(acked_ends)
    assert acked, "no end was acked before the kill"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    phases = {jid: pb.Job.FromString(data).phase for jid, data in conn.execute("SELECT id, data FROM jobs")}
    conn.close()
    lost = sorted(j for j in acked if phases.get(j) != pb.JOB_PHASE_SUCCEEDED)
    assert not lost, f"{len(lost)} acknowledged ends not in the store after kill -9: {lost[:5]}"
