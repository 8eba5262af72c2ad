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
import os
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


@pytest.fixture(scope="module")
def ref_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted 3-rank run both loss tests compare with (run once per module:
    it depends only on the script's arguments)."""
    base = tmp_path_factory.mktemp("ref")
    log = base / "ref.jsonl"
    ref = launch(base / "ref", 3, "{}", str(base / "ref-ckpt"), argv=args(log, 0.0),
                 job_id="j-ref")
    assert ref.wait(300) == [0, 0, 0], ref.output()
    return log


@pytest.fixture
def ex(tmp_path: Path):
    executor = LocalExecutor(tmp_path / "work", ranks_per_node=1, hang_timeout_s=120,
                             starting_grace_s=5.0, progress_interval_s=0.2)
    yield executor
    executor.shutdown(0)


def test_lost_node_replaced_in_place_restores_from_peer_memory(ex, tmp_path: Path,
                                                                 ref_log: Path) -> None:
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
    # At most one snapshot interval lost, plus one step per snapshot the ranks skipped
    # because the previous one was still sending (by design, under load: the tier's own
    # count, rank 0's view in attempt 1's progress file; a loaded box showed 2 lost once).
    first = json.loads((tmp_path / "work" / "jobs" / "j-mem" / "attempt-1" / "progress.json")
                       .read_text())
    skipped = first.get("memory_tier", {}).get("skipped", 0)
    assert last - 1 - skipped <= prog["resumed_step"] <= last, (last, prog["resumed_step"], skipped)
    by_step = {r["step"]: r for r in read_log(log)}
    assert sorted(by_step) == list(range(1, STEPS + 1))
    assert_matches(read_log(ref_log), [by_step[s] for s in sorted(by_step)], exact=False)
    assert ex.keepers.addresses("j-mem") == {}  # stopped when the job succeeded


@pytest.mark.timeout(1500)  # a reference run, a start, starters importing: slow under load
def test_survivors_ranks_start_warm_from_their_nodes_starters(ex, tmp_path: Path,
                                                               ref_log: Path) -> None:
    """A job with the memory tier gets a warm rank starter per node once it runs
    (trainer/warm_start.py); the relaunch after a node loss forks the survivors' ranks
    from their nodes' starters (no interpreter start, no torch import), spawns the
    spare's rank as before, and trains on exactly as an uninterrupted run. The lost
    node's starter is gone with it; the job's starters stop when it succeeds."""
    log, ckpt = tmp_path / "loss.jsonl", tmp_path / "ckpt"
    col = Collector(ex)
    # slow steps: the starters import torch while attempt 1 still trains
    ex.launch(spec(["n0", "n1", "n2"], 1, log, ckpt, sleep=20.0))
    # the starters start once the trainer says it runs; the executor is polled meanwhile,
    # as the agent does
    starters = tmp_path / "work" / "rank-starters" / "j-mem"
    wait_for(lambda: col.pump() is not None and all(
        ex.zygotes.ready("j-mem", n) for n in ("n0", "n1", "n2")), 900,
        what=f"warm starters ready: {[p.read_text() for p in starters.glob('*.log')]}")
    att = ex.get("j-mem", 1)
    assert att is not None and not any(r.forked for r in att.ranks)  # attempt 1: spawned
    wait_for(lambda: log.exists() and len(read_log(log)) >= 2, 300, what="step 2")
    assert len(read_log(log)) < STEPS, "attempt 1 ended before its node was lost"
    att.ranks[1].signal(9)  # node n1 is lost: its rank, its memory, its starter
    ex.keepers.kill_node("j-mem", "n1")
    ex.zygotes.kill_node("j-mem", "n1")
    end = col.wait_terminal()
    assert end.state == AS.ATTEMPT_STATE_FAILED and end.failed_nodes == ["n1"], end.message

    col2 = Collector(ex)
    ex.launch(spec(["n0", "spare", "n2"], 2, log, ckpt, sleep=0.0))
    att2 = ex.get("j-mem", 2)
    assert att2 is not None
    assert [r.forked for r in att2.ranks] == [True, False, True], att2.ranks
    starters = {n: s.proc.pid for (j, n), s in ex.zygotes._starters.items() if j == "j-mem"}
    for r in (att2.ranks[0], att2.ranks[2]):  # children of their own node's starter
        ppid = int(Path(f"/proc/{r.pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert ppid == starters[r.node_id], (r, starters)
    assert os.getpgid(att2.ranks[2].pid) == att2.pgid == att2.ranks[0].pid  # one group
    done = col2.wait_terminal(timeout=300)
    assert done.state == AS.ATTEMPT_STATE_SUCCEEDED, done.message
    prog = json.loads((tmp_path / "work" / "jobs" / "j-mem" / "attempt-2" / "progress.json").read_text())
    assert prog["resume_tier"] == "memory", prog
    assert set(prog["startup"]) >= {"spawned", "imported", "process_group", "restored",
                                    "first_step"}, prog
    by_step = {r["step"]: r for r in read_log(log)}
    assert sorted(by_step) == list(range(1, STEPS + 1))
    assert_matches(read_log(ref_log), [by_step[s] for s in sorted(by_step)], exact=False)
    assert ex.zygotes.nodes("j-mem") == []  # stopped when the job succeeded


def test_warm_ranks_off_by_option(ex, tmp_path: Path) -> None:
    """``warm_ranks=0``: no starter, every rank of every attempt spawned."""
    log, ckpt = tmp_path / "loss.jsonl", tmp_path / "ckpt"
    s = spec(["n0", "n1"], 1, log, ckpt, sleep=0.0)
    s.spec.trainer.options["warm_ranks"] = "0"
    col = Collector(ex)
    ex.launch(s)
    done = col.wait_terminal(timeout=300)
    assert done.state == AS.ATTEMPT_STATE_SUCCEEDED, done.message
    assert not (tmp_path / "work" / "rank-starters").exists()
