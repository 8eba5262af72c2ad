"""High availability (broker/leadership.py): one leader by a lease, hot standbys.

Real processes only: two `brokerctl serve` replicas over one real redis-server, a real
`brokerctl agent` given both addresses, real trainer ranks. The leader is SIGKILLed
while a job runs; the standby must take the lease, the agent must move to it, and the
job must finish on its first attempt with every event kept (contiguous seqs).
"""

from __future__ import annotations

import signal

import pytest

from brokersdk.client import BrokerClient
from computebroker.v1 import common_pb2 as pb
from tests.e2e.test_foundation import events_of, setup_team, spec, wait_regions
from tests.fixtures.cluster import Cluster, wait_until
from tests.ha.helpers import probe, start_pair

pytestmark = pytest.mark.slow


def test_two_brokers_one_leader_standby_names_it(ha_cluster: Cluster) -> None:
    a, b = start_pair(ha_cluster)
    wait_until(lambda: probe(a)[0], timeout=60, what=f"a leads\n{ha_cluster.logs()}")
    ok_b, details = probe(b)
    assert not ok_b, "both replicas serve: two leaders"
    assert "standby broker ha-b" in details
    assert f"the leader is ha-a ({a})" in details, details
    # Every API is gated on the standby, streams included (an agent's Connect).
    assert not probe(b)[0]
    # An SDK given both addresses, standby first, rotates to the leader.
    with BrokerClient(f"{b},{a}", timeout=5) as client:
        setup_team(client)
        assert [t.team for t in client.teams()] == ["ml"]
        assert client.current_address == a


def test_leader_killed_standby_takes_over_job_keeps_its_attempt(ha_cluster: Cluster) -> None:
    c = ha_cluster
    a, b = start_pair(c)
    wait_until(lambda: probe(a)[0], timeout=60, what=f"a leads\n{c.logs()}")
    c.start_agent("us-east-2", broker=f"{a},{b}", nodes=1, gpus=1)
    both = f"{a},{b}"
    with BrokerClient(both, timeout=5) as client:
        setup_team(client)
        wait_regions(c, client, 1)
        job = client.submit(spec("ha-survivor", steps=80, every=10, sleep=0.2))
        c.wait_progressing(job)
        assert job.status().attempt == 1

    assert c.broker is not None
    c.broker.kill(signal.SIGKILL)  # the leader dies at an arbitrary instant

    # The standby takes the lease once it expires, and the agent finds it.
    wait_until(lambda: probe(b)[0], timeout=90, what=f"b takes over\n{c.logs()}")
    with BrokerClient(f"{b},{a}", timeout=5) as client:
        wait_until(lambda: any(r.connected for r in client.regions()), timeout=120,
                   what=f"agent reconnected to b\n{c.logs()}")
        done = client.job(job.id).wait(timeout=300)
        assert done.phase == pb.JOB_PHASE_SUCCEEDED, f"{done}\n{c.logs()}"
        assert done.attempt == 1, f"relaunched after failover: {done}\n{c.logs()}"
        events = events_of(client, job.id)
    seqs = [e.seq for e in events]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    kinds = [e.type for e in events]
    assert "succeeded" in kinds or any(e.to_phase == pb.JOB_PHASE_SUCCEEDED for e in events), kinds
    lost = [e for e in events if e.reason in ("agent_lost", "attempt_missing")]
    assert not lost, lost
    assert "is now the LEADER" in (c.root / "logs" / "broker-b.log").read_text()


def test_a_better_capacity_move_survives_the_leaders_death_mid_move(ha_cluster: Cluster,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A proactive move (broker/scheduling/proactive_watch.py) is in the job record from
    its first write: the leader is SIGKILLed once the move began; the standby that takes
    over neither loses the move nor starts a second one, and the job finishes on the
    plan's node with one ``better_capacity`` migration."""
    from brokerctl.main import main

    c = ha_cluster
    c.broker_args += ["--set", "proactive_interval_s=0.5", "--set", "proactive_min_dwell_s=0",
                      "--set", "plan_move_floor_s=1"]
    a, b = start_pair(c, ids="pm")
    wait_until(lambda: probe(a)[0], timeout=60, what=f"a leads\n{c.logs()}")
    both = f"{a},{b}"
    c.start_agent("us-east-2", broker=both, nodes=1, gpus=1, price=4.0)
    c.start_agent("us-west-2", broker=both, nodes=1, gpus=1, capacity_type="training_plan")
    with BrokerClient(both, timeout=5) as client:
        setup_team(client)
        wait_regions(c, client, 2)
        s = spec("pm-saver", steps=60, every=4, sleep=0.3)
        s.labels["cb.recovery-policy"] = "better-capacity"
        job = client.submit(s)
        wait_until(lambda: job.status().progress.last_checkpoint_step >= 4, timeout=180,
                   what=f"a checkpoint on on-demand\n{c.logs()}")
        assert job.status().placement.region == "us-east-2"
        rc = main(["--broker", both, "plans", "create", "--name", "pm-plan", "--region", "us-west-2",
                   "--instance-type", "sim.gpu", "--count", "1", "--gpus-per-instance", "1",
                   "--duration", "1d2h"])
        assert rc == 0, capsys.readouterr().err
        wait_until(lambda: job.status().migrations, timeout=60, what=f"the move begins\n{c.logs()}")

    assert c.broker is not None
    c.broker.kill(signal.SIGKILL)  # mid-move: checkpointing, or just launched at the plan
    wait_until(lambda: probe(b)[0], timeout=90, what=f"b takes over\n{c.logs()}")
    with BrokerClient(f"{b},{a}", timeout=5) as client:
        done = client.job(job.id).wait(timeout=300)
        assert done.phase == pb.JOB_PHASE_SUCCEEDED, f"{done}\n{c.logs()}"
        assert done.placement.region == "us-west-2", f"{done}\n{c.logs()}"
        assert [m.cause for m in done.migrations] == ["better_capacity"], done.migrations
        events = events_of(client, job.id)
    seqs = [e.seq for e in events]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    starts = [e for e in events if e.type == "running"]
    assert len({e.attempt for e in starts}) == len(starts), "an attempt started twice"
