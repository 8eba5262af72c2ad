"""A lost node and no spare: an elastic job shrinks in place, resharded from memory,
then grows back to its requested size when the node returns.

Real broker, one real agent (local executor, one rank per node) whose inventory has 3
nodes and no spare, real gloo ranks of examples/byo/train_plain.py with the trainer
option `memory_every=1` (one memory keeper per node). The job asks for 3 nodes and may
run on 2 (`min_nodes: 2`). One node is lost mid-run (its keeper and its rank
SIGKILLed). Asserted:

* the recovery policy finds no spare and chooses SHRINK_IN_PLACE: attempt 2 runs at once
  on the two survivors, in their order, with 2 ranks;
* the 2 ranks reshard the 3 old ranks' snapshots from the survivors' keepers (the lost
  node's shard from its buddy copy), losing at most 1 step, newer than the durable
  checkpoint; the event says "recovered from memory (step S, lost L steps, world 3 -> 2)";
* while the lost node is down (the agent's node-health file) the job runs shrunk and
  says so (`brokerctl job`: "running at 2 of 3 ranks since ... (shrunk in place after losing NODE); waiting for capacity");
* once the node is healthy again (and has stayed so for the settle time), the broker
  stops attempt 2 checkpoint first (cause grow_back) and relaunches the job at once on
  the survivors plus the returned node: attempt 3 runs 3 ranks, resharding the 2-rank
  checkpoint, and the events say "grew back to 3 nodes: capacity returned";
* every step's sample ids and loss equal the same script run uninterrupted on 3 ranks,
  across both world-size changes (3 -> 2 -> 3).

The script reads its per-step pause from a file (`--step-sleep-file`): the test slows
the shrunk phase so the grow back happens before the last step, then speeds it up.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from computebroker.v1 import common_pb2 as pb
from tests.e2e import test_replace_in_place as rip
from tests.e2e.test_replace_in_place import (
    NODES,
    REGION,
    STEPS,
    cli,
    events_of,
    kill_node,
    submit_plain_job,
)
from tests.fixtures.cluster import Cluster, wait_until
from tests.trainer.launch import read_log
from tests.trainer.test_trainer_processes import assert_matches

pytestmark = pytest.mark.slow
reference = rip.reference  # the same uninterrupted 3-rank run, once per session (tests/fixtures/once.py)


def test_lost_node_without_a_spare_shrinks_in_place_then_grows_back(
        cluster: Cluster, tmp_path: Path, reference: list[dict[str, Any]]) -> None:
    cluster.start_broker("--set", "grow_back_settle_s=2", "--set", "grow_back_min_interval_s=3")
    cluster.start_agent(REGION, nodes=3, gpus=1)
    pace = tmp_path / "step-sleep"
    health = cluster.root / "agents" / REGION / "node-health" / NODES[1]
    with cluster.client() as client:
        handle, log = submit_plain_job(cluster, client, tmp_path, {
            "name": "shrink", "nodes": 3, "gpus_per_node": 1, "min_nodes": 2, "max_nodes": 3,
            "trainer": {"total_steps": STEPS, "options": {"memory_every": "1"}}},
            extra_run=("--step-sleep-file", str(pace)))
        first = wait_until(lambda: (j := handle.status()).phase == pb.JOB_PHASE_RUNNING and j,
                           timeout=240, what=f"attempt 1 running\n{cluster.logs()}")
        assert [a.node_id for a in first.placement.nodes] == NODES[:3], first.placement
        wait_until(lambda: log.exists() and len(read_log(log)) >= 14, timeout=240,
                   what=f"step 14\n{cluster.logs()}")
        lost_attempt = handle.status().attempt
        pace.write_text("2.0")  # the shrunk phase lasts long enough for the way back
        kill_node(cluster.root, handle.id, NODES[1], attempt=lost_attempt)
        last = read_log(log)[-1]["step"]
        wait_until(lambda: handle.status().node_recovery.plan, timeout=120,
                   what=f"the relaunch plan\n{cluster.logs()}")
        health.parent.mkdir(parents=True, exist_ok=True)
        health.write_text("unhealthy: down for repair")  # the lost node stays away for now

        # shrunk: attempt 2 on the two survivors, waiting for capacity to grow back
        shrunk = wait_until(
            lambda: ((j := handle.status()).phase == pb.JOB_PHASE_RUNNING
                     and j.attempt == lost_attempt + 1
                     and j.shrunk.waiting.startswith("waiting for capacity:") and j),
            timeout=240, what=f"attempt 2 running shrunk\n{cluster.logs()}")
        assert [a.node_id for a in shrunk.placement.nodes] == [NODES[0], NODES[2]], shrunk.placement
        assert (shrunk.shrunk.requested_nodes, shrunk.shrunk.running_nodes) == (3, 2)
        rec = shrunk.node_recovery
        assert (rec.plan, list(rec.lost_nodes)) == ("shrink_in_place", [NODES[1]])
        # the panel's cells wrap at 100 columns: read the words without the box
        shown = " ".join(re.sub("[│╭╮╰╯─]", " ", cli(cluster, "job", shrunk.id)).split())
        assert "size running at 2 of 3 ranks since " in shown, shown
        assert f"(shrunk in place after losing {NODES[1]}); waiting for capacity" in shown, shown

        # the node comes back only once the shrunk attempt trains (its first step logged):
        # otherwise the way back would start before the 2 ranks ever stepped
        wait_until(lambda: any(r["attempt"] == lost_attempt + 1 for r in read_log(log)),
                   timeout=240, what=f"attempt 2's first step\n{cluster.logs()}")
        health.unlink()  # the node is back
        grown = wait_until(
            lambda: ((j := handle.status()).attempt == lost_attempt + 2 and j),
            timeout=240, what=f"attempt 3 (grown back)\n{cluster.logs()}")
        pace.write_text("0.3")
        assert [a.node_id for a in grown.placement.nodes] == [NODES[0], NODES[2], NODES[1]], grown.placement
        job = handle.wait(timeout=400)
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"

        events = events_of(client, job.id)
        decided = [e for e in events if e.type == "node_recovery"]
        assert [e.reason for e in decided] == ["shrink_in_place"], [(e.type, e.message) for e in events]
        assert f"no ready spare for {NODES[1]}" in decided[0].message, decided[0]
        assert "goes on with its survivors" in decided[0].message, decided[0]
        recovered = [e for e in events if e.type == "recovered"]
        assert len(recovered) == 1, [(e.type, e.message) for e in events]
        ev = recovered[0]
        step, lost_steps = int(ev.details["step"]), int(ev.details["lost_steps"])
        assert ev.message.startswith(
            f"recovered from memory (step {step}, lost {lost_steps} steps, world 3 -> 2)"), ev
        assert lost_steps <= 1, ev  # at most one snapshot interval (memory_every=1)
        assert last - 1 <= step <= last, (last, step)
        assert step > 10, step  # newer than the durable checkpoint (every 10 steps)
        # the way back: a checkpoint-first stop, then 3 ranks on the survivors + the node
        stops = [e for e in events if e.reason == "grow_back" and e.to_phase == pb.JOB_PHASE_CHECKPOINTING]
        assert len(stops) == 1 and stops[0].message.startswith(
            f"growing back to 3 nodes: capacity returned: {NODES[1]} free in pool"), stops
        grew = [e for e in events if e.type == "grew_back"]
        assert len(grew) == 1 and grew[0].message.startswith(
            "grew back to 3 nodes: capacity returned (ran at 2 of 3 for"), grew
        assert job.attempt == lost_attempt + 2 and not job.HasField("shrunk"), job
        assert [a.node_id for a in job.placement.nodes] == [NODES[0], NODES[2], NODES[1]]
        assert job.migrations[-1].cause == "grow_back"
        assert job.progress.world_size == 3
        shown = " ".join(cli(cluster, "events", job.id).split())
        assert f"recovered from memory (step {step}, lost {lost_steps} steps, world 3 -> 2)" in shown
        assert "grew back to 3 nodes: capacity returned" in shown

    records = read_log(log)
    by_step = {r["step"]: r for r in records}  # the redone step: the later attempt's record
    assert sorted(by_step) == list(range(1, STEPS + 1))
    sizes = [by_step[s]["world_size"] for s in sorted(by_step)]
    changes = [sizes[0]] + [b for a, b in zip(sizes, sizes[1:], strict=False) if a != b]
    assert changes == [3, 2, 3], sizes  # 3 ranks, shrunk to 2 after the loss, grown back to 3
    assert {by_step[s]["world_size"] for s in by_step if s > step and by_step[s]["attempt"] == lost_attempt + 1} == {2}
    assert_matches(reference, [by_step[s] for s in sorted(by_step)], exact=False)
