"""Which spares a Launch names (broker/scheduling/warm_spares.py, Launch.spare_nodes).

The agent prepares a job's in-place replacement (warm rank starters) on the nodes its
pool held as spares when the attempt was admitted: the pool's own spares only, in the
order spares are chosen, at most MAX_NAMED, and within the spares an in-place
relaunch left (the one it took is no longer a spare). The Launch carries them.
"""

from __future__ import annotations

import placement
from broker.config import BrokerConfig
from broker.jobs import transitions
from broker.scheduling import warm_spares
from computebroker.v1 import common_pb2 as pb
from tests.broker.test_spares import T0, agent, build, job


def test_a_launch_names_its_pools_spares() -> None:
    fleet = [agent(6, spares=2)]
    s = build(fleet, [job("r", 3, pb.JOB_PHASE_RUNNING, ("n0", "n1", "n2"))])
    assert s.spares == {"n5", "n4"}
    assert warm_spares.of_pool(s, "a1", "p") == ("n5", "n4")
    assert warm_spares.of_pool(s, "a1", "other-pool") == ()
    assert warm_spares.of_pool(s, "a2", "p") == ()
    assert warm_spares.of_pool(s, "a1", "p", among={"n4"}) == ("n4",)  # the one left
    none = build([agent(4, spares=0)], [])
    assert warm_spares.of_pool(none, "a1", "p") == ()
    many = build([agent(12, spares=8)], [])
    assert len(warm_spares.of_pool(many, "a1", "p")) == warm_spares.MAX_NAMED


def test_the_admission_puts_them_in_the_launch() -> None:
    j = job("j1", 2)
    adm = placement.Admission(job_id="j1", agent_id="a1", region="r",
                              assignments=(("n0", 1), ("n1", 1)),
                              capacity_type=placement.CapacityType(pb.CAPACITY_TYPE_ON_DEMAND),
                              pool="p", price_per_gpu_hour=1.0)
    out = transitions.admit(j, transitions.Admit(admission=adm, nodes={}, checkpoint_bucket="b",
                                                 spare_nodes=("n5", "n4")), T0, BrokerConfig())
    assert out is not None
    (launch,) = [c.launch for c in out.commands if hasattr(c, "launch")]
    assert list(launch.spare_nodes) == ["n5", "n4"]
