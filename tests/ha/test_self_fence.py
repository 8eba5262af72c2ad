"""Issue 15, cross-host fencing: an agent cut off from its broker must stop its own
attempts before the broker relaunches them elsewhere (docs/contracts.md §9, self-fence).

Real broker, real agents, real trainer ranks. Before: a frozen agent's ranks trained on
next to the relaunch in another region (two attempts of one job alive at once), and an
agent that could not reach any broker kept its attempts forever. The network-namespace
partition of the same case runs in tests/ha/test_chaos.py.
"""

from __future__ import annotations

import os
import signal

import pytest

from computebroker.v1 import common_pb2 as pb
from tests.e2e.test_foundation import setup_team, spec, wait_regions
from tests.fixtures.cluster import Cluster, live_attempts, wait_until
from tests.ha.test_reliability import AttemptSampler

pytestmark = pytest.mark.slow
AGENT_TIMEOUT = ["--set", "agent_timeout_s=8", "--set", "max_restarts=20"]  # self-fence at 6 s


def test_frozen_agents_ranks_stop_before_the_relaunch_elsewhere(cluster: Cluster) -> None:
    c = cluster
    c.broker_args = AGENT_TIMEOUT
    c.start_broker()
    c.start_agent("us-east-2", nodes=1, gpus=1, price=1.0)
    c.start_agent("eu-west-1", nodes=1, gpus=1, price=2.0)
    with c.client() as client:
        setup_team(client)
        wait_regions(c, client, 2)
        job = client.submit(spec("frozen-agent", steps=120, every=5, sleep=0.2))
        c.wait_progressing(job)
        first = job.status().placement.region
        frozen = c.agents[first].popen
        assert frozen is not None
        sampler = AttemptSampler(c.root, job.id)
        os.kill(frozen.pid, signal.SIGSTOP)  # its ranks keep running: nobody can kill them
        try:
            moved = wait_until(lambda: (j := job.status()).attempt >= 2
                               and j.phase == pb.JOB_PHASE_RUNNING and j, timeout=180,
                               what=f"relaunched elsewhere\n{c.logs()}")
            assert moved.placement.region != first
            wait_until(lambda: job.status().progress.step > moved.progress.step, timeout=180,
                       what=f"the relaunch trains\n{c.logs()}")
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
        done = job.wait(timeout=400)
        sampler.stop()
    assert done.phase == pb.JOB_PHASE_SUCCEEDED, f"{done}\n{c.logs()}"
    assert not sampler.overlaps, f"two attempts alive at once: {sampler.overlaps[:3]}"
    stderr = (c.root / "agents" / first / "jobs" / job.id / "attempt-1")
    text = "".join(p.read_text(errors="replace") for p in stderr.glob("rank-*.stderr"))
    assert "lease ran out" in text, text[-2000:]


def test_agent_without_a_broker_kills_its_attempts(cluster: Cluster) -> None:
    """The only broker is frozen: the agent hears nothing. After its self-fence deadline it
    kills its attempt (the broker might be deciding without it); when the broker is back
    the job resumes from its checkpoint and finishes."""
    c = cluster
    c.broker_args = AGENT_TIMEOUT
    c.start_broker()
    c.start_agent("us-east-2", nodes=1, gpus=1)
    with c.client() as client:
        setup_team(client)
        wait_regions(c, client, 1)
        job = client.submit(spec("no-broker", steps=80, every=5, sleep=0.2))
        c.wait_progressing(job, min_step=6)
    assert c.broker is not None and c.broker.popen is not None
    broker = c.broker.popen
    broker.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: not live_attempts(c.root, job.id), timeout=120,
                   what=f"the agent fenced its attempt\n{c.logs()}")
    finally:
        broker.send_signal(signal.SIGCONT)
    log = (c.root / "logs" / "agent-us-east-2.log").read_text()
    assert "self-fence" in log or "lease ran out" in "".join(
        p.read_text(errors="replace") for p in (c.root / "agents").rglob("rank-*.stderr")), log[-3000:]
    with c.client() as client:
        done = client.job(job.id).wait(timeout=400)
    assert done.phase == pb.JOB_PHASE_SUCCEEDED and done.attempt >= 2, f"{done}\n{c.logs()}"
    assert done.progress.step == 80
