"""StreamJobLogs end to end over the real AgentService stream (scripted agent):
two attempts in order with headers, follow mode ending at the terminal phase, filters,
resend dedup and RegisterAck offsets, the size bound, and input validation."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest

from broker.logs.service import FOLLOW_POLL_S
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import jobs_pb2 as jpb
from computebroker.v1 import logs_pb2 as lpb
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for, spec, wait_until

RUNNING = apb.ATTEMPT_STATE_RUNNING


def chunk(agent: FakeAgent, job_id: str, attempt: int, rank: int, lines: list[str],
          offset: int, stream: str = "stdout") -> None:
    agent.send(apb.AgentMessage(log_chunk=lpb.LogChunk(
        job_id=job_id, attempt=attempt, rank=rank, stream=stream, offset=offset, lines=lines,
        sizes=[len(x.encode()) + 1 for x in lines], time=1000.0)))


def records(broker: Broker, job_id: str, **kw) -> list[lpb.LogRecord]:
    return list(broker.jobs.StreamJobLogs(jpb.StreamJobLogsRequest(job_id=job_id, **kw), timeout=30))


def render(recs: list[lpb.LogRecord]) -> list[str]:
    """Compact text of records: '== 2 us-east-2 8' headers, 'r0 text' lines."""
    out = []
    for r in recs:
        kind = r.WhichOneof("kind")
        if kind == "attempt":
            out.append(f"== {r.attempt.attempt} {r.attempt.region} {r.attempt.world_size}")
        elif kind == "line":
            out.append(f"r{r.line.rank} {r.line.text}")
        else:
            out.append(f"dropped {r.dropped_lines}")
    return out


def stored(broker: Broker, job_id: str) -> int:
    return sum(1 for r in records(broker, job_id) if r.WhichOneof("kind") == "line")


def test_two_attempts_in_order_and_follow_ends_at_terminal(tmp_path: Path) -> None:
    b = Broker(fast_config(tmp_path, max_restarts=1))
    agent = FakeAgent(b.address, "us-east-2-a", "us-east-2", [])
    try:
        agent.nodes = nodes_for("us-east-2", "use2", 2, 8)
        agent.connect()
        b.team()
        job = b.submit(spec("logs", nodes=1, gpus=2))
        agent.wait_launch(job.id, 1)
        agent.update(job.id, 1, RUNNING, step=1)
        b.wait_phase(job.id, pb.JOB_PHASE_RUNNING)
        followed: list[lpb.LogRecord] = []
        done = threading.Event()

        def follow() -> None:
            followed.extend(records(b, job.id, follow=True))
            done.set()

        threading.Thread(target=follow, daemon=True).start()
        chunk(agent, job.id, 1, 0, ["a1 step 1", "a1 step 2"], 0)
        chunk(agent, job.id, 1, 1, ["a1 rank1"], 0, stream="stderr")
        wait_until(lambda: stored(b, job.id) == 3, 10, "attempt 1 lines stored")
        agent.update(job.id, 1, apb.ATTEMPT_STATE_FAILED, exit_code=1, message="boom")
        agent.wait_launch(job.id, 2)
        agent.update(job.id, 2, RUNNING, step=1)
        chunk(agent, job.id, 2, 0, ["a2 resumed"], 0)
        chunk(agent, job.id, 2, 1, ["a2 rank1"], 0)
        wait_until(lambda: stored(b, job.id) == 5, 10, "attempt 2 lines stored")
        assert not done.is_set(), "follow must keep going while the job runs"
        agent.update(job.id, 2, apb.ATTEMPT_STATE_SUCCEEDED, step=100)
        b.wait_phase(job.id, pb.JOB_PHASE_SUCCEEDED)
        assert done.wait(20), "follow ends when the job is terminal"
        expected = ["== 1 us-east-2 2", "r0 a1 step 1", "r0 a1 step 2", "r1 a1 rank1",
                    "== 2 us-east-2 2", "r0 a2 resumed", "r1 a2 rank1"]
        assert render(followed) == expected
        assert render(records(b, job.id)) == expected
        header = records(b, job.id)[0].attempt
        assert header.start_time > 0 and header.agent_id == "us-east-2-a"
        assert render(records(b, job.id, rank=1)) == [
            "== 1 us-east-2 2", "r1 a1 rank1", "== 2 us-east-2 2", "r1 a2 rank1"]
        assert render(records(b, job.id, attempt=2)) == expected[4:]
        assert render(records(b, job.id, tail=3)) == [
            "== 1 us-east-2 2", "r1 a1 rank1", "== 2 us-east-2 2", "r0 a2 resumed", "r1 a2 rank1"]
        line = records(b, job.id)[1].line
        assert (line.attempt, line.stream, line.seq, line.time) == (1, "stdout", 1, 1000.0)
    finally:
        agent.close()
        b.stop()


def test_a_follower_waits_for_a_new_attempts_ranks_before_its_header(tmp_path: Path) -> None:
    """Attempt 2's "launched" event exists before its agent reports the ranks it started;
    a follower must not print a header then that names only the GPUs placed: it shows the
    same "N ranks" header a reader sees afterwards."""
    b = Broker(fast_config(tmp_path, max_restarts=1))
    agent = FakeAgent(b.address, "us-east-2-a", "us-east-2", [])
    try:
        agent.nodes = nodes_for("us-east-2", "use2", 2, 8)
        agent.connect()
        b.team()
        job = b.submit(spec("ranks", nodes=1, gpus=2))
        agent.wait_launch(job.id, 1)
        agent.update(job.id, 1, RUNNING, step=1, ranks=2)
        b.wait_phase(job.id, pb.JOB_PHASE_RUNNING)
        followed: list[lpb.LogRecord] = []
        done = threading.Event()

        def follow() -> None:
            followed.extend(records(b, job.id, follow=True))
            done.set()

        threading.Thread(target=follow, daemon=True).start()
        chunk(agent, job.id, 1, 0, ["a1 line"], 0)
        wait_until(lambda: stored(b, job.id) == 1, 10, "attempt 1 line stored")
        agent.update(job.id, 1, apb.ATTEMPT_STATE_FAILED, exit_code=1, message="boom")
        agent.wait_launch(job.id, 2)
        late: list[lpb.LogRecord] = []  # a follower that comes after attempt 2's launch
        late_done = threading.Event()

        def follow_late() -> None:
            late.extend(records(b, job.id, follow=True))
            late_done.set()

        threading.Thread(target=follow_late, daemon=True).start()
        time.sleep(2 * FOLLOW_POLL_S + 0.5)  # both followers have seen attempt 2's launch
        agent.update(job.id, 2, apb.ATTEMPT_STATE_STARTING, ranks=2)
        chunk(agent, job.id, 2, 0, ["a2 line"], 0)
        agent.update(job.id, 2, RUNNING, step=1, ranks=2)
        wait_until(lambda: stored(b, job.id) == 2, 10, "attempt 2 line stored")
        agent.update(job.id, 2, apb.ATTEMPT_STATE_SUCCEEDED, step=100, ranks=2)
        b.wait_phase(job.id, pb.JOB_PHASE_SUCCEEDED)
        assert done.wait(20), "follow ends when the job is terminal"
        heads = [r.attempt for r in followed if r.WhichOneof("kind") == "attempt"]
        assert [(h.attempt, h.ranks) for h in heads] == [(1, 2), (2, 2)]
        after = [r.attempt for r in records(b, job.id) if r.WhichOneof("kind") == "attempt"]
        assert heads == after
        assert late_done.wait(20)
        assert [r.attempt for r in late if r.WhichOneof("kind") == "attempt"] == after
    finally:
        agent.close()
        b.stop()


def test_resend_is_stored_once_and_register_ack_reports_offsets(broker: Broker, make_agent) -> None:  # noqa: ANN001
    broker.team()
    agent = make_agent("us-east-2", nodes=1, gpus=2)
    job = broker.submit(spec("resend", gpus=2))
    agent.wait_launch(job.id)
    agent.update(job.id, 1, RUNNING, step=1)
    chunk(agent, job.id, 1, 0, ["one", "two"], 0)
    chunk(agent, job.id, 1, 0, ["one", "two"], 0)  # a resend after a reconnect
    chunk(agent, job.id, 1, 0, ["three"], 8)
    chunk(agent, "j-unknown", 1, 0, ["nobody"], 0)  # dropped, the stream lives on
    chunk(agent, job.id, 7, 0, ["future attempt"], 0)  # dropped: no such attempt
    wait_until(lambda: stored(broker, job.id) == 3, 10, "three lines")
    assert render(records(broker, job.id))[1:] == ["r0 one", "r0 two", "r0 three"]
    agent.close()
    agent.running = {job.id: 1}
    agent.connect()  # re-register with the attempt: the ack says where our copy ends
    assert [(o.job_id, o.attempt, o.rank, o.stream, o.end_offset)
            for o in agent.ack.log_offsets] == [(job.id, 1, 0, "stdout", 14)]


def test_size_bound_drops_oldest_with_a_count(tmp_path: Path) -> None:
    b = Broker(fast_config(tmp_path, log_max_bytes_per_attempt=100))
    agent = FakeAgent(b.address, "us-east-2-a", "us-east-2", [])
    try:
        agent.nodes = nodes_for("us-east-2", "use2", 1, 8)
        agent.connect()
        b.team()
        job = b.submit(spec("noisy"))
        agent.wait_launch(job.id)
        lines = [f"{i:019d}" for i in range(20)]  # 20 bytes each with the newline
        chunk(agent, job.id, 1, 0, lines, 0)
        wait_until(lambda: stored(b, job.id) == 5, 10, "the newest five lines")
        assert render(records(b, job.id))[1:3] == ["dropped 15", f"r0 {lines[15]}"]
    finally:
        agent.close()
        b.stop()


def test_bad_requests_get_clear_status_codes(broker: Broker, make_agent) -> None:  # noqa: ANN001
    broker.team()
    make_agent("us-east-2", nodes=1, gpus=2)
    job = broker.submit(spec("v"))
    cases = [
        (dict(job_id="j-nope"), grpc.StatusCode.NOT_FOUND, "not found"),
        (dict(job_id=""), grpc.StatusCode.INVALID_ARGUMENT, "job_id"),
        (dict(job_id=job.id, rank=-1), grpc.StatusCode.INVALID_ARGUMENT, "rank must be >= 0"),
        (dict(job_id=job.id, attempt=-2), grpc.StatusCode.INVALID_ARGUMENT, "attempt"),
        (dict(job_id=job.id, tail=-5), grpc.StatusCode.INVALID_ARGUMENT, "tail"),
        (dict(job_id=job.id, attempt=9), grpc.StatusCode.NOT_FOUND, "no attempt 9"),
    ]
    for req, code, text in cases:
        with pytest.raises(grpc.RpcError) as err:
            records(broker, **req)  # type: ignore[arg-type]
        assert err.value.code() == code, req
        assert text in err.value.details(), (req, err.value.details())


def test_sdk_follow_survives_a_broker_restart(tmp_path: Path) -> None:
    """JobHandle.logs(follow=True) across a broker restart: every line once, in order,
    headers not repeated, and the iterator ends when the job does."""
    import socket

    from brokersdk.client import BrokerClient

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cfg = fast_config(tmp_path, listen=f"127.0.0.1:{port}", startup_grace_s=30.0,
                      agent_timeout_s=30.0)
    b = Broker(cfg)
    agent = FakeAgent(b.address, "us-east-2-a", "us-east-2", nodes_for("us-east-2", "use2", 1, 8))
    agent.connect()
    b2: Broker | None = None
    got: list[lpb.LogRecord] = []
    done = threading.Event()
    try:
        b.team()
        job = b.submit(spec("follow", gpus=1))
        agent.wait_launch(job.id)
        agent.update(job.id, 1, RUNNING, step=1)
        b.wait_phase(job.id, pb.JOB_PHASE_RUNNING)
        client = BrokerClient(b.address)

        def follow() -> None:
            got.extend(client.job(job.id).logs(follow=True))
            done.set()

        threading.Thread(target=follow, daemon=True).start()
        chunk(agent, job.id, 1, 0, ["before 1", "before 2"], 0)
        wait_until(lambda: sum(r.WhichOneof("kind") == "line" for r in got) == 2, 10, "followed")
        agent.close()
        b.stop()
        b2 = Broker(cfg)
        agent.running = {job.id: 1}
        agent.connect()
        assert [o.end_offset for o in agent.ack.log_offsets] == [18]
        chunk(agent, job.id, 1, 0, ["before 2", "after 1"], 9)  # resent from an older offset
        chunk(agent, job.id, 1, 0, ["after 2"], 26)
        wait_until(lambda: sum(r.WhichOneof("kind") == "line" for r in got) == 4, 30,
                   f"lines after the restart (got {render(got)})")
        assert not done.is_set()
        agent.update(job.id, 1, apb.ATTEMPT_STATE_SUCCEEDED, step=100)
        assert done.wait(30), "the follower ends with the job"
        assert render(got) == ["== 1 us-east-2 1", "r0 before 1", "r0 before 2", "r0 after 1",
                               "r0 after 2"]
        client.close()
    finally:
        agent.close()
        for broker in (b, b2):
            if broker is not None:
                broker.stop()
