"""Rank output survives a broker restart exactly once: a real RegionAgent (local
executor, a real process printing numbered lines) ships to a real broker; the broker
is stopped mid-run and a new one starts on the same port and SQLite file; the agent
reconnects, gets RegisterAck.log_offsets, resends from there, and the stored log holds
every line once, in order."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import jobs_pb2 as jpb
from region_agents.agent import AgentConfig, RegionAgent
from tests.agents.conftest import INVENTORY
from tests.broker.harness import Broker, fast_config, wait_until

N = 400
PRINTER = (
    "import sys, time\n"
    f"for i in range(1, {N} + 1):\n"
    "    print(f'line {i}', flush=True)\n"
    "    if i % 7 == 0: print(f'err {i}', file=sys.stderr, flush=True)\n"
    "    time.sleep(0.01)\n"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def lines_of(b: Broker, job_id: str) -> list[str]:
    recs = b.jobs.StreamJobLogs(jpb.StreamJobLogsRequest(job_id=job_id), timeout=30)
    return [r.line.text for r in recs if r.WhichOneof("kind") == "line"]


@pytest.mark.parametrize("finish_while_down", [False, True], ids=["running", "finished"])
def test_every_line_once_across_a_broker_restart(tmp_path: Path, finish_while_down: bool) -> None:
    """``finished``: the attempt ends while the broker is down; on reconnect the agent
    sends the rest of its output before the terminal update, so the job is never seen
    SUCCEEDED with lines missing."""
    cfg = fast_config(tmp_path, listen=f"127.0.0.1:{free_port()}", startup_grace_s=30.0,
                      agent_timeout_s=30.0, agent_listen=f"127.0.0.1:{free_port()}")
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY.format(bucket=tmp_path / "bucket"))
    b: Broker | None = Broker(cfg)
    agent = RegionAgent(AgentConfig(allow_root_jobs=True, broker_address=b.agent_address, inventory_path=str(inventory),
                                    **b.pki.agent_tls("test-1", "test-1-a"),
                                    work_dir=str(tmp_path / "work"), ranks_per_node=1,
                                    max_backoff_s=0.5))
    agent.start()
    b2: Broker | None = None
    try:
        assert b is not None
        b.team()
        job = b.submit(pb.JobSpec(name="printer", team="ml", priority_class="training",
                                  resources=pb.Resources(nodes=1, gpus_per_node=1),
                                  command=[sys.executable, "-c", PRINTER]))
        first = b
        wait_until(lambda: len(lines_of(first, job.id)) >= 30, 120, "first lines at the broker")
        b.stop()
        b = None
        out = tmp_path / "work" / "jobs" / job.id / "attempt-1" / "rank-0.stdout"
        seen = len(out.read_bytes().splitlines())
        wait_until(lambda: len(out.read_bytes().splitlines()) > seen + 30, 120,
                   "the rank printing on while the broker is down")
        if finish_while_down:
            wait_until(lambda: not agent.executor.running(), 120, "the attempt ended")
        b2 = Broker(cfg)
        final = b2
        got = wait_until(lambda: final.get(job.id).phase == pb.JOB_PHASE_SUCCEEDED
                         and lines_of(final, job.id), 180, "job succeeded")
        assert agent.connects >= 2
        assert [x for x in got if x.startswith("line ")] == [f"line {i}" for i in range(1, N + 1)]
        assert [x for x in got if x.startswith("err ")] == [f"err {i}" for i in range(7, N + 1, 7)]
        assert len(got) == N + N // 7  # nothing twice, no gap markers
    finally:
        agent.stop()
        for broker in (b, b2):
            if broker is not None:
                broker.stop()
