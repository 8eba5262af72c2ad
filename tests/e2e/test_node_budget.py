"""Node losses spend their own budget, never max_restarts; a crash loop still stops.

Real broker with `max_restarts=1`, one real agent (local executor, 4 nodes, one rank per
node), real gloo ranks of examples/byo/train_plain.py. A 2-node job loses a node twice
(its rank SIGKILLed, as when the node goes): the agent blames the node, the broker counts
a node failure each time (not a restart), and the job finishes with every step's samples
and loss equal to the same script run uninterrupted on 2 ranks; `brokerctl job` shows
both counters and the events say which budget each relaunch spent. Then a script that
raises at every start, on the same broker, ends FAILED at max_restarts (1 restart).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from computebroker.v1 import common_pb2 as pb
from tests.e2e.test_replace_in_place import (
    REGION,
    SCRIPT,
    cli,
    events_of,
    kill_node,
    submit_plain_job,
)
from tests.fixtures.cluster import Cluster, wait_until
from tests.trainer.launch import launch, read_log
from tests.trainer.test_trainer_processes import assert_matches

pytestmark = pytest.mark.slow

STEPS = 24
TRAIN_ARGS = ["--steps", str(STEPS), "--checkpoint-every", "4", "--seed", "3"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The same script, uninterrupted, on 2 ranks started directly (no broker)."""
    d = tmp_path_factory.mktemp("budget-reference")
    log = d / "loss.jsonl"
    run = launch(d / "run", 2, "{}", str(d / "ckpt"), job_id="j-ref",
                 argv=[str(SCRIPT), *TRAIN_ARGS, "--loss-log", str(log)])
    codes = run.wait(300)
    assert codes == [0, 0], f"{codes}\n{run.output()}\n{run.stderr()}"
    records = read_log(log)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    return records


def lose_a_node_at(cluster: Cluster, handle: Any, log: Path, attempt: int, step: int) -> str:
    """Once ``attempt`` has logged ``step``, SIGKILL the rank on its last node; the node."""
    wait_until(lambda: any(r["step"] >= step and r["attempt"] == attempt
                           for r in (read_log(log) if log.exists() else [])),
               timeout=300, what=f"attempt {attempt} at step {step}\n{cluster.logs()}")
    job = handle.status()
    assert job.attempt == attempt, job
    node = job.placement.nodes[-1].node_id
    kill_node(cluster.root, handle.id, node, attempt=attempt, keeper=False)
    return node


def test_node_losses_spend_their_own_budget_and_a_crash_loop_stops_at_max_restarts(
        cluster: Cluster, tmp_path: Path, reference: list[dict[str, Any]]) -> None:
    cluster.start_broker("--set", "max_restarts=1")
    cluster.start_agent(REGION, nodes=4, gpus=1)
    with cluster.client() as client:
        handle, log = submit_plain_job(cluster, client, tmp_path, {
            "name": "budget", "nodes": 2, "gpus_per_node": 1, "trainer": {"total_steps": STEPS}},
            train_args=TRAIN_ARGS)
        lost = [lose_a_node_at(cluster, handle, log, 1, 6),
                lose_a_node_at(cluster, handle, log, 2, 14)]
        job = handle.wait(timeout=400)
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"
        # two losses with max_restarts 1: no restart spent, two node failures
        assert (job.restarts, job.node_failures, job.attempt) == (0, 2, 3), job
        events = events_of(client, job.id)
        requeued = [e for e in events if e.type == "requeued" and e.details.get("failed_nodes")]
        assert [e.details["failed_nodes"] for e in requeued] == lost, \
            [(e.type, e.message) for e in events]
        assert [e.details["budget"] for e in requeued] == ["retry_node", "retry_node"]
        assert "relaunching (node failure 1/10 within 1h)" in requeued[0].message, requeued[0]
        assert "relaunching (node failure 2/10 within 1h)" in requeued[1].message, requeued[1]
        shown = " ".join(cli(cluster, "job", job.id).split())
        assert "restarts: 0, node failures: 2" in shown, shown

        # a script that raises at every start: its own failure, max_restarts (1) applies
        crash = client.submit({
            "name": "crash", "team": "ml", "nodes": 1, "gpus_per_node": 1,
            "run": ["python", "-c", "raise RuntimeError('boom at start')"],
            "trainer": {"total_steps": 1}})
        failed = crash.wait(timeout=300)
        assert failed.phase == pb.JOB_PHASE_FAILED, f"{failed}\n{cluster.logs()}"
        assert (failed.restarts, failed.node_failures, failed.attempt) == (1, 0, 2), failed
        last = events_of(client, failed.id)[-1]
        assert last.reason == "max_restarts", last
        assert "(max_restarts 1)" in last.message and "RuntimeError: boom at start" in last.message

    records = read_log(log)
    by_step = {r["step"]: r for r in records}  # a redone step: the later attempt's record
    assert sorted(by_step) == list(range(1, STEPS + 1))
    assert {r["attempt"] for r in records} == {1, 2, 3}
    assert_matches(reference, [by_step[s] for s in sorted(by_step)], exact=False)
