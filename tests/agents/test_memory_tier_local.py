"""The in-memory tier on the local executor: a node lost, the gang relaunched in place.

A 3-node job (one rank per node, examples/byo/train_plain.py under FSDP2, gloo) with the
trainer option `memory_every=1`: the executor starts one keeper per node and hands the
ranks their addresses. Node 1 is lost mid-run (its rank SIGKILLed and its keeper killed,
`KeeperPool.kill_node`); the executor fails the attempt and blames the node. Attempt 2 is
launched on the survivors plus a spare node (a new, empty keeper): every rank restores
from memory (rank 1 from the keeper that held its buddy copy), losing at most one step,
and the job finishes with an uninterrupted run's samples and losses. Its keepers are
stopped when it succeeds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from computebroker.v1 import agent_pb2, common_pb2
from region_agents.executors.base import AttemptSpec
from region_agents.executors.local import LocalExecutor
from tests.agents.fake_broker import wait_for
from tests.agents.test_local_executor import Collector
from tests.trainer.launch import REPO, launch, read_log
from tests.trainer.test_trainer_processes import assert_matches

pytestmark = pytest.mark.slow
AS = agent_pb2.AttemptState
SCRIPT = str(REPO / "examples" / "byo" / "train_plain.py")
STEPS = 24


def args(log: Path, sleep: float) -> list[str]:
    return [SCRIPT, "--steps", str(STEPS), "--checkpoint-every", "5", "--loss-log", str(log),
            "--step-sleep", str(sleep), "--seed", "6"]


def spec(nodes: list[str], attempt: int, log: Path, ckpt: Path, sleep: float) -> AttemptSpec:
    job = common_pb2.JobSpec(
        name="mem", command=[sys.executable, *args(log, sleep)],
        resources=common_pb2.Resources(nodes=len(nodes), gpus_per_node=1),
        trainer=common_pb2.TrainerSpec(total_steps=STEPS, options={"memory_every": "1"}))
    placement = common_pb2.Placement(region="test-1", world_size=len(nodes), nodes=[
        common_pb2.NodeAssignment(node_id=n, gpus=1) for n in nodes])
    return AttemptSpec(job_id="j-mem", attempt=attempt, spec=job, placement=placement,
                       checkpoint_uri=str(ckpt))


@pytest.fixture
def ex(tmp_path: Path):
    executor = LocalExecutor(tmp_path / "work", ranks_per_node=1, hang_timeout_s=120,
                             starting_grace_s=5.0, progress_interval_s=0.2)
    yield executor
    executor.shutdown(0)


def test_lost_node_replaced_in_place_restores_from_peer_memory(ex, tmp_path: Path) -> None:
    ref_log = tmp_path / "ref.jsonl"
    ref = launch(tmp_path / "ref", 3, "{}", str(tmp_path / "ref-ckpt"), argv=args(ref_log, 0.0),
                 job_id="j-ref")
    assert ref.wait(300) == [0, 0, 0], ref.output()

    log, ckpt = tmp_path / "loss.jsonl", tmp_path / "ckpt"
    col = Collector(ex)
    ex.launch(spec(["n0", "n1", "n2"], 1, log, ckpt, sleep=0.25))
    assert set(ex.keepers.addresses("j-mem")) == {"n0", "n1", "n2"}
    wait_for(lambda: log.exists() and len(read_log(log)) >= 12, 180, what="step 12")
    att = ex.get("j-mem", 1)
    assert att is not None
    att.ranks[1].signal(9)  # node n1 is lost: its rank and its memory
    ex.keepers.kill_node("j-mem", "n1")
    end = col.wait_terminal()
    assert end.state == AS.ATTEMPT_STATE_FAILED and end.failed_nodes == ["n1"]
    last = read_log(log)[-1]["step"]

    col2 = Collector(ex)
    ex.launch(spec(["n0", "spare", "n2"], 2, log, ckpt, sleep=0.0))
    done = col2.wait_terminal(timeout=300)
    assert done.state == AS.ATTEMPT_STATE_SUCCEEDED, done.message
    progress = (tmp_path / "work" / "jobs" / "j-mem" / "attempt-2" / "progress.json").read_text()

    prog = json.loads(progress)
    assert prog["resume_tier"] == "memory" and prog["restored_from_peer"] == [1], prog
    assert last - 1 <= prog["resumed_step"] <= last, (last, prog["resumed_step"])
    by_step = {r["step"]: r for r in read_log(log)}
    assert sorted(by_step) == list(range(1, STEPS + 1))
    assert_matches(read_log(ref_log), [by_step[s] for s in sorted(by_step)], exact=False)
    assert ex.keepers.addresses("j-mem") == {}  # stopped when the job succeeded
